"""RayShmVecEnv: one SB3 ``VecEnv`` over the envs of several machines, through Ray actors.

Install with ``pip install -c constraints.txt -e ".[ray]"`` in the checkout. The envs are split
into contiguous slices, one per Ray actor (one actor per node by default, or one per bundle of a
placement group); each actor runs a local :class:`~shmvec.ShmVecEnv` over its slice. Shared memory
does the work inside a node; Ray moves one batch per actor per step::

    driver                          actor k (a Ray worker process on some node)
    step_async(actions)  --------->  step(actions[slice k])   ShmVecEnv -> its worker processes
                                     returns (obs, rewards, dones, infos as one pickled list)
    step_wait(): ray.get  <--------

Every actor's step is launched before any is waited for, so the actors step at the same time.
Only infos that say more than ``{"TimeLimit.truncated": False}`` travel, as one pickled list per
actor (``terminal_observation`` included); the driver rebuilds the others.

Faults: an actor that dies (its process, or its node) raises :class:`RayActorDiedError` (a
:class:`~shmvec.WorkerDiedError`) naming the actor, its node and the envs it held; an env's
exception arrives as its own type, as with ShmVecEnv.  Either way ``close()`` still releases
everything.  With ``on_failure="restart"`` (the option of the same name of ShmVecEnv, same
semantics) a failed actor is replaced by a new one instead, and its envs report the step as
the end of a truncated episode (``info["shmvec_restarted"]`` says why).

``describe()``/``from_description()`` turn a RayShmVecEnv into plain data and back, as for
ShmVecEnv, so a run can be rebuilt on another cluster.  The asynchronous pool over the same
actors is :class:`shmvec.ray_pool.RayShmEnvPool` (and its SB3 face ``RayShmVecEnvPool``).
"""

from __future__ import annotations

import collections
import functools
import os
import pickle
import time
import traceback
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

# Absolute imports (this module is shmvec.ray): ``ray`` is the Ray package, not this module.
import cloudpickle
import gymnasium as gym
import numpy as np
import ray
import ray.exceptions
from gymnasium import spaces
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from shmvec import _describe, _pickling, _seeds
from shmvec import factories as F
from shmvec._errors import (
    AlreadyPendingCallError,
    BrokenVecEnvError,
    ClosedVecEnvError,
    FirstFailure,
    NoAsyncCallError,
    RemoteTraceback,
    ShmVecEnvError,
    SpaceError,
    TooManyRestartsError,
    Uncopyable,
    WorkerDiedError,
    WorkerRestartWarning,
    WorkerTimeoutError,
    broken_by,
)
from shmvec._actions import leaf_check, exact_integers, rows_reshaped
from shmvec._layout import group_by_slice, split_envs
from shmvec._errors import user_stacklevel
from shmvec._protocol import RESTART_INFO_KEY
from shmvec._pickling import dumps as _dumps  # pickle, or cloudpickle for classes of __main__

__all__ = ["RayShmVecEnv", "RayActorDiedError", "TooManyRestartsError", "WorkerRestartWarning"]

_BROKEN_HINT = "The vec env cannot go on: call close() and build a new one."
_CALL_HINT = "The vec env is still usable."
_RESTARTED_HINT = (
    "on_failure='restart' replaced it: a new actor built and reset its envs, whose next step_wait() reports their "
    "episodes as truncated (info['shmvec_restarted']). The call was not retried (its effect cannot be replayed "
    "safely on new envs): call it again if you need it. The vec env is still usable."
)
# Bounds of close(): each actor's own ShmVecEnv.close() (which itself waits up to 5 s per
# worker), then ray.kill.
_CLOSE_TIMEOUT_S = 15.0
# An info that says nothing beyond this is not sent; the driver rebuilds it.
_PLAIN_INFO_KEY = "TimeLimit.truncated"
ON_FAILURE = ("raise", "restart")


class RayActorDiedError(WorkerDiedError):
    """A Ray actor of a :class:`RayShmVecEnv` died (its process was killed, or its node was lost).

    ``worker`` is the actor's index, ``env_indices`` the envs it held; ``node_id``,
    ``node_ip`` and ``pid`` say where it ran.
    """

    def __init__(self, message: str, worker: int | None = None, env_indices: range | None = None,
                 node_id: str | None = None, node_ip: str | None = None, pid: int | None = None) -> None:
        super().__init__(message, worker=worker, env_indices=env_indices, exitcode=None)
        self.node_id = node_id
        self.node_ip = node_ip
        self.pid = pid


