"""A worker's end of its pipe: the bounded reads, the parent watch, and the rare commands.

The control words carry the frequent commands (STEP, RESET, POOL, CLOSE: :mod:`shmvec._worker`);
everything else a worker hears comes through its pipe, at the points :mod:`shmvec._protocol`
names ("Start-up", "Rare commands", step 6b):

- :class:`ParentWatch` tells whether the parent is alive (a pidfd where the kernel has one): a
  fork-inherited copy of the parent's end keeps EOF from showing when it dies, so every wait on
  the pipe here, and every idle wait on the words, asks it;
- :func:`wait_readable`, :func:`recv` and :func:`recv_bytes_or_give_up` are the worker's only
  reads of the pipe: each gives up when the parent dies, and the last one also when a newer
  command is posted while the message has not fully come (the parent was interrupted);
- :func:`serve_rare` serves one rare command (``Cmd.PIPE`` posted, then ``(call, args)`` sent):
  :func:`run_rare` runs it env by env through :data:`RARE_COMMANDS`, one handler per
  :class:`shmvec._protocol.Call`, and the answer (or any exception, even an env's SystemExit)
  goes back on the pipe.  A new rare command is a name in ``Call``, a handler here, and its
  caller in the parent.
"""

from __future__ import annotations

import os
import pickle
import select
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from shmvec import _protocol as P
from shmvec._errors import ShmVecEnvError, pack_exception
from shmvec._pickling import dumps
from shmvec._pool import PoolServer
from shmvec._worker_envs import is_wrapped

if TYPE_CHECKING:  # the worker drives this module: no import of it at run time
    import gymnasium as gym

    from shmvec._worker import Worker

__all__ = ["ParentWatch", "wait_readable", "recv_bytes_or_give_up", "recv", "serve_rare", "run_rare",
           "RARE_COMMANDS"]


