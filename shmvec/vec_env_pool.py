"""ShmVecEnvPool: the asynchronous pool behind Stable-Baselines3's ``VecEnv`` API, and its replay buffer.

SB3 sees a ``VecEnv`` of ``batch_size`` envs; behind it run ``num_envs`` envs.  ``step_async``
sends the actions to the envs of the rows ``step_wait`` (or ``reset``) last returned, and
``step_wait`` returns the next ``batch_size`` envs that finished, whichever they are (rows sorted
by env index; ``infos[k]["env_id"]`` names each).

Which SB3 algorithms can use it
-------------------------------
SB3 pairs row k of a step's result with row k of the observation the action was chosen from.
With ``batch_size < num_envs`` the env in row k changes from step to step, so:

- **Off-policy algorithms with a replay buffer (SAC, TD3, DDPG, DQN; Box or Discrete actions,
  array observations) work when given** ``replay_buffer_class=PoolReplayBuffer``: each info
  carries the observation and the action of its env's transition (``"pool_obs"``,
  ``"pool_action"``), and the buffer stores those instead of SB3's row-wise pairing.
  Without it they would learn from transitions stitched together from different envs.
- **On-policy algorithms (PPO, A2C)** need every env on every step (GAE runs along each row of
  the rollout): use them only with ``batch_size == num_envs``, where the pool is synchronous
  and equals ``DummyVecEnv`` step for step.  ``HerReplayBuffer`` and ``DictReplayBuffer``
  (dict observations) are not supported.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from shmvec._optional import missing

try:  # Stable-Baselines3 is the extra shmvec[sb3] (shmvec._optional)
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ModuleNotFoundError as exc:
    raise missing("ShmVecEnvPool", exc) from exc

from shmvec._copyguard import Uncopyable
from shmvec._errors import AlreadyPendingCallError, ClosedVecEnvError, NoAsyncCallError
from shmvec._frontend import batch_rows
from shmvec._seeds import env_indices, per_env_seeds, per_env_values
from shmvec.env_pool import ShmEnvPool


class ShmVecEnvPool(Uncopyable, VecEnv):
    """An SB3 ``VecEnv`` of ``batch_size`` rows over an asynchronous pool of ``len(env_fns)`` envs.

    :param env_fns: callables that each build a new ``gymnasium.Env``.
    :param batch_size: rows per step (default: all envs, synchronous).
    :param kwargs: as for :class:`shmvec.env_pool.ShmEnvPool` (``n_workers``, ``start_method``,
        ``info_bytes``, ``timeout``, ...).

    Infos are SB3's (``terminal_observation``, ``TimeLimit.truncated``) plus ``env_id``,
    ``pool_obs`` and ``pool_action`` (see :class:`PoolReplayBuffer`).
    """

    _pool: ShmEnvPool | None = None
    # SB3's pairing: a step_async() whose step_wait() has not returned.  Not the pool's state (its
    # engine's POOLING, from reset to close, whether or not a step is asked for), so its own.
    waiting = False
    _received: tuple | None = None  # a batch recv() returned that step_wait() has not returned yet
    _built: tuple | None = None  # that batch as step_wait() returns it, once built
    _pool_cls: Any = ShmEnvPool  # the pool behind it (shmvec.ray_pool.RayShmVecEnvPool puts a RayShmEnvPool)

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], batch_size: int | None = None,
                 **kwargs: Any) -> None:
        self._pool = pool = self._pool_cls(env_fns, batch_size=batch_size, autoreset_mode=AutoresetMode.SAME_STEP,
                                       **kwargs)
        pool.set_batch_infos(False)  # SB3's infos come from each row's own dicts (pool.row_infos)
        self.pool_size = pool.num_envs
        self._ids = np.zeros(0, dtype=np.int64)
        self._last_obs: dict[int, Any] = {}
        self._last_action: dict[int, Any] = {}
        self._pool_seeds: list[int | None] = [None] * pool.num_envs
        self._pool_options: dict | list | None = None
        super().__init__(pool.batch_size, pool.single_observation_space, pool.single_action_space)
        self.metadata = dict(pool.metadata)

    def seed(self, seed: int | None = None) -> Sequence[None | int]:
        """Seeds every env of the pool (env i gets ``seed + i``; None: a random ``seed``) at the next ``reset``."""
        self._pool_seeds, _ = per_env_seeds(seed, self.pool_size)
        return self._pool_seeds

    def reset(self) -> VecEnvObs:
        """Resets every env of the pool; returns the first ``batch_size`` (rows sorted by env index)."""
        pool = self._usable()
        # A step in flight (a step_async() without its step_wait(), or a step interrupted by
        # Ctrl-C) is dropped: async_reset() drops whatever is in flight (unless it refuses its
        # arguments: the step is then still there for step_wait()).
        pool.async_reset(seed=self._pool_seeds, options=self._pool_options)
        self.waiting = False
        self._pool_seeds = [None] * self.pool_size
        self._pool_options = None
        self._last_action = {}
        self._last_obs = {}
        self._received = self._built = None
        obs, _, _, _, infos = pool.recv()
        obs, ids, order = self._sorted(obs, infos)
        self._remember(obs, ids)
        self.reset_infos = [dict(pool.row_infos[j][1] or {}) for j in order.tolist()]
        return obs

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        """Options for every env's next ``reset``: one dict for all, or a list of one per env of
        the pool (``pool_size``; with ``batch_size == pool_size`` that is one per row, as SB3's)."""
        if isinstance(options, (list, tuple)):
            options = per_env_values(options, self.pool_size, "options")
        self._pool_options = options

    def step_async(self, actions: np.ndarray) -> None:
        pool = self._usable()
        if self.waiting:
            raise AlreadyPendingCallError(
                "step_async() while a step is in flight (a step_async() without its step_wait(), or a step "
                "interrupted by Ctrl-C): call step_wait() to collect it, or reset()")
        ids = self._ids
        rows = np.asarray(actions)
        sent = {i: rows[k].copy() for k, i in enumerate(ids.tolist())} if rows.ndim and len(rows) == len(ids) else {}
        self._received = self._built = None
        try:
            pool.send(actions, ids)
            self.waiting = True  # in the try: a Ctrl-C may land as send() returns
            self._last_action.update(sent)
        except ValueError:
            raise  # refused (ids in flight already, bad actions): nothing was sent
        except BaseException:
            # Interrupted (Ctrl-C): the step is in flight if the pool marked the ids (it marks
            # and pushes them in one C call), and step_wait() then collects it.
            if ids.size and pool._in_flight[ids].all():
                self.waiting = True
                self._last_action.update(sent)
            raise

    def step_wait(self) -> VecEnvStepReturn:
        pool = self._usable()
        if not self.waiting:
            raise NoAsyncCallError("step_wait() without a preceding step_async()")
        if self._received is None:
            try:
                # Its envs stay in flight until released below: interrupted as it returns (a
                # Ctrl-C), step_wait() called again receives the same batch.
                self._received = pool._recv_held()
            except KeyboardInterrupt:
                raise  # still in flight: step_wait() again resumes (ShmEnvPool.recv keeps what arrived)
            except BaseException:
                self.waiting = False
                raise
        # The batch is kept until it is returned: interrupted below (a Ctrl-C), step_wait() builds
        # it again (building changes no state), or returns what it built (the bookkeeping after
        # it can run twice).
        if self._built is None:
            self._built = self._build(pool, *self._received)
        out, ids = self._built
        pool._release_received()  # does nothing the second time
        self._remember(out[0], ids)
        for i in ids.tolist():
            self._last_action.pop(i, None)
        self.waiting = False
        self._received = self._built = None  # (also cleared by step_async: a Ctrl-C may land here)
        return out

    def _build(self, pool: ShmEnvPool, obs: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
               vinfos: dict) -> tuple[VecEnvStepReturn, np.ndarray]:
        """SB3's step return for a received batch, and its rows' env ids; changes no state but
        ``reset_infos`` (set the same way if built again)."""
        prev_obs = self._last_obs
        obs, ids, order = self._sorted(obs, vinfos)
        rewards, terminated, truncated = rewards[order], terminated[order], truncated[order]
        dones = terminated | truncated
        infos: list[dict[str, Any]] = []
        final_mask = vinfos.get("_final_obs")
        row_infos = pool.row_infos  # each env's own dicts (Gymnasium's batched ones change types)
        rows_move = self.num_envs < self.pool_size  # row k is not always the same env
        for k, j in enumerate(order.tolist()):
            i = int(ids[k])
            info, reset_info = row_infos[j]
            info = dict(info)
            if dones[k]:
                info["terminal_observation"] = vinfos["final_obs"][j]
                assert final_mask is not None and final_mask[j]
                self.reset_infos[k] = dict(reset_info or {})
            elif reset_info is not None:  # an env's first row after reset() (batch_size < pool_size)
                info.update(reset_info)
                self.reset_infos[k] = dict(reset_info)
            elif rows_move:
                self.reset_infos[k] = {}  # not the reset info of whichever env had the row before
            info["TimeLimit.truncated"] = bool(truncated[k] and not terminated[k])
            info["env_id"] = i
            if i in self._last_action:  # a real transition (not the env's reset row)
                info["pool_obs"] = prev_obs[i]
                info["pool_action"] = self._last_action[i]
            infos.append(info)
        return (obs, rewards.astype(np.float32), dones, infos), ids

    def decided(self) -> dict[str, Any]:
        """What the defaults became on this machine, and why, as ``ShmVecEnv.decided``."""
        return self._usable().decided()

    def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return list(self._usable().render())

    # As SB3's (and ShmVecEnv's): only the envs in ``indices`` are touched; ``indices`` count envs
    # of the pool (0 .. pool_size - 1), not rows; set_attr sets the outermost wrapper's attribute.
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return list(self._usable()._paused_call("get_attr", (attr_name,), self._pool_indices(indices)))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._usable()._paused_call("set_attr", (attr_name, value), self._pool_indices(indices))

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        return list(self._usable()._paused_call("env_method", (method_name, method_args, method_kwargs),
                                                self._pool_indices(indices)))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return list(self._usable()._paused_call("is_wrapped", (wrapper_class,), self._pool_indices(indices)))

    # ---- internals ------------------------------------------------------------------------------------
    def _usable(self) -> ShmEnvPool:
        """The pool, if it can take a call: closed or broken, every call says so first (before
        AlreadyPendingCallError or NoAsyncCallError, which would point at step_wait() or reset())."""
        if self._pool is None:
            raise ClosedVecEnvError(f"this {type(self).__name__} is closed; build a new one")
        self._pool._check_usable()
        return self._pool

    def _pool_indices(self, indices: VecEnvIndices) -> list[int]:
        return env_indices(indices, self.pool_size)

    def _sorted(self, obs: Any, infos: dict) -> tuple[Any, np.ndarray, np.ndarray]:
        """The batch's rows sorted by env index: (obs, ids, order); changes nothing."""
        order = np.argsort(infos["env_id"], kind="stable")
        obs = batch_rows(obs, order)
        if isinstance(obs, dict):
            obs = collections.OrderedDict(obs)  # as DummyVecEnv returns a Dict batch
        return obs, infos["env_id"][order], order

    def _remember(self, obs: Any, ids: np.ndarray) -> None:
        """The rows just returned: the next step_async's envs, and a copy of their observations (what
        the caller does to the arrays it was handed must not change the ``pool_obs`` reported later)."""
        self._ids = ids
        kept = batch_rows(obs, np.arange(len(ids)))  # one copy of the batch (fancy indexing copies)
        for k, i in enumerate(ids.tolist()):
            self._last_obs[i] = batch_rows(kept, k)


class PoolReplayBuffer(ReplayBuffer):
    """SB3's ``ReplayBuffer`` for :class:`ShmVecEnvPool`: stores each row's own transition.

    Use it as ``SAC("MlpPolicy", pool_env, replay_buffer_class=PoolReplayBuffer)`` (also TD3,
    DDPG, DQN).  SB3 hands ``add`` the observation and action of *row* k of the previous step,
    which with an asynchronous pool belong to another env than the result in row k; this buffer
    takes the observation and action of the row's own env from ``infos[k]["pool_obs"]`` and
    ``infos[k]["pool_action"]`` instead (actions of a ``Box`` space scaled to [-1, 1] as SB3 stores
    them).  A row without them (an env's first observation after ``reset``, not a transition) is
    replaced by a copy of another row of the same call, or the call is skipped if no row is a
    transition -- this happens only in the first steps after a reset.
    """

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        if not infos or "env_id" not in infos[0]:
            raise ValueError("PoolReplayBuffer needs the infos of a ShmVecEnvPool (with env_id, pool_obs)")
        valid = [k for k, info in enumerate(infos) if "pool_obs" in info]
        if not valid:
            return
        rows = [k if "pool_obs" in infos[k] else valid[0] for k in range(len(infos))]
        obs = np.stack([np.asarray(infos[k]["pool_obs"]) for k in rows])
        env_action = np.stack([np.asarray(infos[k]["pool_action"]) for k in rows])
        if isinstance(self.action_space, spaces.Box):
            low, high = self.action_space.low, self.action_space.high
            action = 2.0 * ((env_action - low) / (high - low)) - 1.0
        else:
            action = env_action
        idx = np.asarray(rows)
        super().add(obs, np.asarray(next_obs)[idx], action, np.asarray(reward)[idx], np.asarray(done)[idx],
                    [infos[k] for k in rows])
