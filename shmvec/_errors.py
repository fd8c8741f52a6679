"""Exceptions of shmvec, and how a worker's exception crosses to the parent.

A worker's exception is re-raised in the parent as its own type, with the
worker's formatted traceback attached as ``__cause__`` (the way
``concurrent.futures`` does it) and a note naming the env index, the worker and
the command.  An exception that cannot be pickled, or whose constructor does not
accept its own ``args`` on unpickling, arrives as :class:`RemoteEnvError`, which
keeps the type name, the message and the traceback.
"""

from __future__ import annotations

import copy
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Iterable
from typing import Any

from gymnasium import error as _gym_error


class ShmVecEnvError(RuntimeError):
    """Base class of the errors shmvec raises itself."""


class WorkerDiedError(ShmVecEnvError):
    """A worker process exited while the parent was waiting for it."""

    def __init__(self, message: str, worker: int | None = None, env_indices: range | None = None,
                 exitcode: int | None = None) -> None:
        super().__init__(message)
        self.worker = worker
        self.env_indices = env_indices
        self.exitcode = exitcode


class WorkerTimeoutError(ShmVecEnvError, TimeoutError):
    """Workers did not answer within the ``timeout`` given to the vec env."""


class ClosedVecEnvError(ShmVecEnvError, _gym_error.ClosedEnvironmentError):
    """The vec env was used after ``close()`` (also Gymnasium's ``ClosedEnvironmentError``)."""


class BrokenVecEnvError(ShmVecEnvError):
    """An earlier failure left the workers in an unknown state; close and rebuild the vec env."""


class AlreadyPendingCallError(ShmVecEnvError, _gym_error.AlreadyPendingCallError):
    """A call was made while a step (or, on ``ShmVectorEnv``, a ``reset_async`` or ``call_async``)
    was still in flight (also Gymnasium's error of that name).  ``name``: what is in flight
    ("step", "reset" or "call"), as Gymnasium's attribute."""

    def __init__(self, message: str, name: str = "step") -> None:
        super().__init__(message)
        self.name = name


class NoAsyncCallError(ShmVecEnvError, _gym_error.NoAsyncCallError):
    """A ``*_wait`` without its ``*_async`` (also Gymnasium's error of that name).  ``name``: the
    call waited for ("step", "reset" or "call")."""

    def __init__(self, message: str, name: str = "step") -> None:
        super().__init__(message)
        self.name = name


class ConcurrentCallError(ShmVecEnvError):
    """A step started in one thread was collected in another."""


class ForkedVecEnvError(ShmVecEnvError):
    """A vec env was used in a child of ``os.fork()``: its workers belong to the parent."""


class SpaceError(ShmVecEnvError, TypeError):
    """A space that shmvec cannot place in fixed-size shared memory, or envs whose spaces differ."""


class ObservationError(ShmVecEnvError, ValueError):
    """An env returned an observation that does not fit its declared observation space."""


class TooManyRestartsError(ShmVecEnvError):
    """With ``on_failure="restart"``: a failure came after ``max_restarts`` restarts; the vec env is broken."""


class UnknownAgentError(ShmVecEnvError, ValueError):
    """A PettingZoo env reported an agent that is not in its ``possible_agents`` (raised in the
    worker, at the reset or step where the agent first appears; re-raised in the parent with the
    worker's traceback).  ``agent``, ``env_index``, ``call`` ("reset" or "step") and
    ``possible_agents`` say which, where and against what."""

    def __init__(self, message: str, agent: Any = None, env_index: int | None = None, call: str = "step",
                 possible_agents: list | None = None) -> None:
        super().__init__(message)
        self.agent, self.env_index, self.call = agent, env_index, call
        self.possible_agents = list(possible_agents or [])

    def __reduce__(self):  # its own args: it crosses processes
        return type(self), (str(self), self.agent, self.env_index, self.call, self.possible_agents)


class InvalidActionError(ShmVecEnvError, ValueError):
    """Actions that an env must not receive: NaN in a float ``Box``, out of range for a discrete space."""

    def __init__(self, message: str, env_indices: list[int]) -> None:
        super().__init__(message)
        self.env_indices = env_indices

    def __reduce__(self):  # its own args: it crosses processes (a Ray actor's exception)
        return type(self), (str(self), self.env_indices), self.__dict__


class WorkerRestartWarning(RuntimeWarning):
    """With ``on_failure="restart"``: a worker failed and was restarted (its episodes end as truncated)."""


class ParentThreadsWarning(UserWarning):
    """shmvec set torch's intra-op threads in this process while its workers step envs
    (``parent_threads="auto"``, shmvec._threads): shown once per process, with how to keep torch's count."""


class InvalidActionWarning(RuntimeWarning):
    """With ``invalid_actions="warn"``: actions that are NaN or out of range were passed on to the envs."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; shown as the ``__cause__`` of the re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + "".join(self.tb).rstrip() + "\n(traceback of the worker, above)"


class WorkerStacks(RemoteTraceback):
    """The Python stacks faulthandler wrote in a worker that died of a signal or hung
    (``shmvec._crash``), shown as the ``__cause__`` of WorkerDiedError or WorkerTimeoutError."""

    def __init__(self, tb: str, when: str) -> None:
        super().__init__(tb)
        self.when = when

    @classmethod
    def of(cls, tb: str, when: str) -> "WorkerStacks | None":
        """The stacks ``tb`` as a cause to attach, or None where the worker wrote none."""
        return cls(tb, when) if tb else None

    def __reduce__(self) -> tuple:
        return type(self), (self.tb, self.when)

    def __str__(self) -> str:
        return "\n\n" + self.tb.rstrip() + f"\n(the worker's Python stack {self.when}, from faulthandler, above)"


class RemoteEnvError(ShmVecEnvError):
    """Stands in for a worker exception that could not be sent as itself."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message

    def __reduce__(self):
        return type(self), (self.type_name, self.message), self.__dict__


