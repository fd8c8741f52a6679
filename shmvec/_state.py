"""The parent side's state: one value that says what a call on the engine may do.

The shared words say where each *worker* is (:mod:`shmvec._protocol`); this module says where
the *parent* is.  Every front-end call checks it once (:meth:`Status.check_usable`, and the step's
short way reads ``status.state is IDLE``); every change goes through :meth:`Status.enter` or
:meth:`Status.fail`, against the table below.

States::

                       RESETTING   CALLING     (reset_async / call_async, until their _wait)
                            ^  │     ^  │
                            │  v     │  v
    STARTING ──────────────> IDLE <─────────────────────── DONE
       │                     │  ^                            ^
       │                     │  └─ reset, rare calls, pool ─┐│
       │                     v  (synchronous: IDLE again)   ││
       │                   POSTED ──> COLLECTING ──> CONSUMED─┘
       │                     │            │              │
       v                     v            v              v
    CLOSED <──────────── BROKEN <──── (any failure) ─────┘

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
- ``BROKEN``: a failure left the workers and the parent out of step (a worker died, an env
  raised, a timeout, an interrupt between posting and waiting).  Every call raises
  ``BrokenVecEnvError`` naming the failure, except ``close()``.  With ``on_failure="restart"``
  the restart repairs some failures (:meth:`Status.recover`).
- ``CLOSED``: final.  Every call raises ``ClosedVecEnvError``; ``close()`` returns at once.

A step is "in flight" (``waiting``) in POSTED, COLLECTING, CONSUMED and DONE; ``pending`` names
what is in flight in any state ("step", "reset", "call" or None).
"""

from __future__ import annotations

import enum
from shmvec._errors import BrokenVecEnvError, ClosedVecEnvError, detached


class FirstFailure:
    """A data descriptor for a vec env's ``_broken``: stores what :func:`detached` gives.

    It has no ``__get__``: a read finds the value in the instance's ``__dict__``, as a plain
    attribute (the step's short way reads it every step), so the owner's ``__init__`` must set
    it (to None) before anything else; unset, a read gives this descriptor.  Raise the exception
    you created, not ``self._broken`` read back: that is the copy, and raising it would give it
    the traceback (and the cycle) the copy exists to avoid.
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
    RESETTING = "resetting"
    CALLING = "calling"


STARTING, IDLE, POSTED, COLLECTING, CONSUMED, DONE, BROKEN, CLOSED, RESETTING, CALLING = State

# What each state may become (BROKEN and CLOSED are reached through fail() and close()).
TRANSITIONS: dict[State, frozenset[State]] = {
    STARTING: frozenset({IDLE}),
    IDLE: frozenset({POSTED, RESETTING, CALLING}),
    RESETTING: frozenset({IDLE}),
    CALLING: frozenset({IDLE}),
    POSTED: frozenset({COLLECTING, DONE}),  # DONE: restart mode reads without the two phases below
    COLLECTING: frozenset({CONSUMED, DONE, POSTED}),  # POSTED: interrupted, read again later
    CONSUMED: frozenset({DONE}),
    DONE: frozenset({IDLE}),
    BROKEN: frozenset(),
    CLOSED: frozenset(),
}
IN_FLIGHT = frozenset({POSTED, COLLECTING, CONSUMED, DONE})
# What is in flight in each state that has something in flight (Gymnasium's names of the calls).
PENDING = {**{state: "step" for state in IN_FLIGHT}, RESETTING: "reset", CALLING: "call"}


class Status:
    """The parent's state and the failure that broke it, shared by the engine and its parts.

    Class-level defaults: safe on a half-built engine (``closed`` then reads True).
    """

    state = CLOSED
    _broken = FirstFailure()  # the failure, without its traceback (FirstFailure)
    _before: State = IDLE  # the state a failure interrupted (recover() returns to it)

    def __init__(self, public_name: str) -> None:
        self._broken = None  # first: read as a plain attribute (FirstFailure)
        self.public_name = public_name
        self.state = STARTING

    # ---- reading ------------------------------------------------------------------------------
    @property
    def failure(self) -> BaseException | None:
        """What broke the engine (a copy without its traceback), or None."""
        return self.__dict__.get("_broken")  # (unset on a half-built object: the class holds the descriptor)

    @property
    def closed(self) -> bool:
        return self.state is CLOSED

    @property
    def waiting(self) -> bool:
        """A step is in flight (posted, and not yet returned to the caller)."""
        return self.state in IN_FLIGHT

    @property
    def pending(self) -> str | None:
        """What is in flight: "step", "reset" (``reset_async``), "call" (``call_async``) or None."""
        return PENDING.get(self.state)

    @property
    def starting(self) -> bool:
        return self.state is STARTING

    def check_usable(self) -> None:
        """:raises ClosedVecEnvError, BrokenVecEnvError: the engine cannot take a call."""
        if self.state is CLOSED:
            raise ClosedVecEnvError(f"this {self.public_name} is closed; build a new one")
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


def record(status: Status, exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` (with ``cause`` as its ``__cause__``) recorded as what broke ``status``, returned to be
    raised: ``raise record(self.status, X(...))`` keeps the exception in no local of the raising
    frame (a local would hold the frame, and the engine, through its traceback)."""
    if cause is not None:
        exc.__cause__ = cause
    status.fail(exc, first=False)
    return exc

