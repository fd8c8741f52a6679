"""The Ray actors behind RayShmVecEnv and RayShmEnvPool: placement, start, calls, replacement, close.

An :class:`ActorGroup` places one actor per node (or ``n_actors`` spread over the cluster, or
one per bundle of a placement group), gives each a contiguous slice of the envs, starts a local
shmvec engine in each (:mod:`shmvec.ray.actor`), waits for calls with one bound, turns failed
calls into shmvec errors (:mod:`shmvec.ray.failures`), replaces failed actors
(``on_failure="restart"``) and kills them all on ``close()``.  The front-ends
(:mod:`shmvec.ray.vec_env`, :mod:`shmvec.ray.pool`) each hold one and call only the methods
below.

State
-----
One :class:`GroupState` says what the front-end may do next.  Every public method of a
front-end checks it once (:meth:`ActorGroup.check_usable`, which also refuses a cluster that
``ray.shutdown()`` took away); the transitions are the methods named here, all in this module::

    __init__ (actors started)               -> IDLE        (a failed start: -> CLOSED, and raises)
    IDLE     --post()-->      POSTED        RayShmVecEnv.step_async: a step in flight on every actor
    POSTED   --collected()--> IDLE          RayShmVecEnv.step_wait, whatever it raises
    IDLE, RUNNING --started()--> RUNNING    RayShmEnvPool.async_reset: the pool runs (send/recv allowed)
    IDLE, POSTED, RUNNING --fail(exc)--> BROKEN   a failure left the actors in unknown states
    any      --close()-->     CLOSED

- ``CLOSED``: not started yet (the class default: ``close()`` and ``__del__`` are safe on a
  half-built group) or closed.  Every call raises ``ClosedVecEnvError``; ``close()`` does nothing.
- ``IDLE``: the actors are up, nothing is in flight: any call.
- ``POSTED``: only ``step_wait()`` (and ``close()``); other calls raise ``AlreadyPendingCallError``.
- ``RUNNING``: the pool was reset; before that, its ``send``/``recv`` raise ``ShmVecEnvError``.
- ``BROKEN``: every call raises ``BrokenVecEnvError`` from what broke it (``broken``, kept
  after ``close()``); ``close()`` still releases everything.
"""

from __future__ import annotations

import enum
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from shmvec import factories as F
from shmvec._errors import (
    BrokenVecEnvError,
    ClosedVecEnvError,
    SpaceError,
    TooManyRestartsError,
    WorkerRestartWarning,
    WorkerTimeoutError,
    user_stacklevel,
)
from shmvec._copyguard import Uncopyable
from shmvec._layout import split_envs
from shmvec._pickling import pickle_factories
from shmvec._state import FirstFailure
from shmvec.ray.actor import remote_actor_class
from shmvec.ray.failures import BROKEN_HINT, engine_failed, failure_error, failure_reason, unwrap

__all__ = ["ActorGroup", "GroupState", "ON_FAILURE"]

ON_FAILURE = ("raise", "restart")
# Bounds of close(): each actor's own ShmVecEnv.close() (which itself waits up to 5 s per
# worker), then ray.kill.
_CLOSE_TIMEOUT_S = 15.0


class GroupState(enum.Enum):
    """What the front-end of an :class:`ActorGroup` may do next (see the module docstring)."""

    CLOSED = "closed"
    IDLE = "idle"
    POSTED = "posted"
    RUNNING = "running"
    BROKEN = "broken"