def _has_traceback(exc: BaseException | None, depth: int = 0) -> bool:
    """Whether ``exc``, or an exception it chains, carries a traceback (and so frames)."""
    if exc is None or depth > 8:
        return False
    return (exc.__traceback__ is not None or _has_traceback(exc.__cause__, depth + 1)
            or _has_traceback(exc.__context__, depth + 1))


def detached(exc: BaseException, depth: int = 0) -> BaseException:
    """``exc`` as a broken vec env keeps it: a copy without the parent's traceback.

    A vec env that a failure leaves unusable keeps that failure, to name it (and chain it) in
    every later error.  The exception itself, once raised, carries the traceback of the calls it
    went through, and their frames hold the vec env: a reference cycle, so a broken vec env
    dropped without ``close()`` would keep its workers and shared memory until the garbage
    collector's next full pass.  The copy has no traceback, and is a copy even of an exception
    not raised yet (one stored, then raised, would gain the traceback as it went); what it chains (a worker's
    traceback, as ``RemoteTraceback``) is detached the same way, and its notes are kept.  An
    exception that does not copy as itself (a constructor that does not take its own ``args``,
    a ``__str__`` that differs after the copy) is kept as it is: the cycle, not a wrong message.
    """
    if depth and not _has_traceback(exc):
        return exc  # chained and never raised (a worker's traceback): nothing to cut
    try:
        kept = copy.copy(exc)
        same = type(kept) is type(exc) and kept is not exc and str(kept) == str(exc)
    except Exception:
        same = False
    if not same or depth > 8:
        return exc
    kept.__traceback__ = None
    kept.__cause__ = None if exc.__cause__ is None else detached(exc.__cause__, depth + 1)
    kept.__context__ = None if exc.__context__ is None else detached(exc.__context__, depth + 1)
    kept.__suppress_context__ = exc.__suppress_context__
    return kept


def caused(exc: BaseException, cause: BaseException | None) -> BaseException:
    """``exc`` with ``cause`` as its ``__cause__`` if there is one (as ``raise exc from cause``,
    without touching ``__suppress_context__`` when there is none); returns ``exc``."""
    if cause is not None:
        exc.__cause__ = cause
    return exc


def envs_named(indices: Iterable[int]) -> str:
    """Env indices in words, for messages: ``"env 3"``, ``"envs 0..3"``, ``"envs 0..2, 5"``,
    ``"no env"`` (one form wherever a message names a worker's envs, or any set of them)."""
    indices = list(indices)
    if not indices:
        return "no env"
    out, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
        if i is not None:
            start = prev = i
    return ("env " if len(indices) == 1 else "envs ") + ", ".join(out)


def describe_exitcode(exitcode: int | None) -> str:
    """'exit code 3', 'signal SIGKILL (9)', or 'still running'."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"signal {name} ({-exitcode})"
    return f"exit code {exitcode}"


def pack_exception(exc: BaseException, *, env_index: int | None, worker: int, command: str) -> dict[str, Any]:
    """What a worker sends for ``exc``: plain data plus the pickled exception if it survives a round trip."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    payload: bytes | None
    try:
        payload = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)  # constructors with unusual signatures fail here, not in the parent
    except Exception:
        payload = None
    try:
        message = str(exc)
    except Exception as inner:  # a __str__ that raises must not take the worker down with it
        message = f"<str() of the exception raised {type(inner).__name__}: {inner!r}>"
    return {
        "payload": payload,
        "type_name": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": message,
        "traceback": tb,
        "env_index": env_index,
        "worker": worker,
        "command": command,
    }


def unpack_exception(packed: dict[str, Any], hint: str) -> BaseException:
    """The exception to raise in the parent for what :func:`pack_exception` sent; ``hint`` says what to do."""
    exc: BaseException | None = None
    if packed["payload"] is not None:
        try:
            exc = pickle.loads(packed["payload"])
        except Exception:
            exc = None
    if exc is None or not isinstance(exc, Exception):
        # Also a worker's SystemExit or KeyboardInterrupt: raised as such here, it would end (or
        # look like a Ctrl-C of) the caller's program; it is an error of the env's.
        exc = RemoteEnvError(packed["type_name"], packed["message"])
    where = f"env {packed['env_index']}" if packed["env_index"] is not None else "a worker"
    exc.add_note(
        f"shmvec: {packed['type_name']} raised by {where} (worker {packed['worker']}) during "
        f"{packed['command']}; the worker's traceback is shown above. {hint}"
    )
    exc.__cause__ = RemoteTraceback(packed["traceback"])
    return exc


def user_stacklevel() -> int:
    """The stack level of the first frame outside shmvec and SB3's vec env base (for warnings)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(here) or os.sep + os.path.join("common", "vec_env") + os.sep in path):
            return level
        frame = frame.f_back
        level += 1
    return 1

