"""The parent side's state: one value that says what a call on the engine may do.

The shared words say where each *worker* is (:mod:`shmvec._protocol`); this module says where
the *parent* is.  Every front-end call checks it once (:meth:`Status.check_usable`, and the step's
short way reads ``engine.state is IDLE``); every change goes through :meth:`Status.enter` or
:meth:`Status.fail`, against the table below.

States (a step goes left to right; reset and rare calls start and end in IDLE)::

    STARTING ──> IDLE ──> POSTED ──> COLLECTING ──> CONSUMED ──> DONE ──> IDLE
                  │ ^       ^ │          │  │                      ^
                  │ │       │ │          │  └─────────────────────>│ (nothing came by pipe)
                  │ │       │ └──────────┼─────────────────────────┘ (restart mode)
                  │ │       └────────────┘ (an interrupt while reading: read again later)
                  v │
          RESETTING, CALLING  (reset_async / call_async, until their reset_wait / call_wait)
          POOLING             (a pool's workers serve it, from its reset until it stops)

    any state but CLOSED and FORKED ──(a failure)──> BROKEN;   any state ──close()──> CLOSED;
    in a child of os.fork(), every engine of the parent ──> FORKED

- ``STARTING``: the constructor launches the workers and runs the two handshakes.
- ``IDLE``: nothing in flight; any call may start.
- ``POSTED``: a step is with the workers (``step_async`` returned, a ``step`` was interrupted
  in its wait, or a ``step_wait`` timed out).  ``step_wait`` collects it; ``reset``/``close``
  finish and drop it.
- ``COLLECTING``: the step's wait is over and its results are being read from the mailboxes.
  An interrupt (``KeyboardInterrupt``) here leaves them to read again; an ``Exception`` (an
  info that does not unpickle) would come back every time, so it breaks the engine.
- ``CONSUMED``: a worker's result came through its pipe and was read: it cannot be read again,
  so any interruption from here on breaks the engine.
- ``DONE``: the step's results are read and kept: a ``step_wait`` cut short after this (a
  Ctrl-C as it returned) returns them again.  The front-end returns to ``IDLE`` once it has
  built its return value.
- ``RESETTING``: a reset posted by ``reset_async`` (Gymnasium's API, ``ShmVectorEnv``) that
  ``reset_wait`` has not collected; a ``reset_wait`` whose ``timeout`` passed leaves it so.
  Every other call raises ``AlreadyPendingCallError``; ``close()`` finishes it.
- ``CALLING``: a rare call sent by ``call_async`` whose answers ``call_wait`` has not read (the
  same rules; ``close()`` lets the workers answer, then stops them).  The synchronous ``reset``
  and rare calls never enter these two states.
- ``POOLING``: the workers serve a pool (``ShmEnvPool``, and the SB3 pool over it): each takes
  its envs' steps from its queue, env by env, until the pool stops them (``Engine.start_pool``
  to ``Engine.stop_pool``).  Entered from IDLE just before POOL is posted (interrupted after the
  post, the pool's ``close()`` still stops the workers); back to IDLE once every worker has left
  the pool (the pool's reset, a rare call, which stops the pool and starts it again).  The
  engine's own calls raise ``AlreadyPendingCallError`` meanwhile; the pool's ``close()`` stops
  the workers before the engine closes, also when the pool broke while serving
  (:attr:`Status.serving_pool`).
- ``BROKEN``: a failure left the workers and the parent out of step (a worker died, an env
  raised, a timeout, an interrupt between posting and waiting).  Every call raises
  ``BrokenVecEnvError`` naming the failure, except ``close()``.  With ``on_failure="restart"``
  the restart repairs some failures (:meth:`Status.recover`).
- ``CLOSED``: final.  Every call raises ``ClosedVecEnvError``; ``close()`` returns at once.
- ``FORKED``: this is a copy in a child of ``os.fork()``: the workers and the block are the
  parent's.  Every call raises ``ForkedVecEnvError``; ``close()`` drops the child's mapping only.

A step is "in flight" (``waiting``) in POSTED, COLLECTING, CONSUMED and DONE; ``in_flight_call``
names what is in flight in any state ("step", "reset", "call", "pool" or None).

Threads.  Every public call of a front-end runs under the engine's lock (:func:`serialized`), so
calls from several threads are serialized, never interleaved: a second thread's ``step()``
waits for the first one's, then runs its own.  A step split in two (``step_async`` in one thread,
``step_wait`` in another) is refused (``ConcurrentCallError``): the waiting thread could collect
a step that is not its own.  ``close()`` from another thread asks a thread waiting on the workers
to stop waiting (it raises ``ClosedVecEnvError`` within ``POLL_S``), then takes the lock and
closes: nothing is released under a thread still reading the block.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Callable, TypeVar
from shmvec._errors import BrokenVecEnvError, ClosedVecEnvError, ConcurrentCallError, ForkedVecEnvError, detached


class FirstFailure:
    """A data descriptor for :attr:`Status._broken` (the failure that broke the engine): stores
    what :func:`detached` gives, a copy without the traceback.

    It has no ``__get__``: a read finds the value in the instance's ``__dict__``, as a plain
    attribute, so the owner's ``__init__`` must set it (to None) before anything else; unset, a
    read gives this descriptor (:attr:`Status.failure` reads the ``__dict__`` for that reason).
    Raise the exception you created, not the stored copy read back: raising the copy would give
    it the traceback (and the cycle) the copy exists to avoid.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, obj: Any, exc: BaseException | None) -> None:
        obj.__dict__[self.name] = None if exc is None else detached(exc)


