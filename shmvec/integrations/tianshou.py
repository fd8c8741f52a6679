"""Tianshou: its vector env API (``BaseVectorEnv``'s) over :class:`shmvec.ShmEnvPool`.

Tianshou's collectors step a subset of the envs (``step(actions, ids)``; with ``n_episode``
collection the envs that finished their share stop being stepped) and reset the envs that ended
by index (``reset(env_id=ids)``).  :class:`ShmTianshouVectorEnv` does both on a synchronous
``ShmEnvPool`` (``batch_size == num_envs``) with :meth:`shmvec.ShmEnvPool.step_envs`, which
sends exactly those envs and waits for exactly those::

    from tianshou.data import Collector, VectorReplayBuffer
    from shmvec import make_env
    from shmvec.integrations.tianshou import ShmTianshouVectorEnv

    envs = ShmTianshouVectorEnv([make_env("CartPole-v1")] * 8, n_workers=2)   # for DummyVectorEnv(...)
    collector = Collector(policy, envs, VectorReplayBuffer(20_000, len(envs)))

Tianshou is not imported: the class has the API its collectors use (duck-typed, as EnvPool's
envs are), so no import of tianshou or torch happens here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from shmvec._errors import ShmVecEnvError
from shmvec._frontend import batch_rows
from shmvec.env_pool import ShmEnvPool


class ShmTianshouVectorEnv:
    """Tianshou's ``BaseVectorEnv`` API over a synchronous :class:`shmvec.ShmEnvPool`.

    Step for step what Tianshou's ``DummyVectorEnv`` over the same env functions returns, on the
    same seeds: ``reset`` gives ``(obs, infos)`` with ``infos`` an object array of dicts,
    ``step`` gives ``(obs, rew, terminated, truncated, infos)`` with ``infos[k]["env_id"]``.

    How it differs:

    - ``reset(env_id=ids)`` of only some envs resets envs that ended (terminated or truncated)
      and were not reset since: the pool resets them on their next step (NEXT_STEP autoreset,
      unseeded, as an env's own ``reset()``), which is what the collectors do.  Other subsets,
      or a subset with reset keyword arguments, raise ``ShmVecEnvError``; resetting every env
      takes any arguments.
    - stepping an env that ended without a reset resets it instead (NEXT_STEP), where an env run
      alone would step past its end.
    - ``wait_num``/``timeout`` (Tianshou's asynchronous mode) are not offered: ``is_async`` is
      False; ``ShmEnvPool`` itself is the asynchronous pool.
    - ``seed(s)`` resets every env with its seed (``s + i``), as ``DummyVectorEnv`` does for
      Gymnasium envs, and returns ``[[seed], ...]``.

    :param env_fns: callables that each build a new ``gymnasium.Env``.
    :param pool_kwargs: options of :class:`shmvec.ShmEnvPool` (``n_workers``, ``start_method``,
        ``info_bytes``, ...); ``batch_size`` and ``autoreset_mode`` are set here.
    """

    is_async = False
    _pool: ShmEnvPool | None = None
    is_closed = True

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], **pool_kwargs: Any) -> None:
        for key in ("batch_size", "autoreset_mode"):
            if key in pool_kwargs:
                raise TypeError(f"ShmTianshouVectorEnv sets {key} itself")
        env_fns = list(env_fns)
        self._pool = pool = ShmEnvPool(env_fns, batch_size=len(env_fns), autoreset_mode=AutoresetMode.NEXT_STEP,
                                       **pool_kwargs)
        pool.set_batch_infos(False)  # each row's own dicts (pool.row_infos), as Tianshou keeps them
        self.is_closed = False
        self.env_num = pool.num_envs
        self.wait_num = self.env_num
        self.timeout = None
        self.waiting_id: list[int] = []
        self.ready_id = list(range(self.env_num))
        # Envs that ended and were not reset since (reset(env_id=...) of only these is a step).
        self._ended = np.zeros(self.env_num, dtype=np.bool_)
        self._started = False
        space = pool.single_action_space
        # The action sent to an ended env to reset it (ignored by the worker, but checked as valid).
        self._noop = None if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)) else np.asarray(
            copy.deepcopy(space).sample())
        self.action_space = [copy.deepcopy(space) for _ in range(self.env_num)]
        self.observation_space = [copy.deepcopy(pool.single_observation_space) for _ in range(self.env_num)]
        self.metadata = pool.metadata
        self.spec = None
        self.reward_range = (-float("inf"), float("inf"))

    @property
    def pool(self) -> ShmEnvPool:
        """The underlying ``ShmEnvPool``."""
        self._assert_is_not_closed()
        assert self._pool is not None
        return self._pool

    def __len__(self) -> int:
        return self.env_num

    # ---- Tianshou's BaseVectorEnv API -------------------------------------------------------------
    def reset(self, env_id: int | Sequence[int] | np.ndarray | None = None, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Resets envs ``env_id`` (default all); returns their ``(obs, infos)`` in that order.

        :param kwargs: ``seed`` (one int for every env, or one per env) and ``options``, passed to
            each env's ``reset`` as ``DummyVectorEnv`` does; only when every env is reset.
        :raises ShmVecEnvError: a subset of envs of which some did not end, or with arguments.
        """
        pool = self.pool
        ids = self._ids(env_id)
        if ids.size == self.env_num and np.array_equal(np.sort(ids), np.arange(self.env_num)):
            seed = kwargs.pop("seed", None)
            options = kwargs.pop("options", None)
            if kwargs:
                raise TypeError(f"reset() got unexpected keyword arguments {sorted(kwargs)}")
            if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
                seed = [int(seed)] * self.env_num  # Tianshou passes one seed to every env's reset
            pool.async_reset(seed=seed, options=options)
            obs, _, _, _, infos = pool.recv()
            rows = {int(i): k for k, i in enumerate(infos["env_id"])}
            take = np.asarray([rows[int(i)] for i in ids], dtype=np.int64)
            self._ended[:] = False
            self._started = True
            return batch_rows(obs, take), self._infos([pool.row_infos[k][1] or {} for k in take.tolist()])
        if not self._started:
            raise ShmVecEnvError("reset() of some envs before the first reset() of all")
        not_ended = ids[~self._ended[ids]]
        if not_ended.size or kwargs:
            raise ShmVecEnvError(
                "ShmTianshouVectorEnv resets only some envs when each of them ended (terminated or truncated) and "
                f"without arguments; envs {not_ended.tolist()} did not end, arguments {sorted(kwargs)}: reset all envs"
            )
        obs, _, _, _, _ = pool.step_envs(self._noops(ids.size), ids)  # NEXT_STEP: these steps are resets
        self._ended[ids] = False
        return obs, self._infos([info for info, _ in pool.row_infos])

    def step(self, action: Any, id: int | Sequence[int] | np.ndarray | None = None) -> tuple:
        """Steps envs ``id`` (default all) with ``action`` (one row each); waits for exactly those.

        :raises ValueError: ``action`` is None (there is no asynchronous mode to fetch from),
            or bad ids or actions.
        """
        pool = self.pool
        if action is None:
            raise ValueError("action must be not-None for non-async")
        ids = self._ids(id)
        if hasattr(action, "detach"):  # a torch tensor
            action = action.detach().cpu().numpy()
        if len(action) != ids.size:
            raise ValueError(f"{len(action)} actions for {ids.size} envs")
        obs, rew, terminated, truncated, _ = pool.step_envs(action, ids)
        self._ended[ids] |= terminated | truncated
        infos = []
        for i, (info, _) in zip(ids.tolist(), pool.row_infos):
            info = dict(info)
            info["env_id"] = i
            infos.append(info)
        return obs, rew, terminated, truncated, self._infos(infos)

    def seed(self, seed: int | Sequence[int] | None = None) -> list[list[int] | None]:
        """Resets every env with its seed (``seed + i``, or one of a list), as ``DummyVectorEnv``."""
        if seed is None:
            seeds: list = [None] * self.env_num
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.env_num)]
        else:
            seeds = list(seed)
        self.reset(seed=seeds)
        return [[s] for s in seeds]

    def get_env_attr(self, key: str, id: int | Sequence[int] | np.ndarray | None = None) -> list[Any]:
        values = self.pool.get_attr(key)
        return [values[i] for i in self._ids(id).tolist()]

    def set_env_attr(self, key: str, value: Any, id: int | Sequence[int] | np.ndarray | None = None) -> None:
        pool = self.pool
        ids = self._ids(id).tolist()
        if len(ids) == self.env_num:
            pool.set_attr(key, value)
            return
        current = list(pool.get_attr(key))
        for i in ids:
            current[i] = value
        pool.set_attr(key, current)

    def render(self, **kwargs: Any) -> list[Any]:
        return list(self.pool.render())

    def close(self) -> None:
        """Stops the workers and frees the shared memory.  Idempotent (unlike Tianshou's own)."""
        pool, self._pool = self._pool, None
        self.is_closed = True
        if pool is not None:
            pool.close()

    def __enter__(self) -> "ShmTianshouVectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- internals --------------------------------------------------------------------------------
    def _assert_is_not_closed(self) -> None:
        if self.is_closed:
            raise ShmVecEnvError(f"Methods of {type(self).__name__} cannot be called after close.")

    def _ids(self, id: Any) -> np.ndarray:
        if id is None:
            return np.arange(self.env_num, dtype=np.int64)
        ids = np.asarray([id] if np.isscalar(id) else id)
        if ids.size and ids.dtype.kind not in "iu":
            raise ValueError(f"env ids must be integers, got {ids.tolist()}")
        return ids.astype(np.int64).reshape(-1)

    def _noops(self, n: int) -> Any:
        if self._noop is None:  # a Dict or Tuple action space: any valid action per env
            return batch_space(self.pool.single_action_space, n).sample()
        return np.repeat(self._noop[None], n, axis=0)

    @staticmethod
    def _infos(dicts: list[dict]) -> np.ndarray:
        out = np.empty(len(dicts), dtype=object)
        for k, d in enumerate(dicts):
            out[k] = d
        return out
