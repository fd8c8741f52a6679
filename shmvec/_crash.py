"""Where a worker was when it died or hung: faulthandler's stacks, through a pipe of its own.

A worker that dies of a native crash (SIGSEGV in a simulator, a failed C assert) leaves an exit
signal and nothing else; a worker stuck in an env leaves nothing at all.  So each worker has a
*crash pipe* (the parent holds the read end, the worker the write end) and, first thing in
``worker_main``, :func:`install` points faulthandler at it:

- on a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL) faulthandler writes the Python
  stack of every thread into the pipe from its signal handler, then lets the process die of the
  signal as before (the exit code still says which);
- on :data:`DUMP_SIGNAL` it writes the same and the worker carries on.

The write end is non-blocking: were the pipe ever full, faulthandler would drop its report
rather than block in a signal handler.

Parent side: :func:`read_report` drains what a dead worker wrote (everything it wrote before it
died is in the pipe); :func:`dump_stacks` asks a live, stuck worker for its stacks and collects
them.  The worker's ENV_AT word names the env it was in (``shmvec._protocol``, "How failures are
noticed").  A report is a hint for the error message: nothing depends on it, and a worker whose
env replaced the handlers (its own ``faulthandler.enable()``, a handler for the signal) or that was
killed (SIGKILL: the OOM killer) just leaves none.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import time
from typing import Any

# A real-time signal that nothing else sends, so that its handler cannot be another's.  It is
# sent only to a worker that catches it (/proc/<pid>/status): its default action would kill.
DUMP_SIGNAL = signal.SIGRTMAX - 3
# The most a report may take (faulthandler writes at most 100 frames per thread).
REPORT_LIMIT = 256 * 1024
# How long a stuck worker gets to write its stacks, and the quiet that ends them (seconds).
DUMP_WAIT_S = 1.0
_DUMP_QUIET_S = 0.05

_writer: Any = None  # the worker's end, kept open for as long as faulthandler may write to it


def install(writer: Any) -> None:
    """In a worker: faulthandler writes every thread's stack to ``writer`` (a Connection or file
    with ``fileno()``) on a fatal signal and on DUMP_SIGNAL."""
    global _writer
    fd = writer.fileno()
    os.set_blocking(fd, False)
    faulthandler.enable(file=fd, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
    _writer = writer


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux: SigCgt in /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool((int(line.split()[1], 16) >> (signum - 1)) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _read(fd: int, wait_s: float, quiet_s: float) -> bytes:
    """What arrives on ``fd`` within ``wait_s``, ending early after ``quiet_s`` without more."""
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + wait_s
    while size < REPORT_LIMIT:
        now = time.monotonic()
        timeout = max(0.0, deadline - now if not chunks else min(deadline - now, quiet_s))
        readable, _, _ = select.select([fd], [], [], timeout)
        if not readable:
            break
        data = os.read(fd, REPORT_LIMIT - size)
        if not data:  # every writer is gone
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


def _text(data: bytes) -> str:
    text = data.decode("utf-8", "replace")
    # Python 3.11+ follows a fatal error's stacks with the list of extension modules: noise here.
    head, sep, tail = text.partition("\nExtension modules: ")
    if sep:
        text = head + tail.partition("\n")[2]
    return text.strip()


def read_report(reader: Any) -> str:
    """What a worker wrote to its crash pipe so far (after its death: all of it); "" if nothing."""
    try:
        return _text(_read(reader.fileno(), 0.0, 0.0))
    except (OSError, ValueError):  # closed already
        return ""


def dump_stacks(pid: int, reader: Any, wait_s: float = DUMP_WAIT_S) -> str:
    """The stacks of live worker ``pid``, written on DUMP_SIGNAL to its crash pipe ``reader``;
    "" if it does not catch the signal (its env replaced the handler) or writes nothing in time."""
    try:
        fd = reader.fileno()
        _read(fd, 0.0, 0.0)  # an earlier report nobody read is not this one
        if not catches(pid, DUMP_SIGNAL):
            return ""
        os.kill(pid, DUMP_SIGNAL)
        return _text(_read(fd, wait_s, _DUMP_QUIET_S))
    except (OSError, ValueError):  # gone, or the pipe closed
        return ""
