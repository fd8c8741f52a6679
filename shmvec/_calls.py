"""The rare-call path: a command for some envs, its answers read through the workers' pipes.

A rare command (``get_attr``, ``env_method``, ``render``, ... :class:`shmvec._protocol.Call`)
goes to the workers that hold the envs it names, and their answers come back by position
(:class:`shmvec._channel.RareCall` pickles the messages, :class:`shmvec._channel.Channel` posts
CALL and moves them).  :class:`RareCalls` is the engine's side of it, with the state it owns:

- :meth:`RareCalls.call` runs one and returns its answers (the state stays IDLE);
- :meth:`RareCalls.call_async` sends one and returns (state CALLING, the call kept in
  :attr:`RareCalls.pending`), :meth:`RareCalls.call_wait` reads its answers (state IDLE).

The engine binds the three as its own ``call``, ``call_async`` and ``call_wait`` (the front-ends
see only the engine).  :func:`check_idle` is the engine's rule before any command (nothing may be
in flight), and :func:`gave_up` what a ``*_wait(timeout=...)`` raises when its time is over.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import Any

from shmvec._channel import Channel, RareCall
from shmvec._errors import AlreadyPendingCallError, NoAsyncCallError
from shmvec._seeds import env_indices
from shmvec._state import CALLING, IDLE, Status


class RareCalls:
    """The rare commands of one engine (see the module docstring).

    :param restarts: the engine's :class:`shmvec._restarts.Restarts` (``on_failure="restart"``: a
        dead worker is restarted before a call), or None.
    """

    pending: RareCall | None = None  # the call of call_async() (state CALLING)

    def __init__(self, status: Status, channel: Channel, restarts: Any, slices: Sequence[range], n_envs: int) -> None:
        self.status, self.channel, self.restarts = status, channel, restarts
        self.slices, self.n_envs = slices, n_envs

    def call(self, name: str, indices: Any, args: tuple) -> list[Any]:
        """Rare command ``name`` on the envs ``indices`` (SB3's: None, an int, or ints); answers in order."""
        check_idle(self.status, name)
        if self.restarts is not None:
            self.restarts.recover_dead(name)
        return self.channel.call(name, env_indices(indices, self.n_envs), args)

    def call_async(self, name: str, indices: Any, args: tuple) -> None:
        """Sends rare command ``name`` as :meth:`call` does, and returns (state CALLING):
        :meth:`call_wait` reads the answers.  An argument that does not pickle changes nothing."""
        check_idle(self.status, "call_async")
        call = self.pending = RareCall(name, env_indices(indices, self.n_envs), args, self.slices)
        try:
            self.status.enter(CALLING)
            self.channel.send_call(call)
        except BaseException as exc:  # a worker posted and not sent its message waits for it
            self.status.fail(exc)
            raise

    def call_wait(self, timeout: float | None = None) -> list[Any]:
        """The answers of :meth:`call_async`'s call (or the env's error, as :meth:`call`), state IDLE
        after; past ``timeout``, ``multiprocessing.TimeoutError`` and the call stays in flight.

        :raises NoAsyncCallError: no call is in flight.
        """
        status = self.status
        status.check_usable()
        if status.state is not CALLING:
            raise NoAsyncCallError("Calling `call_wait` without any prior call to `call_async`.", "call")
        call = self.pending
        if not call.done:  # (done: read, and an interrupt came before the state changed)
            if timeout is not None and not self.channel.answered(call, timeout):
                raise gave_up("call", timeout)
            self.channel.read_answers(call)  # (breaks the engine if it fails)
        status.enter(IDLE)
        self.pending = None
        return call.result()


def check_idle(status: Status, what: str) -> None:
    """Usable, and nothing in flight (else AlreadyPendingCallError: a step, reset_async, call_async, a pool)."""
    status.check_usable()
    if status.state is not IDLE:
        raise pending_error(what, status.in_flight_call)


def pending_error(what: str, pending: str | None) -> AlreadyPendingCallError:
    """AlreadyPendingCallError for ``what()`` called while ``pending`` ("step", "reset", "call", "pool") is in flight."""
    if pending == "step":
        return AlreadyPendingCallError(
            f"{what}() while a step is in flight (a step_async() without its step_wait(), or a step interrupted "
            "by Ctrl-C): call step_wait() to collect it, or reset()")
    if pending == "pool":
        return AlreadyPendingCallError(f"{what}() while the workers serve a pool: stop the pool first", "pool")
    return AlreadyPendingCallError(
        f"{what}() while a {pending} is in flight ({pending}_async() without its {pending}_wait()): call "
        f"{pending}_wait() first", str(pending))


def gave_up(command: str, seconds: float) -> multiprocessing.TimeoutError:
    """What a ``*_wait(timeout=...)`` raises when ``command`` is not over in time (in Gymnasium's
    words, then ours: the command is still in flight, nothing is lost)."""
    return multiprocessing.TimeoutError(
        f"The call to `{command}_wait` has timed out after {seconds} second(s); the {command} is still in flight: "
        f"{command}_wait() collects it" + (", reset() drops it." if command == "step" else "."))
