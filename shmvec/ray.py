"""RayShmVecEnv: one SB3 ``VecEnv`` over the envs of several machines, through Ray actors.

``pip install shmvec[ray]``.  The envs are split into contiguous slices, one per Ray actor (one
actor per node by default, or one per bundle of a placement group); each actor runs a local
:class:`~shmvec.ShmVecEnv` over its slice.  Shared memory does the work inside a node; Ray moves
one batch per actor per step::

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
everything.  Only ``on_failure="raise"`` exists for now: the vec env is then broken, and the
caller closes it and builds a new one.
"""

from __future__ import annotations

import functools
import os
import pickle
import traceback
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

from shmvec._errors import (
    AlreadyPendingCallError,
    BrokenVecEnvError,
    ClosedVecEnvError,
    NoAsyncCallError,
    RemoteTraceback,
    ShmVecEnvError,
    SpaceError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from shmvec._layout import split_envs

__all__ = ["RayShmVecEnv", "RayActorDiedError"]

_BROKEN_HINT = "The vec env cannot go on: call close() and build a new one."
_CALL_HINT = "The vec env is still usable."
# Bounds of close(): each actor's own ShmVecEnv.close() (which itself waits up to 5 s per
# worker), then ray.kill.
_CLOSE_TIMEOUT_S = 15.0
# An info that says nothing beyond this is not sent; the driver rebuilds it.
_PLAIN_INFO_KEY = "TimeLimit.truncated"


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
    def start(self, env_fns_bytes: bytes, shm_kwargs: dict[str, Any]) -> dict[str, Any]:
        from shmvec.shm_vec_env import ShmVecEnv

        try:
            env_fns = cloudpickle.loads(env_fns_bytes)
        except ImportError as exc:
            raise ImportError(
                f"{exc}: the env factories refer to a module this node cannot import. Install it on every node, "
                "or ship it with ray.init(runtime_env={'py_modules': [...]} or {'working_dir': ...})."
            ) from exc
        self.venv = ShmVecEnv(env_fns, **shm_kwargs)
        ctx = ray.get_runtime_context()
        return {
            "observation_space": self.venv.observation_space,
            "action_space": self.venv.action_space,
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
        payload = pickle.dumps((extra, resets), protocol=5) if extra or resets else b""
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

    @_keeps_traceback
    def close(self) -> None:
        venv, self.venv = self.venv, None
        if venv is not None:
            venv.close()


class RayShmVecEnv(VecEnv):
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
    :param on_failure: what a dead actor does to the vec env; only ``"raise"`` (the default:
        raise :class:`RayActorDiedError`, then close and rebuild) is supported for now.

    :raises TypeError: an env factory is not callable or cannot be pickled.
    :raises SpaceError: the actors' envs have different spaces.
    :raises WorkerTimeoutError: the actors were not up within ``start_timeout``.
    :raises RayActorDiedError: an actor died while starting.
    """

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    closed = True
    waiting = False
    _broken: BaseException | None = None
    _actors: list = []
    _pending: list = []

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
    ) -> None:
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if n_envs == 0:
            raise ValueError("RayShmVecEnv needs at least one env factory")
        for i, fn in enumerate(env_fns):
            if isinstance(fn, gym.Env) or not callable(fn):
                raise TypeError(
                    f"env_fns[{i}] is {type(fn).__name__}, not a callable: pass functions that each build a new env."
                )
        if on_failure != "raise":
            raise ValueError(
                f"on_failure={on_failure!r}: RayShmVecEnv supports only 'raise' for now (a dead actor raises "
                "RayActorDiedError; close() and build a new vec env)"
            )
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive or None, got {timeout}")
        shm_kwargs = dict(shm_kwargs or {})
        shm_kwargs.setdefault("start_method", "forkserver")
        # Views are safe here: Ray serializes a method's result as it returns, before the next
        # step can overwrite the buffers; the driver's concatenation makes arrays of its own.
        shm_kwargs.setdefault("copy", False)
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
        self._call_timeout = timeout

        from shmvec.shm_vec_env import ShmVecEnv

        payloads = [ShmVecEnv._pickle_factories(env_fns, sl) for sl in self.slices]
        remote_cls = ray.remote(_ShmVecActor)
        options = dict(actor_options or {})
        options.setdefault("max_restarts", 0)
        self.closed = False
        self._actors = []
        self.actor_info: list[dict[str, Any]] = [{} for _ in range(n_actors)]
        try:
            for k, sl in enumerate(self.slices):
                opts = dict(options, num_cpus=cpus[k], scheduling_strategy=strategies[k])
                self._actors.append(remote_cls.options(**opts).remote())
            starts_refs = []
            for k, sl in enumerate(self.slices):
                kwargs = dict(shm_kwargs)
                kwargs.setdefault("n_workers", max(1, min(len(sl), int(cpus[k]) or 1)))
                starts_refs.append(self._actors[k].start.remote(payloads[k], kwargs))
            self._call_timeout = start_timeout
            hellos = self._gather(starts_refs, "start", broken=True)
            self._call_timeout = timeout
        except BaseException:
            self.close_quietly()
            raise
        self.actor_info = [
            {"node_id": h["node_id"], "node_ip": h["node_ip"], "pid": h["pid"], "n_workers": h["n_workers"],
             "env_indices": sl}
            for h, sl in zip(hellos, self.slices)
        ]
        first = hellos[0]
        for k, h in enumerate(hellos[1:], start=1):
            for name in ("observation_space", "action_space"):
                if h[name] != first[name]:
                    self.close_quietly()
                    raise SpaceError(
                        f"env {self.slices[k].start} (actor {k}) has {name} {h[name]}, env 0 has {first[name]}: "
                        "all envs of a vec env must share their spaces."
                    )
        self._concat_obs = _concatenator(first["observation_space"])
        self._act_space = first["action_space"]
        super().__init__(n_envs, first["observation_space"], first["action_space"])
        self.metadata = first["metadata"]

    # ---- placement -------------------------------------------------------------------------------------
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

    # ---- SB3 VecEnv API -----------------------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds from ``seed()`` and options from ``set_options()`` (used once).

        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        :raises RayActorDiedError: an actor died.
        """
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError("reset() while a step is in flight: call step_wait() first")
        refs = [a.reset.remote(self._seeds[sl.start:sl.stop], self._options[sl.start:sl.stop])
                for a, sl in zip(self._actors, self.slices)]
        results = self._gather(refs, "reset", broken=True)
        self.reset_infos = [info for _, infos in results for info in infos]
        self._reset_seeds()
        self._reset_options()
        return self._concat_obs([obs for obs, _ in results])

    def step_async(self, actions: np.ndarray) -> None:
        """Sends each actor its share of ``actions`` and starts its step (all actors at once).

        :raises ValueError: the actions do not fit the action space (shape, dtype).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError("step_async() called twice: call step_wait() before the next step_async()")
        parts = _split_actions(self._act_space, actions, self.num_envs, self.slices)
        self._pending = [a.step.remote(p) for a, p in zip(self._actors, parts)]
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
            results = self._gather(refs, "step", broken=True)
        finally:
            self.waiting = False
        infos: list[dict[str, Any]] = []
        for sl, (_, _, dones, payload) in zip(self.slices, results):
            start = sl.start
            infos.extend({_PLAIN_INFO_KEY: False} for _ in sl)
            for i in np.flatnonzero(dones).tolist():
                self.reset_infos[start + i] = {}
            if payload:
                extra, resets = pickle.loads(payload)
                for i, info in extra:
                    infos[start + i] = info
                for i, info in resets:
                    self.reset_infos[start + i] = info
        obs = self._concat_obs([r[0] for r in results])
        rewards = np.concatenate([r[1] for r in results])
        dones = np.concatenate([r[2] for r in results])
        return obs, rewards, dones, infos

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
        error: BaseException | None = None
        try:
            if pending:  # let a step in flight finish before closing
                ray.wait(pending, num_returns=len(pending), timeout=_CLOSE_TIMEOUT_S)
            refs = [a.close.remote() for a in actors]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_CLOSE_TIMEOUT_S)
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
            raise error

    def close_quietly(self) -> None:
        """``close()``, ignoring errors (for clean-up paths)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

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
    def _check_usable(self) -> None:
        if self.closed:
            raise ClosedVecEnvError("this RayShmVecEnv is closed; build a new one")
        if self._broken is not None:
            raise BrokenVecEnvError(
                f"an earlier failure ({type(self._broken).__name__}: {self._broken}) left this RayShmVecEnv unusable; "
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
        by_actor: dict[int, list[int]] = {}
        positions: dict[int, list[int]] = {}
        for pos, i in enumerate(targets):
            if not -self.num_envs <= i < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
            i %= self.num_envs
            k = self._actor_of(i)
            by_actor.setdefault(k, []).append(i - self.slices[k].start)
            positions.setdefault(k, []).append(pos)
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

    def _actor_of(self, i: int) -> int:
        for k, sl in enumerate(self.slices):
            if i < sl.stop:
                return k
        raise IndexError(i)  # pragma: no cover - checked by the caller

    def _gather(self, refs: list, command: str, broken: bool, actors: list[int] | None = None) -> list[Any]:
        """ray.get of one result per actor, turning Ray's failures into shmvec's errors.

        ``broken``: a failure leaves the actors in different states (some stepped, some not),
        so the vec env cannot go on.
        """
        actors = list(range(len(refs))) if actors is None else actors
        try:
            return ray.get(refs, timeout=self._call_timeout)
        except BaseException as exc:
            err = self._failure(refs, actors, command, exc, broken)
            if broken or isinstance(err, (RayActorDiedError, WorkerTimeoutError)):
                self._broken = err
            if err is exc:
                raise
            if err.__cause__ is None:
                err.__suppress_context__ = True  # Ray's exception says nothing more than ours
            raise err

    def _failure(self, refs: list, actors: list[int], command: str, exc: BaseException,
                 broken: bool) -> BaseException:
        hint = _BROKEN_HINT if broken else _CALL_HINT
        if isinstance(exc, ray.exceptions.GetTimeoutError):
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            late = [k for k, ref in zip(actors, refs) if ref not in ready]
            envs = ", ".join(f"{self.slices[k].start}..{self.slices[k].stop - 1}" for k in late)
            return WorkerTimeoutError(
                f"{command}: actors {late} (envs {envs}) did not answer within {self._call_timeout:g} s. "
                "An env may hang, or the cluster lacks the resources to place them (see `ray status`); "
                "call close() (it kills them) and build a new vec env."
            )
        if not isinstance(exc, ray.exceptions.RayError):
            return exc  # KeyboardInterrupt and the like: the actors' state is unknown
        # Find which actors failed: a dead one first (it says most), else the first env error.
        dead: list[tuple[int, BaseException]] = []
        first_error: BaseException | None = None
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for k, ref in zip(actors, refs):
            if ref not in ready:
                continue
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError as e:
                dead.append((k, e))
            except ray.exceptions.RayTaskError as e:
                first_error = first_error or self._located(_unwrap(e, hint), k)
            except ray.exceptions.RayError as e:
                first_error = first_error or e
        if dead:
            return self._died(dead, command)
        if first_error is not None:
            return first_error
        if isinstance(exc, ray.exceptions.RayActorError):  # pragma: no cover - not ready a moment ago
            return self._died([(actors[0], exc)], command)
        return exc

    def _located(self, exc: BaseException, k: int) -> BaseException:
        sl, info = self.slices[k], self.actor_info[k]
        where = f" on node {info['node_ip']} ({info['node_id'][:12]}...)" if info else ""
        exc.add_note(
            f"shmvec.ray: raised in actor {k}{where}, which holds envs {sl.start}..{sl.stop - 1}: "
            f"its local env j is env {sl.start} + j of this RayShmVecEnv."
        )
        return exc

    def _died(self, dead: list[tuple[int, BaseException]], command: str) -> RayActorDiedError:
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
            "killed with ray.kill. " + _BROKEN_HINT,
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


def _unwrap(exc: ray.exceptions.RayTaskError, hint: str) -> BaseException:
    """The exception an actor raised, as itself, with the actor's traceback as its cause."""
    cause = getattr(exc, "cause", None)
    if not isinstance(cause, BaseException):
        return ShmVecEnvError(f"{exc}\n{hint}")
    tb = cause.__dict__.pop("_shmvec_traceback", None)
    cause.__cause__ = RemoteTraceback(tb or str(exc))
    return cause


def _concatenator(space: spaces.Space) -> Callable[[list], Any]:
    """A function joining the actors' observations (in order) into one batch, per leaf of ``space``."""
    if isinstance(space, spaces.Dict):
        subs = {key: _concatenator(sub) for key, sub in space.spaces.items()}
        return lambda parts: {key: f([p[key] for p in parts]) for key, f in subs.items()}
    if isinstance(space, spaces.Tuple):
        subs_t = [_concatenator(sub) for sub in space.spaces]
        return lambda parts: tuple(f([p[j] for p in parts]) for j, f in enumerate(subs_t))
    return np.concatenate


def _split_actions(space: spaces.Space, actions: Any, n_envs: int, slices: list[range], path: str = "") -> list:
    """The actions of each actor's slice, per leaf of ``space``; checks shape and dtype once here."""
    if isinstance(space, spaces.Dict):
        per_key = {key: _split_actions(sub, actions[key], n_envs, slices, f"{path}[{key!r}]")
                   for key, sub in space.spaces.items()}
        return [{key: parts[k] for key, parts in per_key.items()} for k in range(len(slices))]
    if isinstance(space, spaces.Tuple):
        per_item = [_split_actions(sub, actions[j], n_envs, slices, f"{path}[{j}]")
                    for j, sub in enumerate(space.spaces)]
        return [tuple(parts[k] for parts in per_item) for k in range(len(slices))]
    arr = np.asarray(actions)
    shape = (n_envs, *(space.shape or ()))
    if arr.shape != shape:
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(
                f"actions{path} have shape {arr.shape}; expected {shape} "
                f"(n_envs={n_envs} x the action space's {space.shape})"
            )
        arr = arr.reshape(shape)
    if space.dtype is not None and arr.dtype != space.dtype and not np.can_cast(arr.dtype, space.dtype, "same_kind"):
        raise ValueError(f"actions{path} have dtype {arr.dtype}, which does not cast safely to {space.dtype}")
    return [arr[sl.start:sl.stop] for sl in slices]
