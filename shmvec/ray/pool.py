"""RayShmEnvPool: the asynchronous pool (:class:`~shmvec.env_pool.ShmEnvPool`) over Ray actors.

Install with ``pip install -c constraints.txt -e ".[ray]"`` in the checkout. The envs are split
into contiguous slices, one per Ray actor, as for :class:`~shmvec.ray.vec_env.RayShmVecEnv`; each actor
runs a local ShmEnvPool over its slice with its own batch size (``actor_batch_size``, default: its
whole slice). The driver hands out whichever actors' batches arrive first, so a slow node does not
hold back the others::

    pool = RayShmEnvPool(env_fns, batch_size=64, n_actors=4)   # 256 envs, 64 per recv
    obs, infos = pool.reset(seed=0)
    while True:
        pool.send(policy(obs), infos["env_id"])
        obs, rew, term, trunc, infos = pool.recv()

Protocol (who sends what, in which order)
-----------------------------------------
Env ``i`` lives in actor ``k`` (``slices[k]``) as its local env ``i - slices[k].start``;
``infos["env_id"]`` are global ids (the actor's offset plus its local id).

- ``send(actions, env_ids)`` checks ids and actions once, here, groups the rows by actor and
  makes one call per actor touched: ``pool_send(actions, local ids, recv)``.  The actor
  pushes them into its ShmEnvPool; with ``recv`` it then waits for its next local batch and
  returns it.  ``recv`` is asked for when the actor has no batch call outstanding and at
  least its batch size of envs in flight (the driver counts them); otherwise the actions are
  only delivered, and a later ``pool_recv`` collects them.  So each actor has at most one
  batch call outstanding, and calls to one actor run in the order sent (Ray runs one
  caller's calls to an actor in order): a send queued behind an outstanding batch call
  reaches the envs when that call returns.
- ``recv()`` takes rows from the batches already arrived (kept in arrival order); while
  fewer than ``batch_size`` are there it ``ray.wait``\\ s for the next outstanding batch call,
  of any actor.  When one arrives and its actor still has a batch's worth of envs in flight,
  the next ``pool_recv`` is launched at once.  Rows come back in arrival order (actor batch by
  actor batch); rows that do not fit in this ``recv`` stay for the next one.
- Only infos that hold something travel (one pickled list of ``(row, info)`` per batch); the
  driver rebuilds Gymnasium's batched infos with ``VectorEnv._add_info``, as ShmEnvPool does.
- ``reset``/rare calls (``call``, ``get_attr``, ``set_attr``, ``render``) go to every actor;
  each queues behind that actor's outstanding batch call, whose result is kept.

``recv`` refuses to wait forever: if the rows arrived plus what the actors can still return
(per actor, whole local batches of its envs in flight) are fewer than ``batch_size``, it
raises ``ShmVecEnvError`` at once.  Choose ``batch_size`` as a multiple of the actors'
batch sizes (e.g. whole actors) and send every row you receive, and this never happens.

Failures
--------
A dead actor (its process, or its node) raises :class:`~shmvec.ray.failures.RayActorDiedError` naming
the actor, its node and its envs, from the ``recv`` (or rare call) that finds it; an env's
exception arrives as its own type with the worker's traceback, noted with the actor and envs
it ran in; no batch within ``timeout`` raises ``WorkerTimeoutError`` naming the actors waited
for.  Each of these leaves the pool broken (``BrokenVecEnvError`` afterwards); ``close()``
still releases everything, on every node.  Restarting failed actors (``on_failure="restart"``
of RayShmVecEnv) is not offered in pool mode: failures of single workers inside an actor can be
handled by its ShmEnvPool's own options (``shm_kwargs``).

The actors, their failures and the pool's state (running once reset, broken, closed) are the
:class:`~shmvec.ray.group.ActorGroup`'s, written down in :mod:`shmvec.ray.group`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import ray.exceptions
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from shmvec._copyguard import Uncopyable
from shmvec._errors import InvalidActionError, ShmVecEnvError
from shmvec._frontend import InfoBatch, batch_rows, by_env_id, checked_send_ids
from shmvec._seeds import gym_vector_seeds, per_env_values
from shmvec.factories import factory_list
from shmvec.ray.batching import concatenator, split_actions, unpack_pool_rows
from shmvec.ray.failures import RayActorDiedError
from shmvec.ray.group import ActorGroup, GroupState
from shmvec.vec_env_pool import ShmVecEnvPool

__all__ = ["RayShmEnvPool", "RayShmVecEnvPool", "RayActorDiedError"]


class RayShmEnvPool(Uncopyable):
    """An asynchronous pool of envs spread over Ray actors, each running a local ShmEnvPool.

    Same API as :class:`~shmvec.env_pool.ShmEnvPool` (``reset``/``async_reset``, ``send``,
    ``recv``, ``step``, ``call``, ``get_attr``, ``set_attr``, ``render``, ``close``), with
    global env ids in ``infos["env_id"]``.  Call ``ray.init(...)`` first.

    :param env_fns: callables that each build a new ``gymnasium.Env`` (sent to the actors: the
        modules they use must be importable there).
    :param batch_size: rows per ``recv`` (default: all envs, synchronous).
    :param n_actors, envs_per_actor, num_cpus_per_actor, placement_group, actor_options,
        timeout, start_timeout: placement and limits, as for :class:`~shmvec.ray.vec_env.RayShmVecEnv`.
    :param actor_batch_size: the batch size of each actor's ShmEnvPool (default: its whole
        slice, so each actor answers once all its envs stepped; smaller lets an actor's
        faster envs come back first).  Capped at each actor's number of envs.
    :param autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default) or ``SAME_STEP``, as ShmEnvPool.
    :param shm_kwargs: more keyword arguments of each actor's ShmEnvPool (``n_workers``,
        ``start_method``, ``info_bytes``, ``timeout``, ...).  ``"fork"`` is refused.

    :raises ValueError: bad ``batch_size``/``actor_batch_size``, or placement arguments.
    :raises WorkerTimeoutError, RayActorDiedError: the actors did not start.
    """

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    _group: ActorGroup | None = None
    _recv_refs: list = []
    _sends: list = []
    # As RayShmVecEnv's attributes of the same names: actors are never restarted in pool mode.
    on_failure = "raise"
    max_restarts = None
    restarts = 0

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        batch_size: int | None = None,
        n_actors: int | None = None,
        *,
        actor_batch_size: int | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        envs_per_actor: Sequence[int] | None = None,
        num_cpus_per_actor: float = 1,
        placement_group: Any = None,
        actor_options: dict[str, Any] | None = None,
        shm_kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        start_timeout: float | None = 120.0,
    ) -> None:
        env_fns = factory_list(env_fns, type(self).__name__, batch_size)
        mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"RayShmEnvPool supports NEXT_STEP and SAME_STEP autoreset, not {mode}")
        batch_size = len(env_fns) if batch_size is None else int(batch_size)
        if not 1 <= batch_size <= max(1, len(env_fns)):
            raise ValueError(f"batch_size must be in [1, {len(env_fns)}] for {len(env_fns)} envs, got {batch_size}")
        if actor_batch_size is not None and actor_batch_size < 1:
            raise ValueError(f"actor_batch_size must be at least 1, got {actor_batch_size}")
        self.batch_size = batch_size
        self.autoreset_mode = mode
        self._invalid_actions = (shm_kwargs or {}).get("invalid_actions", "raise")  # checked in send()

        def pool_kwargs(slices: list[range]) -> list[dict[str, Any]]:
            sizes = [len(sl) if actor_batch_size is None else min(actor_batch_size, len(sl)) for sl in slices]
            self.actor_batch_sizes = sizes
            return [{"batch_size": b, "autoreset_mode": mode.value} for b in sizes]

        self._group = group = ActorGroup(
            env_fns, owner=type(self).__name__, n_actors=n_actors, envs_per_actor=envs_per_actor,
            num_cpus_per_actor=num_cpus_per_actor, placement_group=placement_group, actor_options=actor_options,
            shm_kwargs=shm_kwargs, timeout=timeout, start_timeout=start_timeout, on_failure="raise",
            max_restarts=None, pool_kwargs=pool_kwargs)
        first = group.hello
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.num_envs = len(env_fns)
        self.single_observation_space = first["observation_space"]
        self.single_action_space = first["action_space"]
        self.observation_space = batch_space(self.single_observation_space, batch_size)
        self.action_space = batch_space(self.single_action_space, batch_size)
        self.metadata = dict(first["metadata"])
        self.metadata["autoreset_mode"] = mode
        self.render_mode = first["render_mode"]
        self._concat_obs = concatenator(self.single_observation_space)
        self._in_flight = np.zeros(self.num_envs, dtype=np.bool_)  # sent, not yet returned by recv()
        self._actor_in_flight = [0] * group.n_actors  # sent to actor k, not yet in a batch of its
        self._recv_refs = [None] * group.n_actors  # actor k's outstanding batch call
        self._sends = []  # (actor, ref) of calls that only delivered actions
        self._arrived: list[dict[str, Any]] = []  # batches arrived, rows not yet returned
        self._infos = InfoBatch(batch_size)

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
    def closed(self) -> bool:
        return self._group is None or self._group.state is GroupState.CLOSED

    def _check_usable(self) -> None:
        """Raises if the pool is closed or broken (``ShmVecEnvPool`` asks before each of its calls)."""
        self._group.check_usable()

    # ---- the pool ---------------------------------------------------------------------------------------
    def async_reset(self, seed: int | list[int | None] | None = None,
                    options: dict[str, Any] | list[dict[str, Any] | None] | None = None) -> None:
        """Resets every env (all in flight afterwards); ``recv`` returns them ``batch_size`` at a time.

        Whatever was in flight or waiting to be received is dropped.

        :param seed: None, an int (env i gets ``seed + i``), or one seed (or None) per env.
        :param options: passed to every env's ``reset``; or a list of one dict (or None) per env.
        """
        group = self._group
        group.check_usable()
        seeds = gym_vector_seeds(seed, self.num_envs)
        per_env_values(options, self.num_envs, "options")  # checked before anything is sent
        # Each reset queues behind its actor's outstanding calls; their results are dropped.
        self._arrived = []
        self._sends = []
        self._recv_refs = [a.pool_reset.remote(seeds[sl.start:sl.stop], list(options[sl.start:sl.stop])
                                               if isinstance(options, (list, tuple)) else options)
                           for a, sl in zip(group.actors, group.slices)]
        self._actor_in_flight = [len(sl) for sl in group.slices]
        self._in_flight[:] = True
        group.started()

    def reset(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """``async_reset`` then ``recv``: the first ``batch_size`` envs (their reset observations and infos)."""
        self.async_reset(seed=seed, options=options)
        obs, _, _, _, infos = self.recv()
        return obs, infos

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Starts stepping env ``env_ids[k]`` with ``actions[k]``, in the actors that hold them; returns at once.

        :param env_ids: distinct global env ids, none of them in flight (default: all envs, then
            ``actions`` has ``num_envs`` rows).
        :raises ValueError: bad ids (out of range, repeated, already in flight) or actions.
        """
        group = self._group
        if group.check_usable() is not GroupState.RUNNING:
            raise ShmVecEnvError("send() before reset(): call reset() or async_reset() first")
        ids = checked_send_ids(env_ids, self.num_envs, self._in_flight)
        try:  # checked here, before anything is sent (the actor's own check would break the pool)
            (actions_rows,) = split_actions(self.single_action_space, actions, ids.size, [range(ids.size)],
                                            policy=self._invalid_actions)
        except InvalidActionError as exc:
            raise by_env_id(exc, ids) from None
        starts = np.array([sl.start for sl in group.slices])
        owner = np.searchsorted(starts, ids, side="right") - 1
        self._in_flight[ids] = True
        for k in np.unique(owner).tolist():
            pos = np.flatnonzero(owner == k)
            self._actor_in_flight[k] += pos.size
            recv = self._recv_refs[k] is None and self._actor_in_flight[k] >= self.actor_batch_sizes[k]
            ref = group.actors[k].pool_send.remote(batch_rows(actions_rows, pos), ids[pos] - starts[k], recv)
            if recv:
                self._recv_refs[k] = ref
            else:
                self._sends.append((k, ref))

    def _recv_held(self):  # as ShmEnvPool's: the batch is the driver's once recv() returns
        return self.recv()

    def _release_received(self) -> None:
        pass

    def recv(self):
        """Waits until ``batch_size`` envs finished; returns (obs, rewards, terminated, truncated, infos).

        :raises ShmVecEnvError: the envs in flight cannot make up ``batch_size`` rows (it would
            wait forever): send actions first.
        :raises RayActorDiedError: an actor died; the env's own exception if an env raised;
            ``WorkerTimeoutError``: no batch arrived within ``timeout``.
        """
        if self._group.check_usable() is not GroupState.RUNNING:
            raise ShmVecEnvError("recv() before reset(): call reset() or async_reset() first")
        n = self.batch_size
        self._check_sends()
        while sum(len(b["ids"]) for b in self._arrived) < n:
            obtainable = sum(len(b["ids"]) for b in self._arrived) + sum(
                (c // b) * b for c, b in zip(self._actor_in_flight, self.actor_batch_sizes))
            if obtainable < n:
                raise ShmVecEnvError(
                    f"recv() with too few envs in flight for batch_size={n}: the actors can return {obtainable} rows "
                    f"(whole batches of actor_batch_sizes={self.actor_batch_sizes}); send() actions first"
                )
            self._wait_batches()
        return self._take(n)

    def step(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None):
        """``send`` then ``recv``."""
        self.send(actions, env_ids)
        return self.recv()

    # ---- rare calls (each queues behind its actor's outstanding batch; the batch is kept) ----------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or returns the attribute if it is not callable)."""
        return self._each("call", lambda k: ((name, *args), kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """One value per env (a list or tuple of ``num_envs``), or the same value for all."""
        values = per_env_values(values, self.num_envs)
        slices = self.slices
        self._each("set_attr", lambda k: ((name, values[slices[k].start:slices[k].stop]), {}))

    def render(self) -> tuple[Any, ...]:
        return self._each("render", lambda k: ((), {}))

    batch_infos = True

    def set_batch_infos(self, on: bool) -> None:
        """As :meth:`ShmEnvPool.set_batch_infos`, in every actor's pool."""
        group = self._group
        group.check_usable()
        self.batch_infos = bool(on)
        group.gather([a.pool_call.remote("set_batch_infos", (bool(on),), {}) for a in group.actors],
                     "set_batch_infos", broken=False)

    def _paused_call(self, name: str, args: tuple, indices: list[int] | None = None) -> tuple[Any, ...]:
        """One of ShmEnvPool's raw commands (``is_wrapped``, ...) on envs ``indices`` (global), in order."""
        n = self.num_envs
        if indices is not None:
            for i in indices:
                if not -n <= int(i) < n:
                    raise IndexError(f"env index {i} out of range for {n} envs")
        targets = list(range(n)) if indices is None else [int(i) % n for i in indices]
        # Only the envs asked for (a set_attr or env_method must not touch the others): each actor
        # gets its own envs' local indices, in order, and the answers come back in that order.
        slices = self.slices
        starts = [sl.start for sl in slices]
        local: list[list[int]] = [[] for _ in slices]
        where = []
        for i in targets:
            k = int(np.searchsorted(starts, i, side="right")) - 1
            where.append((k, len(local[k])))
            local[k].append(i - starts[k])
        answers = self._each("_paused_call", lambda k: ((name, args, local[k]), {}))
        offsets = np.cumsum([0] + [len(x) for x in local[:-1]]).tolist()
        return tuple(answers[offsets[k] + j] for k, j in where)

    def close(self) -> None:
        """Closes every actor's ShmEnvPool (after its outstanding batch, within a bound), then kills the actors."""
        if self.closed:
            return
        pending = [r for r in self._recv_refs if r is not None] + [r for _, r in self._sends]
        self._recv_refs = [None] * len(self._recv_refs)
        self._sends = []
        self._arrived = []
        self._group.close(pending)

    def __enter__(self) -> RayShmEnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not self.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass

    # ---- internals --------------------------------------------------------------------------------------
    def _each(self, method: str, args_of: Callable[[int], tuple[tuple, dict]]) -> tuple[Any, ...]:
        """``method`` of every actor's ShmEnvPool; their answers (one per env) joined in env order."""
        group = self._group
        group.check_usable()
        refs = [a.pool_call.remote(method, *args_of(k)) for k, a in enumerate(group.actors)]
        parts = group.gather(refs, method, broken=False)
        if method == "set_attr":
            return ()
        return tuple(v for part in parts for v in part)

    def _check_sends(self) -> None:
        """Raises the failure of a call that only delivered actions, if one failed already."""
        if not self._sends:
            return
        refs = [r for _, r in self._sends]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(ready)
        for k, ref in self._sends:
            if ref in done:
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayError as exc:
                    self._group.raise_failures({0: exc}, [k], "pool send", broken=True)
        self._sends = [(k, r) for k, r in self._sends if r not in done]

    def _wait_batches(self) -> None:
        """Waits for at least one outstanding batch call; stores every batch arrived by then."""
        group = self._group
        outstanding = {ref: k for k, ref in enumerate(self._recv_refs) if ref is not None}
        refs = list(outstanding)
        t0 = time.monotonic()
        try:
            ready, _ = ray.wait(refs, num_returns=1, timeout=group.timeout)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        except BaseException as exc:  # interrupted: nothing was taken, the pool can be waited on again
            if not isinstance(exc, KeyboardInterrupt):
                group.fail(exc)
            raise
        if not ready:
            late = sorted(outstanding.values())
            group.raise_failures({p: ray.exceptions.GetTimeoutError(f"no batch within {time.monotonic() - t0:.1f} s")
                                  for p in range(len(late))}, late, "pool recv", broken=True)
        for ref in ready:
            k = outstanding[ref]
            self._recv_refs[k] = None
            try:
                ids, obs, rewards, terminated, truncated, payload = ray.get(ref, timeout=0)
            except ray.exceptions.RayError as exc:
                group.raise_failures({0: exc}, [k], "pool recv", broken=True)
            start = group.slices[k].start
            infos, raw = unpack_pool_rows(payload, len(ids))
            self._arrived.append({"ids": np.asarray(ids, dtype=np.int64) + start, "obs": obs, "rew": rewards,
                                  "term": terminated, "trunc": truncated, "infos": infos, "raw": raw})
            self._actor_in_flight[k] -= len(ids)
            if self._actor_in_flight[k] >= self.actor_batch_sizes[k]:
                self._recv_refs[k] = group.actors[k].pool_recv.remote()

    def _take(self, n: int):
        """The first ``n`` rows arrived, as one Gymnasium-style batch."""
        parts, taken = [], 0
        while taken < n:
            batch = self._arrived[0]
            m = min(n - taken, len(batch["ids"]))
            if m == len(batch["ids"]):
                parts.append(self._arrived.pop(0))
            else:
                parts.append(batch_rows(batch, slice(None, m)))
                self._arrived[0] = batch_rows(batch, slice(m, None))
            taken += m
        ids = np.concatenate([p["ids"] for p in parts])
        self._in_flight[ids] = False
        obs = self._concat_obs([p["obs"] for p in parts])
        rewards = np.concatenate([p["rew"] for p in parts])
        terminated = np.concatenate([p["term"] for p in parts])
        truncated = np.concatenate([p["trunc"] for p in parts])
        infos: dict[str, Any] = {}
        add = self._infos._add_info
        row = 0
        for p in parts:
            for info in p["infos"]:
                if info:
                    infos = add(infos, info, row)
                row += 1
        infos["env_id"] = ids
        self.row_infos = [own for p in parts for own in p["raw"]]
        return obs, rewards, terminated, truncated, infos


class RayShmVecEnvPool(ShmVecEnvPool):
    """:class:`~shmvec.vec_env_pool.ShmVecEnvPool` (SB3's ``VecEnv`` API, with ``PoolReplayBuffer``)
    over a :class:`RayShmEnvPool`: ``batch_size`` rows per step, from whichever actors are ready.

    :param env_fns: callables that each build a new ``gymnasium.Env``.
    :param batch_size: rows per step (default: all envs, synchronous).
    :param kwargs: as for :class:`RayShmEnvPool` (``n_actors``, ``actor_batch_size``, ``shm_kwargs``, ...).
    """

    _pool_cls = RayShmEnvPool

    def decided(self) -> dict[str, Any]:
        """Not here: each actor's vec env decides for its own node (``actor_info`` says where they run)."""
        raise NotImplementedError(f"{type(self).__name__}.decided(): each Ray actor's vec env decides its defaults "
                                  "on its own node; actor_info says where the actors run")
