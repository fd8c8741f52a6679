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
actor (``terminal_observation`` included); the driver rebuilds the others
(:mod:`shmvec.ray.batching`).

The actors, their failures and their replacement are the :class:`~shmvec.ray.group.ActorGroup`'s;
this class holds one and puts SB3's API on it.  Its state (idle, a step posted, broken, closed)
is the group's, written down in :mod:`shmvec.ray.group`.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec._optional import missing

try:  # Ray and Stable-Baselines3: the extra shmvec[ray] (shmvec._optional)
    import ray
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ModuleNotFoundError as exc:
    raise missing("RayShmVecEnv", exc) from exc

from shmvec._copyguard import Uncopyable
from shmvec._describe import describe_env_fns, describe_vec_env, rebuild
from shmvec._errors import AlreadyPendingCallError, NoAsyncCallError
from shmvec._frontend import batch_rows
from shmvec._layout import group_by_slice
from shmvec._protocol import RESTART_INFO_KEY
from shmvec._seeds import per_env_seeds
from shmvec.factories import factory_list
from shmvec.ray.batching import PLAIN_INFO_KEY, concatenator, merge_step_infos, split_actions
from shmvec.ray.group import ActorGroup, GroupState

__all__ = ["RayShmVecEnv"]

# The "vec_env" of its descriptions: from_description takes no other, shmvec.rebuild names this class.
DESCRIBED_AS = "shmvec.ray.RayShmVecEnv"