def _keeps_traceback(method: Callable) -> Callable:
    """Attaches the actor's formatted traceback (chained causes included, so the ShmVecEnv
    worker's too) to an exception leaving ``method``: Ray sends the exception, not its chain."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            try:
                exc._shmvec_traceback = "".join(traceback.format_exception(exc))
            except Exception:  # noqa: BLE001 - an exception type that refuses attributes
                pass
            raise

    return wrapper


class _ShmVecActor:
    """The body of each Ray actor: a local ShmVecEnv over one slice of the envs.

    Methods take and return local indices (0 .. slice length - 1); the driver maps them.
    """

    def __init__(self) -> None:
        self.venv: Any = None

    @_keeps_traceback
    def start(self, env_fns_bytes: bytes, shm_kwargs: dict[str, Any],
              pool_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Builds the envs: a ShmVecEnv, or a ShmEnvPool given ``pool_kwargs`` (batch size, autoreset)."""
        try:
            env_fns = cloudpickle.loads(env_fns_bytes)
        except ImportError as exc:
            raise ImportError(
                f"{exc}: the env factories refer to a module this node cannot import. Install it on every node, "
                "or ship it with ray.init(runtime_env={'py_modules': [...]} or {'working_dir': ...})."
            ) from exc
        if pool_kwargs is None:
            from shmvec.shm_vec_env import ShmVecEnv

            self.venv = ShmVecEnv(env_fns, **shm_kwargs)
            spaces_of = self.venv
        else:
            from shmvec.env_pool import ShmEnvPool

            self.venv = ShmEnvPool(env_fns, **pool_kwargs, **shm_kwargs)
            spaces_of = types.SimpleNamespace(observation_space=self.venv.single_observation_space,
                                              action_space=self.venv.single_action_space)
        ctx = ray.get_runtime_context()
        return {
            "observation_space": spaces_of.observation_space,
            "action_space": spaces_of.action_space,
            "render_mode": self.venv.render_mode,
            "metadata": self.venv.metadata,
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "n_workers": self.venv.n_workers,
        }

    @_keeps_traceback
    def reset(self, seeds: list, options: list) -> tuple[Any, list]:
        venv = self.venv
        venv._seeds = list(seeds)  # the per-env lists of SB3's VecEnv, read by reset()
        venv.set_options(list(options))
        obs = venv.reset()
        return obs, venv.reset_infos

    @_keeps_traceback
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, bytes]:
        venv = self.venv
        obs, rewards, dones, infos = venv.step(actions)
        extra = []
        for i, info in enumerate(infos):
            if len(info) != 1 or info.get(_PLAIN_INFO_KEY) is not False:
                extra.append((i, info))
        resets = [(i, venv.reset_infos[i]) for i in np.flatnonzero(dones).tolist() if venv.reset_infos[i]]
        payload = _dumps((extra, resets)) if extra or resets else b""
        return obs, rewards, dones, payload

    @_keeps_traceback
    def call(self, method: str, local_indices: list[int] | None, args: tuple, kwargs: dict) -> Any:
        venv = self.venv
        if method == "get_images":
            return venv.get_images()
        if method == "has_attr":
            return venv.has_attr(*args)
        if method == "env_method":
            name, margs, mkwargs = args
            return venv.env_method(name, *margs, indices=local_indices, **mkwargs)
        return getattr(venv, method)(*args, indices=local_indices, **kwargs)

    # ---- pool mode (the engine is a ShmEnvPool; see shmvec.ray_pool) --------------------------------
    @_keeps_traceback
    def pool_reset(self, seeds: list, options: dict[str, Any] | list | None) -> tuple:
        """Resets every env of the slice; returns the first local batch."""
        self.venv.async_reset(seed=list(seeds), options=options)
        return self._pool_batch()

    @_keeps_traceback
    def pool_send(self, actions: Any, local_ids: np.ndarray, recv: bool) -> tuple | None:
        """Sends actions to local envs; with ``recv``, then waits for the next local batch."""
        self.venv.send(actions, local_ids)
        return self._pool_batch() if recv else None

    @_keeps_traceback
    def pool_recv(self) -> tuple:
        return self._pool_batch()

    @_keeps_traceback
    def pool_call(self, name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.venv, name)(*args, **kwargs)

    def _pool_batch(self) -> tuple:
        """The next local batch as (local ids, obs, rewards, terminated, truncated, pickled row infos)."""
        obs, rewards, terminated, truncated, infos = self.venv.recv()
        ids = infos["env_id"]
        own = self.venv.row_infos  # each row's own (info, reset info), unbatched
        rows = [(k, info, own[k]) for k, info in enumerate(row_infos(infos, len(ids))) if info or own[k][0] or own[k][1]]
        payload = _dumps(rows) if rows else b""
        return ids, obs, rewards, terminated, truncated, payload

    @_keeps_traceback
    def close(self) -> None:
        """The actor's last call: the driver kills it next (``ray.kill``), which runs no atexit handler."""
        venv, self.venv = self.venv, None
        try:
            if venv is not None:
                venv.close()
        finally:
            _remove_multiprocessing_tempdir()


def _remove_multiprocessing_tempdir() -> None:
    """Runs now the clean-up that multiprocessing leaves to the process's exit: removing its
    ``pymp-*`` temp folder, which holds the forkserver's socket.  Ray kills an actor without
    running atexit handlers, so every actor left one in the node's temp dir (40 per run of the
    Ray tests).  The forkserver itself exits once the actor is gone (its "alive" pipe closes).

    The finalizer is multiprocessing's own (``util.get_temp_dir`` registers it); calling it
    runs it once and takes it off the registry.  These are private names: if a Python version
    lacks them, the folder is left as before."""
    import multiprocessing.util as mp_util

    remove = getattr(mp_util, "_remove_temp_dir", None)
    registry = getattr(mp_util, "_finalizer_registry", None)
    if remove is None or not isinstance(registry, dict):
        return
    for finalizer in list(registry.values()):
        if getattr(finalizer, "_callback", None) is remove:
            try:
                finalizer()
            except Exception:  # noqa: BLE001 - a folder already gone: nothing left to remove
                pass