class ParentWatch:
    """Tells whether the parent process is still alive (a pidfd where the kernel has them)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None

    def alive(self) -> bool:
        if self.fd is not None:
            readable, _, _ = select.select([self.fd], [], [], 0)
            return not readable
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def wait_readable(conn: Connection, parent: ParentWatch, give_up: Any = None,
                  poll_s: float = P.PARENT_POLL_S) -> bool:
    """Waits until ``conn`` has data: True; False as soon as ``give_up()`` is true.  Raises
    EOFError when the parent dies (fork copies of its end make EOF on the pipe unreliable)."""
    while not conn.poll(poll_s):
        if give_up is not None and give_up():
            return False
        if not parent.alive():
            raise EOFError("parent process died")
    return True


def recv_bytes_or_give_up(conn: Connection, parent: ParentWatch, give_up: Any,
                          poll_s: float = P.PIPE_WAIT_POLL_S) -> bytes | None:
    """``conn.recv_bytes()`` read in pieces, checking ``give_up()`` while the message has not
    begun *and* between its pieces: None once it is true.

    A parent interrupted (Ctrl-C) in the middle of ``send_bytes()`` leaves half a message in the
    pipe and then posts CLOSE; a plain ``recv_bytes()`` would wait for the other half forever (the
    parent waited 5 s, then sent SIGTERM, and the envs' ``close()`` never ran).  The pipe is not
    read again after giving up: the worker closes.  Framing as ``Connection._send_bytes`` writes
    it: a 4-byte big-endian signed length, or -1 and an 8-byte length above 2 GiB.
    """
    fd = conn.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    timeout_ms = max(1, int(poll_s * 1000))

    def read(n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            while not poller.poll(timeout_ms):
                if give_up():
                    return None
                if not parent.alive():
                    raise EOFError("parent process died")
            chunk = os.read(fd, min(left, 1 << 22))
            if not chunk:
                raise EOFError("the parent closed its end of the pipe")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    header = read(4)
    if header is None:
        return None
    size = int.from_bytes(header, "big", signed=True)
    if size == -1:
        header = read(8)
        if header is None:
            return None
        size = int.from_bytes(header, "big")
    return read(size) if size else b""


def recv(conn: Connection, parent: ParentWatch) -> Any:
    """conn.recv(), giving up when the parent dies."""
    wait_readable(conn, parent)
    return conn.recv()


# ---- rare commands ---------------------------------------------------------------------------------
def serve_rare(worker: Worker, seq: int) -> None:
    """The rare command posted as ``seq``: its message, run, answered on the pipe."""
    # Posted first, sent after (protocol, "Rare commands"): wait for the message, for the
    # parent's death (a fork-inherited copy of its end keeps EOF from showing), and for a
    # newer command (the parent was interrupted before it sent the message, and closes us).
    words = worker.words
    assert words is not None
    seq_word = P.word(worker.index, P.CMD_SEQ)
    data = recv_bytes_or_give_up(worker.conn, worker.parent, lambda: words.load(seq_word) != seq)
    if data is None:
        return  # the serve loop takes the newer command (CLOSE)
    name = None  # not known until unpickled: the parent fills it in
    try:
        name, args = pickle.loads(data)  # an argument that does not unpickle here is the answer
        result = run_rare(worker, name, args)
        worker.conn.send_bytes(dumps((P.Pipe.OK, result)))
    except BaseException as exc:  # an env's sys.exit() too: it is the answer, the worker stays
        worker.conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=worker.current, worker=worker.index,
                                                       command=name)))
    worker.current = None


def run_rare(worker: Worker, name: str, args: tuple) -> list:
    """Runs rare command ``name`` for each env index of ``args[0]`` (the worker's ``current``
    names it meanwhile); one value per index."""
    indices = args[0]
    out = []
    for i in indices:
        worker.current = i
        env = worker.envs[i - worker.start]
        handler = RARE_COMMANDS.get(name) if isinstance(name, str) else None
        if handler is None:
            raise ShmVecEnvError(f"unknown command {name!r}")
        out.append(handler(worker, env, i, args))
    if worker.masks_on and worker.was_reset and name in (P.Call.SET_ATTR, P.Call.ENV_METHOD):
        worker.write_masks(indices)  # the call may have changed what the envs allow
    return out


Handler = Callable[["Worker", "gym.Env", int, tuple], Any]


def _has_attr(worker: Worker, env: gym.Env, i: int, args: tuple) -> bool:
    try:
        env.get_wrapper_attr(args[1])
    except AttributeError:
        return False
    return True


def _set_attr(worker: Worker, env: gym.Env, i: int, args: tuple) -> None:
    setattr(env, args[1], args[2])


def _call(worker: Worker, env: gym.Env, i: int, args: tuple) -> Any:
    """Gymnasium's VectorEnv.call: call it if callable, else return it."""
    attr = env.get_wrapper_attr(args[1])
    return attr(*args[2], **args[3]) if callable(attr) else attr


def _set_wrapper_attr(worker: Worker, env: gym.Env, i: int, args: tuple) -> None:
    """Gymnasium's VectorEnv.set_attr: ``args[2]`` is {env index: value}."""
    env.set_wrapper_attr(args[1], args[2][i])


def _action_masks(worker: Worker, env: gym.Env, i: int, args: tuple) -> None:
    """The parent's first ask for masks: written now, then after every step."""
    if not worker.masks_on and worker.masks is not None:
        if worker.was_reset:
            worker.write_masks(range(worker.start, worker.stop))  # raises: still off, asked again
        worker.masks_on = True


def _action_masks_off(worker: Worker, env: gym.Env, i: int, args: tuple) -> None:
    """The first ask failed in another worker: all stay off."""
    worker.masks_on = False


def _pool_attach(worker: Worker, env: gym.Env, i: int, args: tuple) -> None:
    """Once per worker: attach the pool's segment (shmvec._pool).  ``args``: (indices, the
    segment's name, the slices, info_bytes, spin); the pool reads the actions through the
    worker's own layout."""
    worker.pool = PoolServer(worker, *args[1:])


RARE_COMMANDS: dict[str, Handler] = {
    P.Call.GET_ATTR: lambda worker, env, i, args: env.get_wrapper_attr(args[1]),
    P.Call.HAS_ATTR: _has_attr,
    P.Call.SET_ATTR: _set_attr,
    P.Call.ENV_METHOD: lambda worker, env, i, args: env.get_wrapper_attr(args[1])(*args[2], **args[3]),
    P.Call.CALL: _call,
    P.Call.SET_WRAPPER_ATTR: _set_wrapper_attr,
    P.Call.IS_WRAPPED: lambda worker, env, i, args: is_wrapped(env, args[1]),
    P.Call.RENDER: lambda worker, env, i, args: env.render(),
    P.Call.ACTION_MASKS: _action_masks,
    P.Call.ACTION_MASKS_OFF: _action_masks_off,
    P.Call.POOL_ATTACH: _pool_attach,
}
"""One handler per rare command: ``handler(worker, env, i, args)`` gives env i's value."""