class RayShmVecEnv(Uncopyable, VecEnv):
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

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    _group: ActorGroup | None = None
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
        max_restarts: int | None = 100,
    ) -> None:
        self._config = {k: v for k, v in locals().items() if k not in ("self", "env_fns", "__class__")}
        shm_kwargs = dict(shm_kwargs or {})
        # Views are safe here: Ray serializes a method's result as it returns, before the next
        # step can overwrite the buffers; the driver's concatenation makes arrays of its own.
        shm_kwargs.setdefault("copy", False)
        env_fns = factory_list(env_fns, type(self).__name__)
        self._descriptions = describe_env_fns(env_fns)
        self._seed_arg: Any = None
        self._options_arg: Any = None
        self._group = group = ActorGroup(
            env_fns, owner=type(self).__name__, n_actors=n_actors, envs_per_actor=envs_per_actor,
            num_cpus_per_actor=num_cpus_per_actor, placement_group=placement_group, actor_options=actor_options,
            shm_kwargs=shm_kwargs, timeout=timeout, start_timeout=start_timeout, on_failure=on_failure,
            max_restarts=max_restarts)
        first = group.hello
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.on_failure = on_failure
        self.max_restarts = max_restarts
        self._last_obs: list[Any] = [None] * group.n_actors
        self._concat_obs = concatenator(first["observation_space"], top_dict=collections.OrderedDict)
        self._act_space = first["action_space"]
        super().__init__(len(env_fns), first["observation_space"], first["action_space"])
        self.metadata = first["metadata"]

    # ---- the actors (the group's) ------------------------------------------------------------------------
    @property
    def slices(self) -> list[range]:
        """The envs of each actor, in order."""
        return self._group.slices

    @property
    def n_actors(self) -> int:
        return self._group.n_actors

    @property
    def actor_info(self) -> list[dict[str, Any]]:
        """Where each actor runs: ``node_id``, ``node_ip``, ``pid``, ``n_workers``, ``env_indices``."""
        return self._group.actor_info

    @property
    def restarts(self) -> int:
        """How many actors were replaced so far (``on_failure="restart"``)."""
        return self._group.restarts

    @property
    def closed(self) -> bool:
        return self._group is None or self._group.state is GroupState.CLOSED

    @property
    def waiting(self) -> bool:
        """Whether a step is in flight (``step_async`` without its ``step_wait``)."""
        return self._group is not None and self._group.state is GroupState.POSTED

    # ---- SB3 VecEnv API -----------------------------------------------------------------------------------
    def seed(self, seed: int | Sequence[int | None] | np.random.SeedSequence | None = None) -> list[int | None]:
        """Sets the seeds of the next ``reset()``, in the forms ``ShmVecEnv.seed`` takes (an int
        ``s``: env i gets ``s + i``; one int per env; a ``numpy.random.SeedSequence``).  Seeds go
        to the envs, not to actors: the same seeds give the same episodes however the envs are
        split.
        """
        self._seeds, self._seed_arg = per_env_seeds(seed, self.num_envs)
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
        description = describe_vec_env(
            self._descriptions, self._config, n_envs=self.num_envs,
            n_workers=sum(info.get("n_workers", 0) for info in self.actor_info),
            start_method=shm.get("start_method", "forkserver"), seed=self._seed_arg, options=self._options_arg,
            vec_env=DESCRIBED_AS)
        return description

    @classmethod
    def from_description(cls, description: dict[str, Any], **overrides: Any) -> RayShmVecEnv:
        """Builds the vec env that :meth:`describe` described, on the cluster ``ray.init`` connected to.

        ``overrides`` replace constructor options (``n_actors``, ``num_cpus_per_actor``,
        ``placement_group``, ...), for a cluster of another shape.  The seeds and reset options
        of the description are set for the first ``reset()``.

        :raises DescriptionError: the description is not one of ours.
        """
        return rebuild(description, cls, DESCRIBED_AS, **overrides)

    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds from ``seed()`` and options from ``set_options()`` (used once).

        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        :raises RayActorDiedError: an actor died.
        """
        group = self._group
        if group.check_usable() is GroupState.POSTED:
            raise AlreadyPendingCallError("reset() while a step is in flight: call step_wait() first")
        args = [(self._seeds[sl.start:sl.stop], self._options[sl.start:sl.stop]) for sl in group.slices]
        refs = [a.reset.remote(*a_args) for a, a_args in zip(group.actors, args)]
        results, failures = group.collect(refs, "reset", broken=True)
        if failures:
            if group.on_failure != "restart":
                group.raise_failures(failures, list(range(group.n_actors)), "reset", broken=True)
            for k, exc in failures.items():
                reason = group.reason(k, exc, "reset")
                obs, infos = group.restart_actor(k, reason, *args[k])
                results[k] = (obs, [dict(info, **{RESTART_INFO_KEY: reason}) for info in infos])
        self.reset_infos = [info for _, infos in results for info in infos]
        group.restarted = {}  # every env was reset just now
        self._reset_seeds()
        self._reset_options()
        self._last_obs = [obs for obs, _ in results]
        group.warn_restarts(broken=True)
        return self._concat_obs(self._last_obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Sends each actor its share of ``actions`` and starts its step (all actors at once).

        :raises ValueError: the actions do not fit the action space (shape, dtype).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        group = self._group
        if group.check_usable() is GroupState.POSTED:
            raise AlreadyPendingCallError("step_async() called twice: call step_wait() before the next step_async()")
        policy = (self._config.get("shm_kwargs") or {}).get("invalid_actions", "raise")
        parts = split_actions(self._act_space, actions, self.num_envs, group.slices, policy=policy)
        # An actor replaced during a rare call is not stepped: its envs' episodes end here.
        self._pending = [ray.put(None) if k in group.restarted else a.step.remote(p)
                         for k, (a, p) in enumerate(zip(group.actors, parts))]
        group.post()

    def step_wait(self) -> VecEnvStepReturn:
        """Waits for every actor's step and returns (obs, rewards, dones, infos).

        :raises NoAsyncCallError: no step is in flight.
        :raises RayActorDiedError: an actor died; the original exception type if an env raised.
        """
        group = self._group
        if group.check_usable() is not GroupState.POSTED:
            raise NoAsyncCallError("step_wait() without a preceding step_async()")
        refs, self._pending = self._pending, []
        try:
            results, failures = group.collect(refs, "step", broken=True)
        finally:
            group.collected()
        if failures:
            if group.on_failure != "restart":
                group.raise_failures(failures, list(range(group.n_actors)), "step", broken=True)
            for k, exc in failures.items():
                results[k] = self._restarted_step(k, group.reason(k, exc, "step"), results)
        restarted, group.restarted = group.restarted, {}
        for k, (reason, obs, reset_infos) in restarted.items():
            results[k] = self._truncated(k, reason, obs, reset_infos, results)
        infos = merge_step_infos(group.slices, results, self.reset_infos)
        self._last_obs = [r[0] for r in results]
        obs = self._concat_obs(self._last_obs)
        rewards = np.concatenate([r[1] for r in results])
        dones = np.concatenate([r[2] for r in results])
        group.warn_restarts(broken=True)
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

    def close(self) -> None:
        """Closes every actor's ShmVecEnv (after a step in flight, within a bound), then kills the actors.
        Idempotent, bounded in time.

        Actors that died or do not answer within the bound are killed all the same; their
        ShmVecEnv workers notice that their parent is gone and exit, and their shared memory
        was unlinked when they started, so nothing is left on any node.

        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        if self._group is None:
            return
        pending, self._pending = self._pending, []
        self._group.close(pending)

    def __del__(self) -> None:
        if not self.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass

    # ---- rare calls -------------------------------------------------------------------------------------
    def _broadcast(self, method: str, args: tuple) -> list[Any]:
        group = self._checked_idle(method)
        refs = [a.call.remote(method, None, args, {}) for a in group.actors]
        return group.gather(refs, method, broken=False)

    def _indexed_call(self, method: str, indices: VecEnvIndices, args: tuple) -> list[Any]:
        """Calls ``method`` on each actor holding some of ``indices`` with its local indices.

        Answers go back by position: an index given twice runs twice, negative ones count from
        the end (as DummyVecEnv and ShmVecEnv).
        """
        group = self._checked_idle(method)
        targets = list(self._get_indices(indices))
        groups = group_by_slice(targets, group.slices)
        by_actor = {k: [i - group.slices[k].start for i in idx] for k, (idx, _) in groups.items()}
        positions = {k: pos for k, (_, pos) in groups.items()}
        order = list(by_actor)
        refs = [group.actors[k].call.remote(method, by_actor[k], args, {}) for k in order]
        results = group.gather(refs, method, broken=False, actors=order)
        answers: list[Any] = [None] * len(targets)
        for k, values in zip(order, results):
            if values is None:  # set_attr
                continue
            for pos, value in zip(positions[k], values):
                answers[pos] = value
        return answers

    def _checked_idle(self, method: str) -> ActorGroup:
        group = self._group
        if group.check_usable() is GroupState.POSTED:
            raise AlreadyPendingCallError(f"{method}() while a step is in flight: call step_wait() first")
        return group

    # ---- restarts (on_failure="restart") ---------------------------------------------------------------
    def _restarted_step(self, k: int, reason: str, results: list) -> tuple:
        """The step result of actor k's envs after a restart: truncated episodes."""
        obs, reset_infos = self._group.restart_actor(k, reason)
        return self._truncated(k, reason, obs, reset_infos, results)

    def _truncated(self, k: int, reason: str, obs: Any, reset_infos: list, results: list) -> tuple:
        """Actor k's step result for envs that were replaced (new ones, reset): truncated episodes."""
        n = len(self._group.slices[k])
        last = self._last_obs[k] if self._last_obs[k] is not None else obs  # stepped before any reset
        extra = [(i, {PLAIN_INFO_KEY: True, "terminal_observation": batch_rows(last, i, copy=True),
                      RESTART_INFO_KEY: reason})
                 for i in range(n)]
        resets = [(i, info) for i, info in enumerate(reset_infos) if info]
        dtype = next((r[1].dtype for r in results if r is not None), np.dtype(np.float32))
        return obs, np.zeros(n, dtype=dtype), np.ones(n, dtype=bool), (extra, resets)