class ActorGroup(Uncopyable):
    """Ray actors, each running a local shmvec engine over one contiguous slice of the envs.

    What RayShmVecEnv and :class:`~shmvec.ray.pool.RayShmEnvPool` share: placement, start,
    index mapping, failures (RayActorDiedError, env exceptions, timeouts), restarts, close.
    The arguments are the front-ends' (see :class:`~shmvec.ray.vec_env.RayShmVecEnv`); ``owner``
    is the front-end's class name, for messages.  ``pool_kwargs`` (for a pool): given the
    slices, each actor's ShmEnvPool options; without it each actor runs a ShmVecEnv.

    Attributes: ``actors`` (handles, in env order), ``slices``, ``n_actors``, ``actor_info``
    (where each actor runs), ``hello`` (actor 0's answer to ``start``: spaces, metadata),
    ``restarts``, ``restarted`` (actor -> (reason, reset obs, reset infos): replaced during a
    rare call, reported as truncated by the next step).

    :raises ValueError: bad arguments or placement.
    :raises SpaceError, WorkerTimeoutError, RayActorDiedError: the actors did not start as one.
    """

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    _state = GroupState.CLOSED
    _broken = FirstFailure()  # kept without its traceback (see shmvec._errors.detached)
    actors: list = []
    restarted: dict = {}

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, owner: str, n_actors: int | None,
                 envs_per_actor: Sequence[int] | None, num_cpus_per_actor: float, placement_group: Any,
                 actor_options: dict[str, Any] | None, shm_kwargs: dict[str, Any] | None, timeout: float | None,
                 start_timeout: float | None, on_failure: str, max_restarts: int | None,
                 pool_kwargs: Callable[[list[range]], list[dict[str, Any]]] | None = None) -> None:
        self._broken = None  # first: read as a plain attribute (FirstFailure)
        self.owner = owner
        self.restarted = {}
        env_fns = F.factory_list(env_fns, owner)
        n_envs = len(env_fns)
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {ON_FAILURE}, got {on_failure!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive or None, got {timeout}")
        shm_kwargs = dict(shm_kwargs or {})
        shm_kwargs.setdefault("start_method", "forkserver")
        if shm_kwargs["start_method"] == "fork":
            raise ValueError(
                "shm_kwargs start_method='fork' is refused inside Ray actors (their gRPC threads would be forked "
                "mid-flight): use 'forkserver' (the default) or 'spawn'"
            )
        if not ray.is_initialized():
            ray.init()

        strategies, cpus = _placement(n_actors, placement_group, num_cpus_per_actor)
        n_actors = len(strategies)
        if envs_per_actor is None:
            if n_actors > n_envs:
                raise ValueError(f"{n_actors} actors for {n_envs} envs: pass n_actors <= {n_envs}")
            self.slices = split_envs(n_envs, n_actors)
        else:
            counts = [int(c) for c in envs_per_actor]
            if len(counts) != n_actors or min(counts) < 1 or sum(counts) != n_envs:
                raise ValueError(
                    f"envs_per_actor={counts} must give each of the {n_actors} actors at least one env and sum to "
                    f"{n_envs}"
                )
            starts = np.cumsum([0] + counts).tolist()
            self.slices = [range(a, b) for a, b in zip(starts[:-1], starts[1:])]
        self.n_actors = n_actors
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.on_failure = on_failure
        self.max_restarts = max_restarts
        self.restarts = 0
        self._unwarned: list[str] = []  # restarts not yet warned of (warn_restarts)
        self._call_timeout = timeout

        self._remote_cls = remote_actor_class()
        options = dict(actor_options or {})
        options.setdefault("max_restarts", 0)  # restarts are ours: Ray's would lose the envs' state silently
        self._actor_opts = [dict(options, num_cpus=cpus[k], scheduling_strategy=strategies[k])
                            for k in range(n_actors)]
        pool_args = pool_kwargs(self.slices) if pool_kwargs is not None else [None] * n_actors
        self._start_args = []
        for k, sl in enumerate(self.slices):
            kwargs = dict(shm_kwargs)
            kwargs.setdefault("n_workers", max(1, min(len(sl), int(cpus[k]) or 1)))
            self._start_args.append((pickle_factories(env_fns, sl), kwargs, pool_args[k]))
        self._state = GroupState.IDLE
        self.actors = []
        self.actor_info: list[dict[str, Any]] = [{} for _ in range(n_actors)]
        try:
            self.actors = [self._remote_cls.options(**opts).remote() for opts in self._actor_opts]
            starts_refs = [a.start.remote(*args) for a, args in zip(self.actors, self._start_args)]
            self._call_timeout = start_timeout
            hellos = self.gather(starts_refs, "start", broken=True)
            self._call_timeout = timeout
        except BaseException:
            self._close_quietly()
            raise
        self.actor_info = [_where(h, sl) for h, sl in zip(hellos, self.slices)]
        first = hellos[0]
        self._spaces = {name: first[name] for name in ("observation_space", "action_space")}
        for k, h in enumerate(hellos[1:], start=1):
            for name in ("observation_space", "action_space"):
                if h[name] != first[name]:
                    self._close_quietly()
                    raise SpaceError(
                        f"env {self.slices[k].start} (actor {k}) has {name} {h[name]}, env 0 has {first[name]}: "
                        "all envs of a vec env must share their spaces."
                    )
        self.hello = first

    # ---- state ------------------------------------------------------------------------------------------
    @property
    def state(self) -> GroupState:
        return self._state

    @property
    def broken(self) -> BaseException | None:
        """What broke the group (a copy without its traceback), or None."""
        return self._broken

    def check_usable(self) -> GroupState:
        """The state, if a call may go on (IDLE, POSTED or RUNNING); raises otherwise.

        :raises ClosedVecEnvError: closed, or ``ray.shutdown()`` took the actors away.
        :raises BrokenVecEnvError: an earlier failure broke the group (chained from it).
        """
        state = self._state
        if state is not GroupState.CLOSED and not ray.is_initialized():
            raise ClosedVecEnvError(f"ray.shutdown() was called: the actors of this {self.owner} are gone; "
                                    "call close() and build a new one")
        if state is GroupState.CLOSED:
            raise ClosedVecEnvError(f"this {self.owner} is closed; build a new one")
        if state is GroupState.BROKEN:
            raise BrokenVecEnvError(
                f"an earlier failure ({type(self._broken).__name__}: {self._broken}) left this {self.owner} "
                "unusable; "
                "call close() and build a new one"
            ) from self._broken
        return state

    def post(self) -> None:
        """IDLE -> POSTED: a step was sent to every actor."""
        self._state = GroupState.POSTED

    def collected(self) -> None:
        """POSTED -> IDLE: the step's results were taken (or its wait failed; BROKEN stays BROKEN)."""
        if self._state is GroupState.POSTED:
            self._state = GroupState.IDLE

    def started(self) -> None:
        """IDLE or RUNNING -> RUNNING: the pool was reset."""
        self._state = GroupState.RUNNING

    def fail(self, exc: BaseException, overwrite: bool = False) -> BaseException:
        """-> BROKEN: records ``exc`` as what broke the group (unless something did already, or
        ``overwrite``) and returns it, to be raised as ``raise group.fail(X(...))``."""
        if overwrite or self._broken is None:
            self._broken = exc
        if self._state is not GroupState.CLOSED:
            self._state = GroupState.BROKEN
        return exc

    # ---- calls ------------------------------------------------------------------------------------------
    def gather(self, refs: list, command: str, broken: bool, actors: list[int] | None = None) -> list[Any]:
        """One result per actor (``actors``: their indices), or the error that says what failed.

        ``broken``: a failure leaves the actors in unknown states (the group breaks); otherwise
        only dead or late actors break it, or are replaced with ``on_failure="restart"``.
        """
        results, failures = self.collect(refs, command, broken)
        if failures:
            actors = list(range(len(refs))) if actors is None else actors
            restarted = not broken and self.on_failure == "restart" and self._restart_after_call(failures, actors,
                                                                                                 command)
            if restarted:
                self.warn_restarts(broken=False)
            self.raise_failures(failures, actors, command, broken, restarted=restarted)
        return results

    def collect(self, refs: list, command: str, broken: bool) -> tuple[list[Any], dict[int, BaseException]]:
        """ray.get of one result per actor: (results, {position: Ray's exception}) for the failed ones.

        A ref not ready within the timeout fails with ``GetTimeoutError``.  An interruption
        (KeyboardInterrupt) leaves the actors in unknown states: the group is then broken
        when ``broken`` says so.
        """
        limit = self._call_timeout
        t0 = time.monotonic()
        try:
            try:
                return ray.get(refs, timeout=limit), {}
            except ray.exceptions.RayError:
                pass
            # Something failed: wait for the rest (within what is left of the timeout), then look
            # at each result on its own.
            left = None if limit is None else max(0.0, limit - (time.monotonic() - t0))
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left)
        except BaseException as exc:
            if broken:
                self.fail(exc)
            raise
        ready_set = set(ready)
        results: list[Any] = [None] * len(refs)
        failures: dict[int, BaseException] = {}
        for pos, ref in enumerate(refs):
            if ref not in ready_set:
                failures[pos] = ray.exceptions.GetTimeoutError(f"no answer within {self._call_timeout} s")
                continue
            try:
                results[pos] = ray.get(ref, timeout=0)
            except ray.exceptions.RayError as exc:
                failures[pos] = exc
        return results, failures

    def raise_failures(self, failures: dict[int, BaseException], actors: list[int], command: str,
                       broken: bool, restarted: bool = False) -> None:
        """Raises the error that says most about ``failures`` ({position in actors: exception})
        (:func:`~shmvec.ray.failures.failure_error`), breaking the group if it must."""
        err, breaks = failure_error(failures, actors, command, self.slices, self.actor_info, self._call_timeout,
                                    broken, restarted)
        if breaks:
            self.fail(err, overwrite=True)  # after __suppress_context__ is set: _broken keeps a copy
        try:
            raise err
        finally:
            # Locals holding it, or Ray's exceptions that lead to it, would hold these frames (and
            # self) through its traceback; the callers' frames hold ``failures`` too.
            failures.clear()
            err = None

    def reason(self, k: int, exc: BaseException, command: str) -> str:
        """What failed in actor k, in one line, for ``info["shmvec_restarted"]`` and the warning."""
        return failure_reason(k, self.slices[k], self.actor_info[k], exc, command, self._call_timeout)

    # ---- restarts (on_failure="restart") ---------------------------------------------------------------
    def _restart_after_call(self, failures: dict[int, BaseException], actors: list[int], command: str) -> bool:
        """Replaces the actors that died (or hung) during a rare call; True if there were any.

        Their envs are reset now; the next step reports them as truncated without stepping them
        (the actions given for them were chosen for observations of the old envs).
        """
        failed = [(actors[p], e) for p, e in failures.items()
                  if isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)) or engine_failed(e)]
        for k, exc in failed:
            reason = self.reason(k, exc, command)
            obs, reset_infos = self.restart_actor(k, reason)  # raises (and breaks) past max_restarts
            self.restarted[k] = (reason, obs, reset_infos)
        return bool(failed)

    def restart_actor(self, k: int, reason: str, seeds: list | None = None,
                      options: list | None = None) -> tuple[Any, list]:
        """Replaces actor k by a new one with the same envs, reset; returns (obs, reset infos).

        :raises TooManyRestartsError: past ``max_restarts`` (the group breaks).
        """
        if self.max_restarts is not None and self.restarts >= self.max_restarts:
            raise self.fail(TooManyRestartsError(
                f"{reason}, after {self.restarts} restarts (max_restarts={self.max_restarts}). " + BROKEN_HINT
            ), overwrite=True)
        self.restarts += 1
        try:
            ray.kill(self.actors[k], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        n = len(self.slices[k])
        opts = dict(self._actor_opts[k])
        strategy = opts["scheduling_strategy"]
        if isinstance(strategy, NodeAffinitySchedulingStrategy):
            alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
            if strategy.node_id not in alive:
                opts["scheduling_strategy"] = "SPREAD"  # its node is gone: anywhere with room
        self.actors[k] = actor = self._remote_cls.options(**opts).remote()
        try:
            self._call_timeout = self.start_timeout
            (hello,) = self.gather([actor.start.remote(*self._start_args[k])], "restart", broken=True, actors=[k])
            self._call_timeout = self.timeout
            for name in ("observation_space", "action_space"):
                if hello[name] != self._spaces[name]:
                    raise SpaceError(f"restarted actor {k} has {name} {hello[name]}, not {self._spaces[name]}")
            self.actor_info[k] = _where(hello, self.slices[k])
            (result,) = self.gather([actor.reset.remote(seeds or [None] * n, options or [{}] * n)],
                                    "reset after restart", broken=True, actors=[k])
        except BaseException as exc:
            self._call_timeout = self.timeout
            self.fail(exc)
            raise
        # Warned of once the caller has noted the restart: a warning turned into an error
        # (-W error) must not lose the truncation it reports.
        self._unwarned.append(f"shmvec.ray: {reason}; restarted it (restart {self.restarts}), on node "
                              f"{self.actor_info[k]['node_ip']}: its episodes end as truncated")
        return result

    def warn_restarts(self, broken: bool) -> None:
        """Emits the WorkerRestartWarnings of the restarts done and noted since the last call.
        One raised as an error (``-W error``) breaks the group when ``broken`` (a step's or
        reset's results are lost with it); after a rare call, the next step still reports the
        truncation."""
        if not self._unwarned:
            return
        messages, self._unwarned = self._unwarned, []
        for message in messages:
            try:
                warnings.warn(message, WorkerRestartWarning, stacklevel=user_stacklevel())
            except Warning as exc:
                if broken:
                    self.fail(exc)
                raise

    # ---- close ------------------------------------------------------------------------------------------
    def close(self, pending: Sequence = ()) -> None:
        """Closes every actor's engine, then kills the actors.  Idempotent, bounded in time.

        ``pending``: refs of calls in flight, let finish first (within the bound).  Actors that
        died or do not answer within the bound are killed all the same; their engine's workers
        notice that their parent is gone and exit, and their shared memory was unlinked when
        they started, so nothing is left on any node.

        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        if self._state is GroupState.CLOSED:
            return
        self._state = GroupState.CLOSED
        actors, self.actors = self.actors, []
        pending = list(pending)
        if not ray.is_initialized():
            return  # ray.shutdown() came first: the driver's actors died with it
        error: BaseException | None = None
        # Actors that timed out may be stuck in an env: kill them without asking.
        polite = not isinstance(self._broken, WorkerTimeoutError)
        deadline = time.monotonic() + _CLOSE_TIMEOUT_S  # one bound for the whole polite part
        try:
            if pending and polite:  # let a step in flight finish before closing
                _, late = ray.wait(pending, num_returns=len(pending), timeout=_CLOSE_TIMEOUT_S)
                polite = not late  # a close() would queue behind a call that does not end
            refs = []
            for a in actors if polite else []:
                try:
                    refs.append(a.close.remote())
                except Exception:  # noqa: BLE001 - a handle of an earlier Ray session: nothing to close
                    pass
            left = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left) if refs else ([], [])
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    error = error or unwrap(exc, "Everything else was released.")
                except ray.exceptions.RayError:
                    pass  # a dead actor: nothing left to close politely
        finally:
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone, or Ray shut down
                    pass
        if error is not None:
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and self) through its traceback

    def _close_quietly(self) -> None:
        """``close()``, ignoring errors (for clean-up paths)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __del__(self) -> None:
        if self._state is not GroupState.CLOSED:
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass


def _placement(n_actors: int | None, placement_group: Any, num_cpus: float) -> tuple[list, list[float]]:
    """(scheduling strategy, CPUs) of each actor."""
    if placement_group is not None:
        bundles = placement_group.bundle_specs
        strategies = [PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=b)
                      for b in range(len(bundles))]
        return strategies, [float(b.get("CPU", num_cpus)) for b in bundles]
    if n_actors is not None:
        if n_actors < 1:
            raise ValueError(f"n_actors must be at least 1, got {n_actors}")
        return ["SPREAD"] * n_actors, [num_cpus] * n_actors
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= num_cpus]
    if not nodes:
        raise ValueError(f"no alive Ray node has {num_cpus} CPUs for an actor: lower num_cpus_per_actor")
    nodes.sort(key=lambda n: n["NodeID"])
    return [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in nodes], [num_cpus] * len(nodes)


def _where(hello: dict[str, Any], sl: range) -> dict[str, Any]:
    return {"node_id": hello["node_id"], "node_ip": hello["node_ip"], "pid": hello["pid"],
            "n_workers": hello["n_workers"], "env_indices": sl}
