"""ShmMultiAgentVecEnv: PettingZoo ``ParallelEnv``s as an SB3 ``VecEnv`` of one row per agent.

It holds an :class:`shmvec._engine.Engine` whose envs are :class:`shmvec._agents.AgentsEnv`s
(each user's ``ParallelEnv`` wrapped in its worker: the agents' observations, rewards and flags
are stacked leaves of the engine's shared buffers), and speaks SB3's ``VecEnv`` API with
``num_envs = n_envs * n_agents`` rows, env-major and agents in ``possible_agents`` order (as
SuperSuit's ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), ...)``), so that one SB3
policy is shared by every agent.  The semantics (agents that come and go, padding) are in
:mod:`shmvec._agents` and docs/multi-agent.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec._optional import missing

try:  # Stable-Baselines3 is the extra shmvec[sb3] (shmvec._optional)
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ModuleNotFoundError as exc:
    raise missing("ShmMultiAgentVecEnv", exc) from exc

from shmvec import _protocol as P
from shmvec._agents import agent_space
from shmvec._copyguard import Uncopyable
from shmvec._engine import Engine
from shmvec._errors import NoAsyncCallError
from shmvec._seeds import env_indices, per_env_seeds, per_env_values
from shmvec._state import serialized
from shmvec._masks import METHOD as MASKS_METHOD
from shmvec._frontend import FLAG_KEYS, agent_step_values, agents_engine, decided_of, rendered_images, served_masks

__all__ = ["ShmMultiAgentVecEnv"]

class ShmMultiAgentVecEnv(Uncopyable, VecEnv):
    """PettingZoo ``ParallelEnv``s stepped in shared memory, one SB3 row per agent::

        from mpe2 import simple_spread_v3
        venv = ShmMultiAgentVecEnv([lambda: simple_spread_v3.parallel_env()] * 8)
        PPO("MlpPolicy", venv).learn(100_000)   # one policy shared by every agent

    Row ``e * n_agents + k`` is agent ``possible_agents[k]`` of env ``e``.  An agent the env no
    longer reports on (dead, or not born yet) keeps its row, masked: zero observation, reward 0,
    ``info["active"] = False``, its action ignored.  An env ends when no agent of it is left
    alive; it is then reset, and every row of it reports ``done`` with its own
    ``terminal_observation`` (and ``TimeLimit.truncated`` when that agent was truncated, not
    terminated).  An agent that ends before its env has ``info["agent_terminated"]`` or
    ``info["agent_truncated"]`` at that step, and its row is not ``done`` (SuperSuit's black death).

    :param env_fns: callables that each build a new PettingZoo ``ParallelEnv`` (or an AEC env
        that PettingZoo's ``aec_to_parallel`` can convert), called in the workers.
    :param pad: agents whose spaces differ are refused (a ``SpaceError`` naming them) unless True:
        then observations are zero-padded to the largest shape and ``Discrete`` actions padded to
        the largest ``n`` (SuperSuit's ``pad_observations_v0``/``pad_action_space_v0``).
    :param action_masks: serve ``env_method("action_masks")`` (``MaskablePPO``) from shared
        memory, one mask per row: each agent's ``"action_mask"``, from its observation (a ``Dict``
        of ``"observation"`` and ``"action_mask"``, whose ``"observation"`` is then the row's
        observation) or its info, every action allowed where an agent has none (inactive, or no
        mask given).  None (default): from the first ask, for ``Discrete`` agent actions; False:
        off.  As :class:`shmvec.ShmVecEnv`'s option otherwise.
    :param zero_copy: observations handed out of shared memory without a copy, as with
        :class:`shmvec.ShmVecEnv` (None, the default: on from 32 KiB of stacked observations a step).
    :param options: every other option of :class:`shmvec.ShmVecEnv` (workers, start method,
        copy, timeouts, restarts, ...), with the same meaning.

    :raises TypeError: a factory returns no PettingZoo env, or an AEC env that is not parallelizable.
    :raises SpaceError: the agents' spaces differ (and ``pad`` is False), or are not Box/Discrete.
    """

    _engine: Engine | None = None  # class-level: close() and __del__ are safe on a half-built object

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        pad: bool = False,
        n_workers: int | None = None,
        start_method: str | None = None,
        copy: bool = True,
        worker_threads: int | None = 1,
        timeout: float | None = None,
        spin_us: float | tuple[float, float] | None = None,
        mailbox_bytes: int = P.MAILBOX_BYTES,
        on_failure: str = "raise",
        max_restarts: int | None = 100,
        invalid_actions: str = "raise",
        envs_per_worker: int | None = None,
        cpu_affinity: bool | Sequence[int | Sequence[int]] | None = None,
        preload: Sequence[str] | None = None,
        action_masks: bool | None = None,
        zero_copy: bool | None = None,
        parent_threads: str | int | None = "auto",
    ) -> None:
        engine, self.possible_agents = agents_engine(
            env_fns, pad, type(self).__name__, n_workers=n_workers, start_method=start_method, copy=copy,
            worker_threads=worker_threads, timeout=timeout, spin_us=spin_us, mailbox_bytes=mailbox_bytes,
            on_failure=on_failure, max_restarts=max_restarts, invalid_actions=invalid_actions,
            envs_per_worker=envs_per_worker, cpu_affinity=cpu_affinity, preload=preload, action_masks=action_masks,
            zero_copy=zero_copy, parent_threads=parent_threads,
        )
        self._engine = engine
        self.pad = pad
        self.n_envs = engine.num_envs
        stacked = engine.observation_space
        self.n_agents = n = int(stacked["rew"].shape[0])
        # Seeds and options of the next reset, per env (SB3's VecEnv keeps its own per row, unused).
        self._env_seeds: list = [None] * self.n_envs
        self._env_options: list = [{}] * self.n_envs
        try:
            self.reset_infos: list[dict[str, Any]] = [{} for _ in range(self.n_envs * n)]
            super().__init__(self.n_envs * n, agent_space(stacked["obs"]), agent_space(engine.action_space))
        except BaseException:
            self.close()
            raise
        self.metadata = engine.metadata
        self._act_shape = (self.n_envs, n, *self.action_space.shape)

    # ---- options, as attributes ---------------------------------------------------------------------
    n_workers = property(lambda self: self._engine.n_workers)
    start_method = property(lambda self: self._engine.options.start_method)
    copy = property(lambda self: self._engine.options.copy)

    @property
    def restarts(self) -> int:
        """Workers restarted so far (``on_failure="restart"``)."""
        return self._engine.restarted

    @property
    def closed(self) -> bool:
        return self._engine is None or self._engine.closed

    def rows_of(self, env_index: int) -> range:
        """The rows of env ``env_index`` (one per agent, in ``possible_agents`` order)."""
        return range(env_index * self.n_agents, (env_index + 1) * self.n_agents)

    # ---- SB3 VecEnv API -----------------------------------------------------------------------------
    @serialized
    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds from ``seed()`` (one per env, not per row) and options
        from ``set_options()`` (used once).

        :raises ClosedVecEnvError, BrokenVecEnvError: misuse.
        :raises WorkerDiedError: a worker died.
        """
        engine = self._engine
        engine.check_usable()
        results = engine.reset(self._env_seeds, self._env_options)
        self.reset_infos = [{} for _ in range(self.num_envs)]
        for items in results:
            for e, info in items:
                self._spread(e, info, self.reset_infos)
        self._env_seeds = [None] * self.n_envs
        self._env_options = [{}] * self.n_envs
        return self._obs_rows(engine)

    @serialized
    def step_async(self, actions: np.ndarray) -> None:
        """Writes one action per row into shared memory and starts every worker.

        :raises ValueError: the actions do not fit (``num_envs`` rows of the agents' action space).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions (one per agent row: {self.n_envs} envs x "
                             f"{self.n_agents} agents), got an array of shape {actions.shape}")
        self._engine.post_step(actions.reshape(self._act_shape))

    @serialized
    def step_wait(self) -> VecEnvStepReturn:
        """Waits for the step started by ``step_async`` and returns (obs, rewards, dones, infos) by row.

        :raises NoAsyncCallError: no step is in flight.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
        """
        engine = self._engine
        engine.check_usable()
        if not engine.waiting:
            raise NoAsyncCallError("step_wait() without a preceding step_async()")
        engine.check_poster("step_wait")
        results = engine.complete_step()
        try:
            out = self._step_results(engine, results)
        finally:
            engine.finish_step()
        return out

    def _obs_rows(self, engine: Engine) -> np.ndarray:
        """The observations by row: a copy (``copy=True``), or a view of the shared memory, which
        with ``zero_copy`` no later step writes into while the caller holds it."""
        leaves, leased = engine.obs_buffers()
        arr = leaves[("obs",)]
        arr = arr.reshape(self.num_envs, *arr.shape[2:])
        return arr.copy() if engine.options.copy and not leased else arr

    def _spread(self, e: int, info: dict, into: list[dict]) -> None:
        """Env ``e``'s info ({agent: info}) into its rows of ``into``; a key that is no agent's
        (the engine's ``shmvec_restarted``) goes to every row of the env."""
        base = e * self.n_agents
        for k, agent in enumerate(self.possible_agents):
            own = info.get(agent)
            if own:
                into[base + k] = dict(own)
        if len(info) > sum(agent in info for agent in self.possible_agents):
            shared = {key: value for key, value in info.items() if key not in self.possible_agents}
            for r in range(base, base + self.n_agents):
                into[r] = {**into[r], **shared}

    def _step_results(self, engine: Engine, results: list[list]) -> VecEnvStepReturn:
        n = self.n_agents
        ended, values = agent_step_values(engine, results)
        env_done = engine.terminated | engine.truncated
        rew, term, trunc, active = (values[key].reshape(-1) for key in FLAG_KEYS)
        dones = np.repeat(env_done, n)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        reset_infos = self.reset_infos
        for e in ended:
            for r in self.rows_of(int(e)):
                reset_infos[r] = {}
        for items in results:
            for e, info, reset_info in items:
                if info:
                    self._spread(e, info, infos)
                if reset_info:
                    self._spread(e, reset_info, reset_infos)
        for r in np.flatnonzero(~active):
            infos[r]["active"] = False
        for r in np.flatnonzero((term | trunc) & ~dones):
            infos[r]["agent_terminated" if term[r] else "agent_truncated"] = True
        if ended.size:
            term_obs = engine.term_buffers[("obs",)]
            for e in ended:
                for k, r in enumerate(self.rows_of(int(e))):
                    infos[r]["terminal_observation"] = term_obs[e, k].copy()
                    infos[r]["TimeLimit.truncated"] = bool(trunc[r] and not term[r])
        return self._obs_rows(engine), rew, dones, infos

    @serialized
    def decided(self) -> dict[str, Any]:
        """What the defaults became on this machine, and why, as ``ShmVecEnv.decided``."""
        return decided_of(self)

    def close(self) -> None:
        """Stops the workers and frees the shared memory.  Idempotent, bounded in time.

        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        engine = self._engine
        if engine is None:
            return
        with engine.closing():
            engine.close()

    # ---- rare commands: by row, sent to the env that holds the row ------------------------------------
    def _row_indices(self, indices: VecEnvIndices) -> list[int]:
        """SB3's ``indices`` over rows: None (all), an int, or an iterable of ints."""
        return env_indices(indices, self.num_envs)

    def _env_indices(self, indices: VecEnvIndices) -> tuple[list[int], list[int]]:
        """(the rows, the envs holding them, each once in order of first appearance)."""
        rows = list(self._row_indices(indices))
        envs = list(dict.fromkeys(r // self.n_agents for r in rows))
        return rows, envs

    def _by_row(self, name: str, indices: VecEnvIndices, args: tuple) -> list[Any]:
        rows, envs = self._env_indices(indices)
        answers = dict(zip(envs, self._engine.call(name, envs, args)))
        return [answers[r // self.n_agents] for r in rows]

    @serialized
    def get_images(self) -> Sequence[np.ndarray | None]:
        """One image per env (not per row): each ``ParallelEnv``'s ``render()``."""
        return rendered_images(self._engine, self.render_mode, self.n_envs)

    @serialized
    def has_attr(self, attr_name: str) -> bool:
        return all(self._engine.call(P.Call.HAS_ATTR, None, (attr_name,)))

    @serialized
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The attribute of the ``ParallelEnv`` that holds each row (one answer per row)."""
        return self._by_row(P.Call.GET_ATTR, indices, (attr_name,))

    @serialized
    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Sets the attribute on the ``ParallelEnv`` of each row (once per env)."""
        _, envs = self._env_indices(indices)
        self._engine.call(P.Call.ENV_METHOD, envs, ("set_env_attr", (attr_name, value), {}))

    @serialized
    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """Calls the method of the ``ParallelEnv`` of each row, once per env; one answer per row.
        ``env_method("action_masks")`` answers each row's mask from shared memory (``action_masks``)."""
        if method_name == MASKS_METHOD and self.masks_in_shm and not method_args and not method_kwargs:
            return list(self.action_masks(indices))
        return self._by_row(P.Call.ENV_METHOD, indices, (method_name, method_args, method_kwargs))

    @property
    def masks_in_shm(self) -> bool:
        """Whether action masks are served from shared memory (the ``action_masks`` option)."""
        return self._engine is not None and self._engine.masks_in_shm

    @serialized
    def action_masks(self, indices: VecEnvIndices = None) -> np.ndarray:
        """Each row's action mask of the last reset or step, bool ``(len(indices), n_actions)``.

        :raises ShmVecEnvError: action masks are off (``Box`` actions, or ``action_masks=False``).
        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        """
        masks = served_masks(self._engine, type(self).__name__).reshape(self.num_envs, -1)
        return masks.copy() if indices is None else masks[list(self._row_indices(indices))]

    @serialized
    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """False for every row: PettingZoo envs are not Gymnasium wrappers (as SuperSuit answers)."""
        return [False] * len(self._row_indices(indices))

    # ---- seeds and options, per env -------------------------------------------------------------------
    @serialized
    def seed(self, seed: int | Sequence[int | None] | np.random.SeedSequence | None = None) -> list[int | None]:
        """Sets the seeds of the next ``reset()``, one per env (not per row): an int ``s`` gives env
        ``e`` the seed ``s + e`` (as SuperSuit's ``concat_vec_envs_v1`` does); a list gives one per
        env; a ``SeedSequence`` derives them as ``ShmVecEnv.seed`` does.

        :returns: the per-env seeds.
        :raises ValueError: a list whose length is not the number of envs.
        """
        self._env_seeds, _ = per_env_seeds(seed, self.n_envs)
        return self._env_seeds

    @serialized
    def set_options(self, options: list[dict] | dict | None = None) -> None:
        """Options of the next ``reset()``: one dict for every env, or a list with one per env."""
        self._env_options = per_env_values({} if options is None else options, self.n_envs, "options")