class _RayActorGroup(Uncopyable):
    """Ray actors, each running a local shmvec engine over one contiguous slice of the envs.

    What RayShmVecEnv and :class:`shmvec.ray_pool.RayShmEnvPool` share: placement, start,
    index mapping, failures (RayActorDiedError, env exceptions, timeouts), restarts, close.
    """

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    closed = True
    waiting = False
    _broken = FirstFailure()  # kept without its traceback (see shmvec._errors.detached)
    _actors: list = []
    _pending: list = []
    _restarted: dict = {}  # actor -> (reason, reset obs, reset infos): replaced during a rare call

    def _launch(self, env_fns: Sequence[Callable[[], gym.Env]], n_actors: int | None,
                envs_per_actor: Sequence[int] | None, num_cpus_per_actor: float, placement_group: Any,
                actor_options: dict[str, Any] | None, shm_kwargs: dict[str, Any] | None, timeout: float | None,
                start_timeout: float | None, on_failure: str, max_restarts: int | None,
                pool_kwargs: Callable[[list[range]], list[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """Places the actors and starts their engines; returns actor 0's hello (spaces, metadata).

        ``pool_kwargs`` (for a pool): given the slices, each actor's ShmEnvPool options;
        without it each actor runs a ShmVecEnv.
        """
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if n_envs == 0:
            raise ValueError(f"{type(self).__name__} needs at least one env factory")
        F.check_factories(env_fns)
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

        strategies, cpus = self._placement(n_actors, placement_group, num_cpus_per_actor)
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
        self._unwarned: list[str] = []  # restarts not yet warned of (_warn_restarts)
        self._call_timeout = timeout

        self._remote_cls = ray.remote(_ShmVecActor)
        options = dict(actor_options or {})
        options.setdefault("max_restarts", 0)  # restarts are ours: Ray's would lose the envs' state silently
        self._actor_opts = [dict(options, num_cpus=cpus[k], scheduling_strategy=strategies[k])
                            for k in range(n_actors)]
        pool_args = pool_kwargs(self.slices) if pool_kwargs is not None else [None] * n_actors
        self._start_args = []
        for k, sl in enumerate(self.slices):
            kwargs = dict(shm_kwargs)
            kwargs.setdefault("n_workers", max(1, min(len(sl), int(cpus[k]) or 1)))
            self._start_args.append((_pickling.pickle_factories(env_fns, sl), kwargs, pool_args[k]))
        self.closed = False
        self._actors = []
        self.actor_info: list[dict[str, Any]] = [{} for _ in range(n_actors)]
        try:
            self._actors = [self._remote_cls.options(**opts).remote() for opts in self._actor_opts]
            starts_refs = [a.start.remote(*args) for a, args in zip(self._actors, self._start_args)]
            self._call_timeout = start_timeout
            hellos = self._gather(starts_refs, "start", broken=True)
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
        return first

    @staticmethod
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

    def close(self) -> None:
        """Closes every actor's ShmVecEnv, then kills the actors.  Idempotent, bounded in time.

        Actors that died or do not answer within the bound are killed all the same; their
        ShmVecEnv workers notice that their parent is gone and exit, and their shared memory
        was unlinked when they started, so nothing is left on any node.

        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        if self.closed:
            return
        self.closed = True
        actors, self._actors = self._actors, []
        pending, self._pending = self._pending, []
        self.waiting = False
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
                    error = error or _unwrap(exc, "Everything else was released.")
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

    def _check_usable(self) -> None:
        if not self.closed and not ray.is_initialized():
            raise ClosedVecEnvError(f"ray.shutdown() was called: the actors of this {type(self).__name__} are gone; "
                                    "call close() and build a new one")
        if self.closed:
            raise ClosedVecEnvError(f"this {type(self).__name__} is closed; build a new one")
        if self._broken is not None:
            raise BrokenVecEnvError(
                f"an earlier failure ({type(self._broken).__name__}: {self._broken}) left this {type(self).__name__} "
                "unusable; "
                "call close() and build a new one"
            ) from self._broken

    def _broadcast(self, method: str, args: tuple) -> list[Any]:
        self._check_idle(method)
        refs = [a.call.remote(method, None, args, {}) for a in self._actors]
        return self._gather(refs, method, broken=False)

    def _indexed_call(self, method: str, indices: VecEnvIndices, args: tuple) -> list[Any]:
        """Calls ``method`` on each actor holding some of ``indices`` with its local indices.

        Answers go back by position: an index given twice runs twice, negative ones count from
        the end (as DummyVecEnv and ShmVecEnv).
        """
        self._check_idle(method)
        targets = list(self._get_indices(indices))
        groups = group_by_slice(targets, self.slices)
        by_actor = {k: [i - self.slices[k].start for i in idx] for k, (idx, _) in groups.items()}
        positions = {k: pos for k, (_, pos) in groups.items()}
        order = list(by_actor)
        refs = [self._actors[k].call.remote(method, by_actor[k], args, {}) for k in order]
        results = self._gather(refs, method, broken=False, actors=order)
        answers: list[Any] = [None] * len(targets)
        for k, values in zip(order, results):
            if values is None:  # set_attr
                continue
            for pos, value in zip(positions[k], values):
                answers[pos] = value
        return answers

    def _check_idle(self, method: str) -> None:
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError(f"{method}() while a step is in flight: call step_wait() first")

    def _gather(self, refs: list, command: str, broken: bool, actors: list[int] | None = None) -> list[Any]:
        """One result per actor (``actors``: their indices), or the error that says what failed."""
        results, failures = self._collect(refs, command, broken)
        if failures:
            actors = list(range(len(refs))) if actors is None else actors
            restarted = not broken and self.on_failure == "restart" and self._restart_after_call(failures, actors,
                                                                                                 command)
            if restarted:
                self._warn_restarts(broken=False)
            self._raise_failures(failures, actors, command, broken, restarted=restarted)
        return results

    def _restart_after_call(self, failures: dict[int, BaseException], actors: list[int], command: str) -> bool:
        """Replaces the actors that died (or hung) during a rare call; True if there were any.

        Their envs are reset now; the next step reports them as truncated without stepping them
        (the actions given for them were chosen for observations of the old envs).
        """
        failed = [(actors[p], e) for p, e in failures.items()
                  if isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)) or _engine_failed(e)]
        for k, exc in failed:
            reason = self._reason(k, exc, command)
            obs, reset_infos = self._restart_actor(k, reason)  # raises (and breaks) past max_restarts
            self._restarted[k] = (reason, obs, reset_infos)
        return bool(failed)

    def _collect(self, refs: list, command: str, broken: bool) -> tuple[list[Any], dict[int, BaseException]]:
        """ray.get of one result per actor: (results, {position: Ray's exception}) for the failed ones.

        A ref not ready within the timeout fails with ``GetTimeoutError``.  An interruption
        (KeyboardInterrupt) leaves the actors in unknown states: the vec env is then broken
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
            if broken and self._broken is None:
                self._broken = exc
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

    def _raise_failures(self, failures: dict[int, BaseException], actors: list[int], command: str,
                        broken: bool, restarted: bool = False) -> None:
        """Raises the error that says most about ``failures`` ({position in actors: exception}).

        A dead actor first (it names the node), then an env's exception, then a timeout.
        ``restarted``: the dead and late actors were replaced already (a rare call in restart mode).
        """
        hint = _BROKEN_HINT if broken else _CALL_HINT
        dead = [(actors[p], e) for p, e in failures.items() if isinstance(e, ray.exceptions.RayActorError)]
        late = [actors[p] for p, e in failures.items() if isinstance(e, ray.exceptions.GetTimeoutError)]
        env_errors = [(actors[p], e) for p, e in failures.items() if isinstance(e, ray.exceptions.RayTaskError)]
        others = [e for e in failures.values()
                  if not isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                                        ray.exceptions.RayTaskError))]
        err: BaseException
        if dead:
            err = self._died(dead, command, _RESTARTED_HINT if restarted else _BROKEN_HINT)
        elif env_errors:
            k, e = env_errors[0]
            err = self._located(_unwrap(e, _RESTARTED_HINT if restarted and _engine_failed(e) else hint), k)
        elif late:
            envs = ", ".join(f"{self.slices[k].start}..{self.slices[k].stop - 1}" for k in late)
            err = WorkerTimeoutError(
                f"{command}: actors {late} (envs {envs}) did not answer within {self._call_timeout:g} s. "
                + (_RESTARTED_HINT if restarted else
                   "An env may hang, or the cluster lacks the resources to place them (see `ray status`); "
                   "call close() (it kills them) and build a new vec env.")
            )
        else:
            err = ShmVecEnvError(f"{command}: Ray failed: {type(others[0]).__name__}: {others[0]}. {hint}")
            err.__cause__ = others[0]
        if err.__cause__ is None:
            err.__suppress_context__ = True  # Ray's exception says nothing more than ours
        if broken or ((dead or late) and not restarted):
            self._broken = err  # after the line above: _broken keeps a copy
        try:
            raise err
        finally:
            # Locals holding it, or Ray's exceptions that lead to it, would hold these frames (and
            # self) through its traceback; the callers' frames hold ``failures`` too.
            failures.clear()
            err = e = dead = env_errors = others = None

    def _reason(self, k: int, exc: BaseException, command: str) -> str:
        """What failed, in one line, for ``info["shmvec_restarted"]`` and the warning."""
        sl, info = self.slices[k], self.actor_info[k]
        where = f"actor {k} (envs {sl.start}..{sl.stop - 1}, node {info.get('node_ip')}, pid {info.get('pid')})"
        if isinstance(exc, ray.exceptions.RayActorError):
            return f"{where} died during {command}"
        if isinstance(exc, ray.exceptions.GetTimeoutError):
            return f"{where} did not answer {command} within {self._call_timeout:g} s"
        cause = getattr(exc, "cause", None) or exc
        return f"{where}: {type(cause).__name__} during {command}: {cause}"

    def _restart_actor(self, k: int, reason: str, seeds: list | None = None,
                       options: list | None = None) -> tuple[Any, list]:
        """Replaces actor k by a new one with the same envs, reset; returns (obs, reset infos)."""
        if self.max_restarts is not None and self.restarts >= self.max_restarts:
            raise broken_by(self, TooManyRestartsError(
                f"{reason}, after {self.restarts} restarts (max_restarts={self.max_restarts}). " + _BROKEN_HINT
            ))
        self.restarts += 1
        try:
            ray.kill(self._actors[k], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        n = len(self.slices[k])
        opts = dict(self._actor_opts[k])
        strategy = opts["scheduling_strategy"]
        if isinstance(strategy, NodeAffinitySchedulingStrategy):
            alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
            if strategy.node_id not in alive:
                opts["scheduling_strategy"] = "SPREAD"  # its node is gone: anywhere with room
        self._actors[k] = actor = self._remote_cls.options(**opts).remote()
        try:
            self._call_timeout = self.start_timeout
            (hello,) = self._gather([actor.start.remote(*self._start_args[k])], "restart", broken=True, actors=[k])
            self._call_timeout = self.timeout
            for name in ("observation_space", "action_space"):
                if hello[name] != self._spaces[name]:
                    raise SpaceError(f"restarted actor {k} has {name} {hello[name]}, not {self._spaces[name]}")
            self.actor_info[k] = _where(hello, self.slices[k])
            (result,) = self._gather([actor.reset.remote(seeds or [None] * n, options or [{}] * n)],
                                     "reset after restart", broken=True, actors=[k])
        except BaseException as exc:
            self._call_timeout = self.timeout
            if self._broken is None:
                self._broken = exc
            raise
        # Warned of once the caller has noted the restart: a warning turned into an error
        # (-W error) must not lose the truncation it reports.
        self._unwarned.append(f"shmvec.ray: {reason}; restarted it (restart {self.restarts}), on node "
                              f"{self.actor_info[k]['node_ip']}: its episodes end as truncated")
        return result

    def _warn_restarts(self, broken: bool) -> None:
        """Emits the WorkerRestartWarnings of the restarts just done and noted.  One raised as an
        error (``-W error``) breaks the vec env when ``broken`` (a step's or reset's results are
        lost with it); after a rare call, the next step still reports the truncation."""
        messages, self._unwarned = self._unwarned, []
        for message in messages:
            try:
                warnings.warn(message, WorkerRestartWarning, stacklevel=user_stacklevel())
            except Warning as exc:
                if broken and self._broken is None:
                    self._broken = exc
                raise

    def _located(self, exc: BaseException, k: int) -> BaseException:
        """Notes where ``exc`` (raised in actor k) came from; its ``env_indices`` become global."""
        sl, info = self.slices[k], self.actor_info[k]
        local = getattr(exc, "env_indices", None)
        if isinstance(local, range):
            exc.env_indices = range(local.start + sl.start, local.stop + sl.start)
        elif isinstance(local, (list, tuple)):
            exc.env_indices = [i + sl.start for i in local]
        where = f" on node {info['node_ip']} ({info['node_id'][:12]}...)" if info else ""
        exc.add_note(
            f"shmvec.ray: raised in actor {k}{where}, which holds envs {sl.start}..{sl.stop - 1}: "
            f"its local env j is env {sl.start} + j of this RayShmVecEnv."
        )
        return exc

    def _died(self, dead: list[tuple[int, BaseException]], command: str, hint: str = _BROKEN_HINT) -> RayActorDiedError:
        lines = []
        for k, _ in dead:
            sl, info = self.slices[k], self.actor_info[k]
            where = (f"on node {info['node_ip']} (node id {info['node_id']}), pid {info['pid']}" if info
                     else "while being placed")
            lines.append(f"actor {k} {where}, envs {sl.start}..{sl.stop - 1}")
        k0, cause = dead[0]
        info = self.actor_info[k0]
        reason = str(cause).strip().splitlines()
        err = RayActorDiedError(
            f"Ray actor died during {command}: " + "; ".join(lines) + ". "
            f"Ray says: {' / '.join(s.strip() for s in reason[:8])}. "
            "The node may have been lost, its process killed (the OOM killer, a native crash) or the actor "
            "killed with ray.kill. " + hint,
            worker=k0, env_indices=self.slices[k0],
            node_id=info.get("node_id"), node_ip=info.get("node_ip"), pid=info.get("pid"),
        )
        err.__cause__ = cause
        return err

    def __del__(self) -> None:
        if not self.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass


class RayShmVecEnv(_RayActorGroup, VecEnv):
    """A vectorized environment spread over Ray actors, each running a local ShmVecEnv.

    Call ``ray.init(...)`` first (``ray.init(address="auto")`` on a cluster; without it, Ray
    starts a local one)::

        env = RayShmVecEnv([lambda: gym.make("CartPole-v1")] * 256, num_cpus_per_actor=8)

    Placement (pick one):

    - default: one actor per alive node that has ``num_cpus_per_actor`` CPUs, pinned to it;
    - ``n_actors=k``: k actors spread over the cluster (Ray's ``"SPREAD"`` strategy);
    - ``placement_group=pg``: one actor per bundle of a placement group you created (ready).

    :param env_fns: callables that each build a new ``gymnasium.Env``, as for ShmVecEnv.  They are
        sent to other machines: the modules they refer to must be importable there (install them,
        or ship them with ``ray.init(runtime_env=...)``).
    :param n_actors: number of actors, spread over the cluster (None: one per node).
    :param envs_per_actor: how many envs each actor runs, in order (default: an even split).
    :param num_cpus_per_actor: CPUs each actor reserves from Ray; also the default ``n_workers``
        of its ShmVecEnv (at least 1, at most its envs).
    :param placement_group: a placement group; one actor per bundle (overrides ``n_actors``).
    :param actor_options: more ``.options(...)`` for every actor (``resources``,
        ``runtime_env``, ``memory``, ...).
    :param shm_kwargs: keyword arguments of each actor's ShmVecEnv (``n_workers``,
        ``start_method``, ``timeout``, ...).  The start method defaults to ``"forkserver"``;
        ``"fork"`` is refused (a Ray worker runs threads that fork would copy in an unknown
        state).  ``copy`` defaults to False there (Ray copies the result anyway); ``reset`` and
        ``step_wait`` of this class always return arrays of their own.
    :param timeout: seconds to wait for the actors on any command before raising
        ``WorkerTimeoutError`` (None: as long as they are alive; Ray reports dead ones).
    :param start_timeout: seconds to wait for the actors to be placed and their envs built;
        a cluster without the resources asked for never places them.
    :param on_failure: what a failed actor (it died, its node was lost, an env raised in
        ``step``/``reset``, or it did not answer within ``timeout``) does to the vec env.
        ``"raise"`` (default): the call raises (:class:`RayActorDiedError` for a dead actor,
        the env's own exception, ``WorkerTimeoutError``) and the vec env is broken: close it.
        ``"restart"``: the actor is killed and a new one builds the same envs from the same
        factories (on another node if its node is gone) and resets them; ``step_wait``
        reports each of them as an episode ended by truncation: ``done`` True, reward 0,
        ``info["TimeLimit.truncated"]`` True, ``info["terminal_observation"]`` the last
        observation returned for that env, ``info["shmvec_restarted"]`` a string saying what
        failed, and the reset observation as the observation.  After a failed ``reset()`` the
        flag is in ``reset_infos``.  Each restart warns (:class:`WorkerRestartWarning`).  A
        failure while restarting raises.  An actor that dies (or hangs past ``timeout``) during
        ``get_attr``/``set_attr``/``env_method`` and the like is replaced too, but the call
        raises (:class:`RayActorDiedError`, saying so): it is not retried, as its effect cannot
        be replayed safely on new envs (ShmVecEnv raises for the same reason); the vec env
        stays usable, and its next ``step_wait`` reports that actor's envs as truncated
        episodes without stepping them (the actions given for them were chosen for the old
        envs).  An env raising in such a call raises as itself and breaks nothing.  Failures
        of single workers inside an actor are the actor's ShmVecEnv's to handle: pass
        ``shm_kwargs={"on_failure": "restart"}`` for that.
    :param max_restarts: with ``"restart"``, how many actor restarts this vec env may do in
        all; the next failure raises :class:`TooManyRestartsError` (None: no limit).

    :raises TypeError: an env factory is not callable or cannot be pickled.
    :raises SpaceError: the actors' envs have different spaces.
    :raises WorkerTimeoutError: the actors were not up within ``start_timeout``.
    :raises RayActorDiedError: an actor died while starting.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_actors: int | None = None,
        *,
        envs_per_actor: Sequence[int] | None = None,
        num_cpus_per_actor: float = 1,
        placement_group: Any = None,
        actor_options: dict[str, Any] | None = None,
        shm_kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        start_timeout: float | None = 120.0,
        on_failure: str = "raise",
        max_restarts: int | None = 100,
    ) -> None:
        self._broken = None  # first: read as a plain attribute (FirstFailure)
        self._config = {k: v for k, v in locals().items() if k not in ("self", "env_fns", "__class__")}
        shm_kwargs = dict(shm_kwargs or {})
        # Views are safe here: Ray serializes a method's result as it returns, before the next
        # step can overwrite the buffers; the driver's concatenation makes arrays of its own.
        shm_kwargs.setdefault("copy", False)
        env_fns = list(env_fns)
        self._descriptions = _describe.describe_env_fns(env_fns)
        self._seed_arg: Any = None
        self._options_arg: Any = None
        self._restarted: dict[int, tuple[str, Any, list]] = {}
        first = self._launch(env_fns, n_actors, envs_per_actor, num_cpus_per_actor, placement_group, actor_options,
                             shm_kwargs, timeout, start_timeout, on_failure, max_restarts)
        self._last_obs: list[Any] = [None] * self.n_actors
        self._concat_obs = _concatenator(first["observation_space"], top_dict=collections.OrderedDict)
        self._act_space = first["action_space"]
        super().__init__(len(env_fns), first["observation_space"], first["action_space"])
        self.metadata = first["metadata"]

    # ---- SB3 VecEnv API -----------------------------------------------------------------------------------
    def seed(self, seed: int | Sequence[int | None] | np.random.SeedSequence | None = None) -> list[int | None]:
        """Sets the seeds of the next ``reset()``, in the forms ``ShmVecEnv.seed`` takes (an int
        ``s``: env i gets ``s + i``; one int per env; a ``numpy.random.SeedSequence``).  Seeds go
        to the envs, not to actors: the same seeds give the same episodes however the envs are
        split.
        """
        self._seeds, self._seed_arg = _seeds.per_env_seeds(seed, self.num_envs)
        return self._seeds

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        super().set_options(options)
        self._options_arg = options

    def describe(self) -> dict[str, Any]:
        """This vec env as plain, JSON-serializable data, from which :meth:`from_description` rebuilds it,
        on this cluster or another (as ``ShmVecEnv.describe``).

        Holds each env's factory, ``n_envs``, every constructor option (``n_actors``,
        ``envs_per_actor``, ``shm_kwargs``, ``on_failure``, ...) and the last ``seed()`` and
        ``set_options()`` arguments.  Placement given as ``n_actors`` or by default (one actor
        per node) carries over to another cluster; a ``placement_group`` is an object of this
        cluster and cannot be described: rebuild with ``from_description(d, placement_group=pg)``
        after describing a vec env built with ``n_actors``.

        :raises DescriptionError: a factory or an option (``placement_group``,
            ``actor_options`` holding objects) is not plain data; the message names which.
        """
        shm = self._config.get("shm_kwargs") or {}
        description = _describe.describe_vec_env(
            self._descriptions, self._config, n_envs=self.num_envs,
            n_workers=sum(info.get("n_workers", 0) for info in self.actor_info),
            start_method=shm.get("start_method", "forkserver"), seed=self._seed_arg, options=self._options_arg)
        description["vec_env"] = "shmvec.ray.RayShmVecEnv"
        return description

    @classmethod
    def from_description(cls, description: dict[str, Any], **overrides: Any) -> RayShmVecEnv:
        """Builds the vec env that :meth:`describe` described, on the cluster ``ray.init`` connected to.

        ``overrides`` replace constructor options (``n_actors``, ``num_cpus_per_actor``,
        ``placement_group``, ...), for a cluster of another shape.  The seeds and reset options
        of the description are set for the first ``reset()``.

        :raises DescriptionError: the description is not one of ours.
        """
        return _describe.rebuild(description, cls, **overrides)

    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds from ``seed()`` and options from ``set_options()`` (used once).

        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        :raises RayActorDiedError: an actor died.
        """
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError("reset() while a step is in flight: call step_wait() first")
        args = [(self._seeds[sl.start:sl.stop], self._options[sl.start:sl.stop]) for sl in self.slices]
        refs = [a.reset.remote(*a_args) for a, a_args in zip(self._actors, args)]
        results, failures = self._collect(refs, "reset", broken=True)
        if failures:
            if self.on_failure != "restart":
                self._raise_failures(failures, list(range(self.n_actors)), "reset", broken=True)
            for k, exc in failures.items():
                reason = self._reason(k, exc, "reset")
                obs, infos = self._restart_actor(k, reason, *args[k])
                results[k] = (obs, [dict(info, **{RESTART_INFO_KEY: reason}) for info in infos])
        self.reset_infos = [info for _, infos in results for info in infos]
        self._restarted = {}  # every env was reset just now
        self._reset_seeds()
        self._reset_options()
        self._last_obs = [obs for obs, _ in results]
        if self._unwarned:
            self._warn_restarts(broken=True)
        return self._concat_obs(self._last_obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Sends each actor its share of ``actions`` and starts its step (all actors at once).

        :raises ValueError: the actions do not fit the action space (shape, dtype).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError("step_async() called twice: call step_wait() before the next step_async()")
        policy = (self._config.get("shm_kwargs") or {}).get("invalid_actions", "raise")
        parts = _split_actions(self._act_space, actions, self.num_envs, self.slices, policy=policy)
        # An actor replaced during a rare call is not stepped: its envs' episodes end here.
        self._pending = [ray.put(None) if k in self._restarted else a.step.remote(p)
                         for k, (a, p) in enumerate(zip(self._actors, parts))]
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """Waits for every actor's step and returns (obs, rewards, dones, infos).

        :raises NoAsyncCallError: no step is in flight.
        :raises RayActorDiedError: an actor died; the original exception type if an env raised.
        """
        self._check_usable()
        if not self.waiting:
            raise NoAsyncCallError("step_wait() without a preceding step_async()")
        refs, self._pending = self._pending, []
        try:
            results, failures = self._collect(refs, "step", broken=True)
        finally:
            self.waiting = False
        if failures:
            if self.on_failure != "restart":
                self._raise_failures(failures, list(range(self.n_actors)), "step", broken=True)
            for k, exc in failures.items():
                results[k] = self._restarted_step(k, self._reason(k, exc, "step"), results)
        restarted, self._restarted = self._restarted, {}
        for k, (reason, obs, reset_infos) in restarted.items():
            results[k] = self._truncated(k, reason, obs, reset_infos, results)
        infos: list[dict[str, Any]] = []
        for sl, (_, _, dones, payload) in zip(self.slices, results):
            start = sl.start
            infos.extend({_PLAIN_INFO_KEY: False} for _ in sl)
            for i in np.flatnonzero(dones).tolist():
                self.reset_infos[start + i] = {}
            if payload:
                extra, resets = pickle.loads(payload) if isinstance(payload, bytes) else payload
                for i, info in extra:
                    infos[start + i] = info
                for i, info in resets:
                    self.reset_infos[start + i] = info
        self._last_obs = [r[0] for r in results]
        obs = self._concat_obs(self._last_obs)
        rewards = np.concatenate([r[1] for r in results])
        dones = np.concatenate([r[2] for r in results])
        if self._unwarned:
            self._warn_restarts(broken=True)
        return obs, rewards, dones, infos

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images."
            )
            return [None for _ in range(self.num_envs)]
        parts = self._broadcast("get_images", ())
        return [img for part in parts for img in part]

    def has_attr(self, attr_name: str) -> bool:
        return all(self._broadcast("has_attr", (attr_name,)))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._indexed_call("get_attr", indices, (attr_name,))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._indexed_call("set_attr", indices, (attr_name, value))

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return self._indexed_call("env_method", indices, (method_name, method_args, method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._indexed_call("env_is_wrapped", indices, (wrapper_class,))

    # ---- internals --------------------------------------------------------------------------------------

    # ---- restarts (on_failure="restart") ---------------------------------------------------------------

    def _restarted_step(self, k: int, reason: str, results: list) -> tuple:
        """The step result of actor k's envs after a restart: truncated episodes."""
        obs, reset_infos = self._restart_actor(k, reason)
        return self._truncated(k, reason, obs, reset_infos, results)

    def _truncated(self, k: int, reason: str, obs: Any, reset_infos: list, results: list) -> tuple:
        """Actor k's step result for envs that were replaced (new ones, reset): truncated episodes."""
        n = len(self.slices[k])
        last = self._last_obs[k] if self._last_obs[k] is not None else obs  # stepped before any reset
        extra = [(i, {_PLAIN_INFO_KEY: True, "terminal_observation": _take(last, i), RESTART_INFO_KEY: reason})
                 for i in range(n)]
        resets = [(i, info) for i, info in enumerate(reset_infos) if info]
        dtype = next((r[1].dtype for r in results if r is not None), np.dtype(np.float32))
        return obs, np.zeros(n, dtype=dtype), np.ones(n, dtype=bool), (extra, resets)


def row_infos(infos: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Gymnasium-style batched infos (arrays with ``_key`` masks) as one plain dict per row.

    ``env_id`` is left out; rebuilding with ``VectorEnv._add_info`` row by row gives the batch back.
    """
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id":
            continue
        mask = infos.get(f"_{key}")
        sub = row_infos(value, n) if isinstance(value, dict) else None
        plain_bool = sub is None and isinstance(value, np.ndarray) and value.dtype == np.bool_
        for k in range(n):
            if mask is None or mask[k]:
                # a bool goes back as bool: _add_info batches np.bool_ into an object array
                out[k][key] = sub[k] if sub is not None else bool(value[k]) if plain_bool else value[k]
    return out


def _where(hello: dict[str, Any], sl: range) -> dict[str, Any]:
    return {"node_id": hello["node_id"], "node_ip": hello["node_ip"], "pid": hello["pid"],
            "n_workers": hello["n_workers"], "env_indices": sl}


def _take(batch: Any, i: int) -> Any:
    """Env i's observation out of a batch (dicts and tuples of arrays included), as a copy."""
    if isinstance(batch, dict):
        return {key: _take(value, i) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_take(value, i) for value in batch)
    return np.array(batch[i])


def _engine_failed(exc: BaseException) -> bool:
    """Whether a call failed because the actor's own engine can go on no more (one of its worker
    processes died or hung, or an earlier failure broke it): replacing the actor repairs that."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    return isinstance(cause, (WorkerDiedError, WorkerTimeoutError, BrokenVecEnvError))


def _unwrap(exc: ray.exceptions.RayTaskError, hint: str) -> BaseException:
    """The exception an actor raised, as itself, with the actor's traceback as its cause."""
    cause = getattr(exc, "cause", None)
    if not isinstance(cause, BaseException):
        return ShmVecEnvError(f"{exc}\n{hint}")
    tb = cause.__dict__.pop("_shmvec_traceback", None)
    cause.__cause__ = RemoteTraceback(tb or str(exc))
    return cause


def _concatenator(space: spaces.Space, top_dict: type = dict) -> Callable[[list], Any]:
    """A function joining the actors' observations (in order) into one batch, per leaf of ``space``;
    a top-level ``Dict``'s batch is a ``top_dict`` (SB3's vec envs return an ``OrderedDict``)."""
    if isinstance(space, spaces.Dict):
        subs = {key: _concatenator(sub) for key, sub in space.spaces.items()}
        return lambda parts: top_dict((key, f([p[key] for p in parts])) for key, f in subs.items())
    if isinstance(space, spaces.Tuple):
        subs_t = [_concatenator(sub) for sub in space.spaces]
        return lambda parts: tuple(f([p[j] for p in parts]) for j, f in enumerate(subs_t))
    return np.concatenate


def _split_actions(space: spaces.Space, actions: Any, n_envs: int, slices: list[range], path: str = "",
                   policy: str = "ignore", keys: tuple = ()) -> list:
    """The actions of each actor's slice, per leaf of ``space``; checks shape and dtype once here."""
    if isinstance(space, spaces.Dict):
        per_key = {key: _split_actions(sub, actions[key], n_envs, slices, f"{path}[{key!r}]", policy, (*keys, key))
                   for key, sub in space.spaces.items()}
        return [{key: parts[k] for key, parts in per_key.items()} for k in range(len(slices))]
    if isinstance(space, spaces.Tuple):
        per_item = [_split_actions(sub, actions[j], n_envs, slices, f"{path}[{j}]", policy, (*keys, j))
                    for j, sub in enumerate(space.spaces)]
        return [tuple(parts[k] for parts in per_item) for k in range(len(slices))]
    arr = np.asarray(actions)
    shape = (n_envs, *(space.shape or ()))
    if arr.shape != shape:
        rows = rows_reshaped(arr, n_envs, tuple(space.shape or ()))
        if rows is None:  # a transposed batch, too: never reshaped into a mix of envs' actions
            raise ValueError(
                f"actions{path} have shape {arr.shape}; expected {shape} "
                f"(n_envs={n_envs} x the action space's {space.shape}; one row per env, first)"
            )
        arr = rows
    # Checked here, before any actor is sent anything, as a local ShmVecEnv checks: whole floats
    # and integers that fit are taken for an integer space; narrowing never wraps.
    dtype = space.dtype
    if dtype is not None and arr.dtype != dtype and (dtype.kind in "iu" or not np.can_cast(arr.dtype, dtype, "same_kind")):
        exact = exact_integers(arr, dtype)
        if exact is None:
            raise ValueError(f"actions{path} have dtype {arr.dtype}, which does not cast safely to {dtype} (floats or "
                             "other integers are accepted for an integer space only when every value is a whole "
                             "number that fits)")
        arr = exact
    check = leaf_check(space, keys, policy) if policy != "ignore" else None
    if check is not None:
        check(arr)  # InvalidActionError (global env indices) before any actor is sent anything
    return [arr[sl.start:sl.stop] for sl in slices]
