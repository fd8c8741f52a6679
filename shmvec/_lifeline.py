"""A starting worker's lifeline: it exits within a second when the process that started it dies.

A worker checks its parent in every wait once it serves (``shmvec._worker``), but before that it
imports modules and builds envs, which can take minutes (torch, a simulator): a parent killed
then (SIGKILL, the OOM killer, a job scheduler) would leave its workers running until their
start-up ended.  So, from its very first instructions until it reports READY, a worker holds a
lifeline to the process that started it (the ``parent_pid`` it was given):

- **fork, spawn**: the worker is that process's child.  Linux's parent-death signal
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) has the kernel kill it when the parent dies, even in the
  middle of a C extension's import; ``os.getppid()`` is checked against ``parent_pid`` once it is
  set, for a parent that died just before.  The kernel sends the signal when the *thread* that
  started the worker ends, not the process: the lifeline is cut (the signal cleared) once the
  worker is READY, and until then that thread waits for it (construction and restarts wait for
  the handshake), so a vec env built in a thread that ends later keeps its workers.
- **forkserver**: the worker is a child of multiprocessing's fork server, which outlives the
  program's process by design (every worker holds the server's "alive" pipe).  A daemon thread
  waits on a pidfd of ``parent_pid`` (blocked in ``select``, it holds no GIL) and kills the
  worker with SIGKILL when it becomes readable; it needs the GIL for a moment then, so a C call
  that holds it (a long ``dlopen``) delays the exit until it returns.

Where it is armed:

- under fork, first thing in ``worker_main``;
- under spawn and forkserver, the user's main module is imported (as ``__mp_main__``) and the
  process object unpickled before any of our code runs.  The one object of ours that is
  unpickled earlier is the process's *name*, in multiprocessing's preparation data:
  :class:`WorkerName` is a ``str`` that pickles as an expression which arms the lifeline, then
  yields the plain name.  It imports nothing of shmvec that the child cannot import yet (a
  failure leaves the child unarmed until ``worker_main``, never broken);
- in the fork server itself while it imports the user's main module (``shmvec._mainload``): its
  parent is the program, whose starting thread waits for the server's first fork.

Nothing here imports anything of shmvec: a process imports it before its ``sys.path`` is set.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from typing import Any

__all__ = ["arm", "disarm", "armed", "WorkerName"]

_PR_SET_PDEATHSIG = 1

# This process's lifeline: "pdeathsig", "watch" (the thread), or None (not armed).
_mode: str | None = None
_stop_w: int | None = None
_thread: threading.Thread | None = None


def _die() -> None:
    """SIGKILL to this process, and to its process group when it leads one (a worker does: what
    its envs started so far goes with it)."""
    pid = os.getpid()
    try:
        if os.getpgid(0) == pid:
            os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    os.kill(pid, signal.SIGKILL)


def _set_pdeathsig(sig: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False


def _watch(pidfd: int, stop_r: int) -> None:
    try:
        while True:
            try:
                ready, _, _ = select.select([pidfd, stop_r], [], [])
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
                continue
        if pidfd in ready and stop_r not in ready:
            _die()
    finally:
        os.close(pidfd)
        os.close(stop_r)


def arm(parent_pid: int) -> None:
    """Kills this process (SIGKILL) when ``parent_pid`` dies, from now until :func:`disarm`;
    kills it at once if ``parent_pid`` is gone already.  A second call does nothing."""
    global _mode, _stop_w, _thread
    if _mode is not None:
        return
    if os.getppid() == parent_pid and _set_pdeathsig(signal.SIGKILL):
        _mode = "pdeathsig"
        if os.getppid() != parent_pid:  # it died before the signal was set
            _die()
        return
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        _die()
        return
    except (AttributeError, OSError):  # no pidfd (kernel < 5.3): the worker's own waits check the parent
        return
    stop_r, _stop_w = os.pipe()
    _thread = threading.Thread(target=_watch, args=(pidfd, stop_r), name="shmvec-lifeline", daemon=True)
    _thread.start()
    _mode = "watch"


def disarm() -> None:
    """Cuts the lifeline (the worker is READY: its waits check the parent from now on)."""
    global _mode, _stop_w, _thread
    if _mode == "pdeathsig":
        _set_pdeathsig(0)
    elif _mode == "watch" and _stop_w is not None:
        os.write(_stop_w, b"x")
        os.close(_stop_w)
        if _thread is not None:
            _thread.join(1.0)
    _mode, _stop_w, _thread = None, None, None


def armed() -> str | None:
    """How this process's lifeline is held: ``"pdeathsig"``, ``"watch"``, or None."""
    return _mode


if hasattr(os, "register_at_fork"):  # a child forked by an armed worker (an env's process) has no lifeline
    os.register_at_fork(after_in_child=lambda: globals().update(_mode=None, _stop_w=None, _thread=None))


# Run by the child as the preparation data unpickles: arm if shmvec can be imported there.
_ARM_SOURCE = """
try:
    from shmvec._lifeline import arm
    arm(parent_pid)
except Exception:
    pass
"""


class WorkerName(str):
    """A worker's process name, which arms the lifeline where it is unpickled (see the module
    docstring) and is a plain ``str`` there."""

    parent_pid: int

    def __new__(cls, name: str, parent_pid: int) -> WorkerName:
        out = super().__new__(cls, name)
        out.parent_pid = parent_pid
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        expression = f"exec({_ARM_SOURCE!r}, {{'parent_pid': {int(self.parent_pid)}}}) or {str(self)!r}"
        return eval, (expression,)
