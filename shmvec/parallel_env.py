"""ShmParallelEnv: PettingZoo's ``ParallelEnv`` API batched over envs, agents kept as keys.

The same engine and worker-side adapter as :class:`shmvec.ShmMultiAgentVecEnv` (built by
:func:`shmvec._frontend.agents_engine`), with the same autoreset and black-death
semantics, but every return is a dict keyed by agent of arrays over envs instead of SB3 rows.
docs/multi-agent.md, "A face that keeps agents as keys".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from shmvec import _protocol as P
from shmvec._actions import leaf_batch, leaf_check
from shmvec._agents import agent_space
from shmvec._copyguard import Uncopyable
from shmvec._engine import Engine
from shmvec._errors import AlreadyPendingCallError, SpaceError
from shmvec._frontend import agent_step_values, agents_engine, decided_of, served_masks
from shmvec._layout import Leaf
from shmvec._seeds import per_env_seeds, per_env_values
from shmvec._state import serialized

__all__ = ["ShmParallelEnv"]


class ShmParallelEnv(Uncopyable):
    """PettingZoo ``ParallelEnv``s stepped in shared memory, agents as keys, envs batched::

        env = ShmParallelEnv([lambda: simple_spread_v3.parallel_env()] * 8)
        obs, infos = env.reset(seed=0)               # obs["agent_0"].shape == (8, 18)
        acts = {a: env.action_space(a).sample() for a in env.agents}   # arrays of 8 actions
        obs, rewards, terminations, truncations, infos = env.step(acts)

    Every dict has every agent of ``possible_agents`` as a key (``agents`` is the same list),
    whether or not the agent is alive in each env.  Semantics, as ``ShmMultiAgentVecEnv``'s:

    - an agent an env does not report on (dead, or not born yet) is masked in that env: zero
      observation, reward 0, ``infos[agent]["active"][e]`` False, its action ignored;
    - an agent that ends before its env: its last observation and reward, flags False,
      ``infos[agent]["agent_terminated"]`` (or ``"agent_truncated"``) True for that env;
    - an env ends when no agent of it is left alive; it is reset in the same step, and every
      agent of it reports ``terminations[agent][e]`` or (that agent truncated, not terminated)
      ``truncations[agent][e]`` True, with the last observation in ``infos[agent]["final_obs"][e]``
      (a dense array over envs, zeros where no env ended or the agent was masked; the mask
      ``infos[agent]["_final_obs"]`` says which envs ended) and the new episode's observation in
      ``obs``; the reset's own infos go to ``infos[agent]["reset_info"]``.

    Infos are in Gymnasium's vector format: each key an array over envs, with a ``_key`` mask.

    :param env_fns: callables that each build a new PettingZoo ``ParallelEnv`` (or a parallelizable AEC env).
    :param pad: as ``ShmMultiAgentVecEnv``'s (agents with different spaces are padded to one).
    :param options: every option of :class:`shmvec.ShmVecEnv` but ``action_masks``.
    Observations that carry action masks (PettingZoo's ``Dict`` of ``"observation"`` and
    ``"action_mask"``) come back so: per agent, a ``Dict`` of the observations over envs and the
    masks over envs (int8, every action allowed where the agent is masked); ``final_obs`` holds the
    ``"observation"`` part.

    :raises SpaceError: as ``ShmMultiAgentVecEnv``; also for masked observations with ``Box``
        actions or ``action_masks=False``.
    """

    _engine: Engine | None = None  # class-level: close() and __del__ are safe on a half-built object
    _add_info = gym.vector.VectorEnv._add_info  # Gymnasium's own info batching (needs ``num_envs``)

    def __init__(self, env_fns: Sequence[Callable[[], Any]], pad: bool = False, **options: Any) -> None:
        engine, agents = agents_engine(env_fns, pad, type(self).__name__, **options)
        self._engine = engine
        self.render_mode = engine.call(P.Call.GET_ATTR, [0], ("render_mode",))[0]
        # Observations that carry action masks: the workers write the masks into shared memory
        # from now on, and every observation hands its agent's mask back (see _obs).
        self._masked = engine.call(P.Call.GET_ATTR, [0], ("masked_observations",))[0]
        if self._masked:
            try:
                served_masks(engine, type(self).__name__)
            except Exception as exc:
                self.close()
                raise SpaceError(
                    f"the agents' observations carry action masks, which {type(self).__name__} hands back for "
                    f"Discrete actions only, with action_masks left on ({exc})") from None
        self.pad = pad
        self.possible_agents = agents
        self.num_envs = n_envs = engine.num_envs
        self.n_agents = len(agents)
        self._index = {a: k for k, a in enumerate(agents)}
        self._obs_space = agent_space(engine.observation_space["obs"])
        self._obs_part = self._obs_space  # one agent's observation, without a mask
        self._act_space = agent_space(engine.action_space)
        if self._masked:  # PettingZoo's masked observation, batched: a Dict of observation and action_mask
            n_actions = int(self._act_space.n)
            self._obs_space = gym.spaces.Dict({"observation": self._obs_space,
                                               "action_mask": gym.spaces.Box(0, 1, (n_actions,), dtype=np.int8)})
        self._batched_obs = batch_space(self._obs_space, n_envs)
        self._batched_act = batch_space(self._act_space, n_envs)
        self._act_shape = (n_envs, self.n_agents, *self._act_space.shape)
        # Each agent's actions are checked as every face checks a leaf (shmvec._actions), named by agent.
        act_shape, act_dtype = tuple(self._act_space.shape), np.dtype(self._act_space.dtype)
        self._act_leaves = {a: Leaf((a,), act_shape, act_dtype) for a in agents}
        policy = engine.options.invalid_actions
        self._act_checks = {} if policy == "ignore" else {a: leaf_check(self._act_space, (a,), policy) for a in agents}
        self.metadata = engine.metadata

    @property
    def agents(self) -> list[str]:
        """Every possible agent: the keys of every dict (an agent dead in an env is masked there)."""
        return list(self.possible_agents)

    @property
    def closed(self) -> bool:
        return self._engine is None or self._engine.closed

    def observation_space(self, agent: str) -> gym.Space:
        """``agent``'s observation space batched over envs (``Box (n_envs, *shape)``, or ``MultiDiscrete``)."""
        self._index[agent]
        return self._batched_obs

    def action_space(self, agent: str) -> gym.Space:
        """``agent``'s action space batched over envs (``MultiDiscrete`` for ``Discrete``, or ``Box``)."""
        self._index[agent]
        return self._batched_act

    def single_observation_space(self, agent: str) -> gym.Space:
        self._index[agent]
        return self._obs_space

    def single_action_space(self, agent: str) -> gym.Space:
        self._index[agent]
        return self._act_space

    # ---- the API ------------------------------------------------------------------------------------
    @serialized
    def reset(self, seed: int | Sequence[int | None] | None = None,
              options: Mapping | Sequence[Mapping] | None = None) -> tuple[dict, dict]:
        """Resets every env: an int seed ``s`` gives env ``e`` the seed ``s + e``; a list, one per env.
        ``options``: one dict for every env, or one per env.

        :returns: (obs, infos), keyed by agent.
        """
        engine = self._engine
        engine.check_usable()
        seeds, _ = per_env_seeds(seed, self.num_envs)
        options = per_env_values(dict(options or {}) if options is None or isinstance(options, Mapping) else options,
                                 self.num_envs, "options")
        results = engine.reset(seeds, options)
        infos = self._new_infos(engine.obs_buffers()[0][("active",)])
        for items in results:
            for e, info in items:
                self._add_env_info(infos, e, info)
        return self._obs(engine), infos

    @serialized
    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Steps every env with ``actions[agent]``, an array over envs (a missing agent's action is 0).

        :returns: (obs, rewards, terminations, truncations, infos), keyed by agent.
        :raises KeyError: an action for an agent that is not in ``possible_agents``.
        :raises ValueError: an agent's actions are not one per env, or do not cast exactly to the
            action space's dtype (``1.7`` for a ``Discrete``); ``InvalidActionError`` (a ValueError):
            NaN or out of range, naming the agent and the envs (``invalid_actions``), as every face.
        :raises AlreadyPendingCallError: a step interrupted by Ctrl-C is in flight (``reset()`` drops it).
        """
        engine = self._usable("step")
        stacked = np.zeros(self._act_shape, dtype=self._act_space.dtype)
        for agent, action in actions.items():
            if agent not in self._index:
                raise KeyError(f"{agent!r} is not one of possible_agents {self.possible_agents}")
            arr = leaf_batch(action, self._act_leaves[agent], self.num_envs)  # never truncated nor broadcast
            check = self._act_checks.get(agent)
            if check is not None:
                check(arr)  # NaN, out of range: raises InvalidActionError (or warns) naming the agent and envs
            stacked[:, self._index[agent]] = arr
        # Checked above, agent by agent; an agent left out gets 0, which the engine checks as before.
        engine.post_step(stacked, checked=len(actions) == self.n_agents)
        results = engine.complete_step()
        try:
            return self._step_results(engine, results)
        finally:
            engine.finish_step()

    def _usable(self, what: str) -> Engine:
        """The engine, if ``what`` can run: open, not broken, and no step in flight.  This face
        has no ``step_wait()``: a step is left in flight only by a Ctrl-C in ``step()``, and
        ``reset()`` drops it (the engine's own message would point at ``step_wait()``)."""
        engine = self._engine
        engine.check_usable()
        if engine.in_flight_call == "step":
            raise AlreadyPendingCallError(
                f"{what}() while a step is in flight (a step() interrupted by Ctrl-C, its results not returned): "
                "call reset() (it finishes that step and drops it), or close()")
        return engine

    def _obs(self, engine: Engine) -> dict[str, Any]:
        obs = engine.obs_buffers()[0][("obs",)]
        if not self._masked:
            return {a: obs[:, k].copy() for a, k in self._index.items()}
        masks = engine.mask_buffer.reshape(self.num_envs, self.n_agents, -1)
        return {a: {"observation": obs[:, k].copy(), "action_mask": masks[:, k].astype(np.int8)}
                for a, k in self._index.items()}

    def _new_infos(self, active: np.ndarray) -> dict[str, dict]:
        on = np.ones(self.num_envs, dtype=np.bool_)
        return {a: {"active": active[:, k].copy(), "_active": on.copy()} for a, k in self._index.items()}

    def _add_env_info(self, infos: dict, e: int, info: dict, key: str | None = None) -> None:
        """Env ``e``'s info ({agent: info}) into ``infos``; a key that is no agent's (the engine's
        ``shmvec_restarted``) goes to every agent.  ``key``: nested under that key."""
        shared = {k: v for k, v in info.items() if k not in self._index}
        for agent in self.possible_agents:
            own = {**(info.get(agent) or {}), **shared}
            if own:
                self._add_info(infos[agent], {key: own} if key else own, e)

    def _step_results(self, engine: Engine, results: list[list]) -> tuple[dict, dict, dict, dict, dict]:
        ended, values = agent_step_values(engine, results)
        rew, term, trunc, active = values["rew"], values["term"], values["trunc"], values["active"]
        env_done = np.zeros(self.num_envs, dtype=np.bool_)
        env_done[ended] = True
        timelimit = trunc & ~term
        infos = self._new_infos(active)
        for items in results:
            for e, info, reset_info in items:
                if info:
                    self._add_env_info(infos, e, info)
                if reset_info:
                    self._add_env_info(infos, e, reset_info, "reset_info")
        term_obs = engine.term_buffers[("obs",)] if ended.size else None
        rewards, terminations, truncations = {}, {}, {}
        for agent, k in self._index.items():
            info = infos[agent]
            for flag, name in ((term[:, k], "agent_terminated"), (trunc[:, k], "agent_truncated")):
                early = flag & ~env_done if name == "agent_terminated" else flag & ~term[:, k] & ~env_done
                if early.any():
                    info[name], info["_" + name] = early.copy(), early.copy()
            if term_obs is not None:
                final = np.zeros((self.num_envs, *self._obs_part.shape), dtype=self._obs_part.dtype)
                final[ended] = term_obs[ended, k]
                info["final_obs"], info["_final_obs"] = final, env_done.copy()
            rewards[agent] = rew[:, k].copy()
            terminations[agent] = env_done & ~timelimit[:, k]
            truncations[agent] = env_done & timelimit[:, k]
        return self._obs(engine), rewards, terminations, truncations, infos

    # ---- calls to every env ---------------------------------------------------------------------------
    @serialized
    def render(self) -> tuple:
        """Each env's ``render()``, a tuple over envs (as Gymnasium's vector envs return frames)."""
        return tuple(self._usable("render").call(P.Call.RENDER, None, ()))

    @serialized
    def state(self) -> np.ndarray:
        """Each env's ``state()`` (PettingZoo's global state), stacked over envs."""
        self._usable("state")
        return np.stack(self.call("state"))

    @serialized
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        """Each ``ParallelEnv``'s ``name`` called with the arguments, or its value when it is not
        callable: a tuple over envs (Gymnasium's ``VectorEnv.call``).

        :raises: what the env raised (``AttributeError`` for a name it lacks).
        """
        return tuple(self._usable("call").call(P.Call.ENV_METHOD, None, ("env_call", (name, args, kwargs), {})))

    @serialized
    def get_attr(self, name: str) -> tuple:
        """Each ``ParallelEnv``'s attribute ``name``, a tuple over envs."""
        return tuple(self._usable("get_attr").call(P.Call.ENV_METHOD, None, ("env_call", (name,), {})))

    @serialized
    def set_attr(self, name: str, values: Any) -> None:
        """Sets ``name`` on every ``ParallelEnv``: a list or tuple gives one value per env, anything
        else the same value to all (Gymnasium's ``VectorEnv.set_attr``).

        :raises ValueError: a list whose length is not the number of envs.
        """
        values = per_env_values(values, self.num_envs)
        engine = self._usable("set_attr")
        for e, value in enumerate(values):
            engine.call(P.Call.ENV_METHOD, [e], ("set_env_attr", (name, value), {}))

    @serialized
    def decided(self) -> dict[str, Any]:
        """What the defaults became on this machine, and why, as ``ShmVecEnv.decided``."""
        return decided_of(self)

    # ---- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the workers and frees the shared memory.  Idempotent, bounded in time."""
        engine = self._engine
        if engine is None:
            return
        with engine.closing():
            engine.close()

    def __enter__(self) -> ShmParallelEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