class State(enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    POSTED = "posted"
    COLLECTING = "collecting"
    CONSUMED = "consumed"
    DONE = "done"
    BROKEN = "broken"
    CLOSED = "closed"
    FORKED = "forked"
    RESETTING = "resetting"
    CALLING = "calling"
    POOLING = "pooling"

    # A member is its own identity: the object's hash (in C), not Enum's hash of the name (a
    # Python call each time a state is looked up, several times a step).
    __hash__ = object.__hash__


STARTING, IDLE, POSTED, COLLECTING, CONSUMED, DONE, BROKEN, CLOSED, FORKED, RESETTING, CALLING, POOLING = State

# What each state may become (BROKEN and CLOSED are reached through fail() and close()).
TRANSITIONS: dict[State, frozenset[State]] = {
    STARTING: frozenset({IDLE}),
    IDLE: frozenset({POSTED, RESETTING, CALLING, POOLING}),
    RESETTING: frozenset({IDLE}),
    CALLING: frozenset({IDLE}),
    POOLING: frozenset({IDLE}),
    POSTED: frozenset({COLLECTING, DONE}),  # DONE: restart mode reads without the two phases below
    COLLECTING: frozenset({CONSUMED, DONE, POSTED}),  # POSTED: interrupted, read again later
    CONSUMED: frozenset({DONE}),
    DONE: frozenset({IDLE}),
    BROKEN: frozenset(),
    CLOSED: frozenset(),
    FORKED: frozenset(),
}
IN_FLIGHT = frozenset({POSTED, COLLECTING, CONSUMED, DONE})
# What is in flight in each state that has something in flight (Gymnasium's names of the calls).
IN_FLIGHT_CALL = {**{state: "step" for state in IN_FLIGHT}, RESETTING: "reset", CALLING: "call", POOLING: "pool"}


class Status:
    """The parent's state and the failure that broke it, shared by the engine and its parts.

    Class-level defaults: safe on a half-built engine (``closed`` then reads True).
    """

    state = CLOSED
    _broken = FirstFailure()  # the failure, without its traceback (FirstFailure)
    _before: State = IDLE  # the state a failure interrupted (recover() returns to it)
    closer: int | None = None  # the thread in close(): any other thread waiting on the workers stops
    poster: int | None = None  # the thread that posted the step in flight
    pid: int | None = None  # the process that built the engine
    lock: Any = None

    def __init__(self, public_name: str) -> None:
        self._broken = None  # first: read as a plain attribute (FirstFailure)
        self.public_name = public_name
        self.state = STARTING
        self.pid = os.getpid()
        self.lock = threading.RLock()  # reentrant: a signal handler's close() runs in the thread holding it
        _LIVE.add(self)

    # ---- reading ------------------------------------------------------------------------------
    @property
    def failure(self) -> BaseException | None:
        """What broke the engine (a copy without its traceback), or None."""
        return self.__dict__.get("_broken")  # (unset on a half-built object: the class holds the descriptor)

    @contextlib.contextmanager
    def closing(self) -> Iterator[None]:
        """Holds the lock for a close: first tells a thread waiting on the workers to stop waiting."""
        if self.lock is None:  # half-built
            yield
            return
        self.closer = threading.get_ident()
        try:
            with self.lock:
                yield
        finally:
            self.closer = None

    @property
    def closed(self) -> bool:
        return self.state is CLOSED

    @property
    def waiting(self) -> bool:
        """A step is in flight (posted, and not yet returned to the caller)."""
        return self.state in IN_FLIGHT

    @property
    def in_flight_call(self) -> str | None:
        """What is in flight: "step", "reset" (``reset_async``), "call" (``call_async``), "pool"
        (the workers serve a pool) or None."""
        return IN_FLIGHT_CALL.get(self.state)

    @property
    def serving_pool(self) -> bool:
        """The workers serve a pool: POOLING, or BROKEN by a failure in POOLING (the pool's close
        still tells them to leave it)."""
        return self.state is POOLING or (self.state is BROKEN and self._before is POOLING)

    @property
    def starting(self) -> bool:
        return self.state is STARTING

    def check_usable(self) -> None:
        """:raises ClosedVecEnvError, BrokenVecEnvError, ForkedVecEnvError: the engine cannot take a call."""
        if self.state is CLOSED:
            raise ClosedVecEnvError(f"this {self.public_name} is closed; build a new one")
        if self.state is FORKED:
            raise ForkedVecEnvError(
                f"this {self.public_name} was built by process {self.pid}, and this is a child of os.fork() "
                f"(process {os.getpid()}): its workers are the parent's, and a child driving them would leave the "
                f"parent's next call hanging. Build a new {self.public_name} in the child, or fork before building it.")
        broken = self.failure
        if broken is not None:
            raise BrokenVecEnvError(
                f"an earlier failure ({type(broken).__name__}: {broken}) left this "
                f"{self.public_name} unusable; call close() and build a new one"
            ) from broken

    # ---- changing -----------------------------------------------------------------------------
    def enter(self, new: State) -> None:
        """Moves to ``new``, which must be allowed from the current state (TRANSITIONS)."""
        if new not in TRANSITIONS[self.state]:
            raise AssertionError(f"shmvec: no transition from {self.state.name} to {new.name}")
        self.state = new

    def fail(self, exc: BaseException, first: bool = True) -> None:
        """Records ``exc`` as what broke the engine (only if nothing did before, with ``first``)."""
        if first and self.failure is not None:
            return
        self._broken = exc
        if self.state is not CLOSED and self.state is not STARTING:
            if self.state is not BROKEN:
                self._before = self.state
            self.state = BROKEN

    def recover(self) -> BaseException | None:
        """Forgets the failure (a restart repaired it); returns what it was."""
        broken = self.failure
        self._broken = None
        if self.state is BROKEN:
            self.state = self._before
        return broken

    def close(self) -> bool:
        """Moves to CLOSED; False if it was closed already."""
        if self.state is CLOSED:
            return False
        self.state = CLOSED
        return True

    def check_closing(self, command: str) -> None:
        """:raises ClosedVecEnvError: the engine was closed while ``command`` waited (by a signal handler
        in this thread), or another thread is closing it."""
        if self.state is CLOSED:
            raise ClosedVecEnvError(f"this {self.public_name} was closed during {command} (by a signal handler?)")
        closer = self.closer
        if closer is not None and closer != threading.get_ident():
            raise ClosedVecEnvError(f"this {self.public_name} was closed by thread {closer} during {command}")

    def check_poster(self, what: str) -> None:
        """:raises ConcurrentCallError: the step in flight was posted by another thread."""
        me = threading.get_ident()
        if self.poster is not None and self.poster != me:
            raise ConcurrentCallError(
                f"{what}() in thread {me}, but the step in flight was started by step_async() in thread "
                f"{self.poster}: collect it in that thread. A {self.public_name} serializes calls from several "
                "threads, but a step split in two belongs to the thread that started it.")


_LIVE: "weakref.WeakSet[Status]" = weakref.WeakSet()


def _forked() -> None:
    """In a child of ``os.fork()``: every engine of the parent is the parent's (state FORKED), and
    its lock is new (another thread of the parent may have held it at the fork)."""
    for status in list(_LIVE):
        status.lock = threading.RLock()
        if status.state is not CLOSED:
            status.state = FORKED


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)

_F = TypeVar("_F", bound=Callable[..., Any])


def serialized(method: _F) -> _F:
    """A front-end's public method, run under its engine's lock (``self._engine.lock``)."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        engine = self._engine
        if engine is None:
            return method(self, *args, **kwargs)
        with engine.lock:
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


def record(status: Status, exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` (with ``cause`` as its ``__cause__``) recorded as what broke ``status``, returned to be
    raised: ``raise record(self.status, X(...))`` keeps the exception in no local of the raising
    frame (a local would hold the frame, and the engine, through its traceback)."""
    if cause is not None:
        exc.__cause__ = cause
    status.fail(exc, first=False)
    return exc

