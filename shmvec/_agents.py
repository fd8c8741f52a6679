"""PettingZoo ``ParallelEnv``s as single-agent Gymnasium envs of stacked agents, for the engine.

The engine steps ``gymnasium.Env``s whose spaces live in shared memory; a multi-agent env gets
there through :class:`AgentsEnv`, built in the worker around the ``ParallelEnv`` that the
user's factory returns (:class:`AgentsFactory`; no env is built in the parent).  Its spaces
stack the agents, in ``possible_agents`` order:

- observation: a ``Dict`` of ``obs`` (``(n_agents, *agent_obs_shape)``, a ``Box``, or a
  ``MultiDiscrete`` for ``Discrete`` agent observations), ``rew`` (float32 ``(n_agents,)``),
  ``term`` and ``trunc`` (the agents' own flags, bool ``(n_agents,)``) and ``active`` (bool
  ``(n_agents,)``: the env reported on the agent this step);
- action: ``MultiDiscrete`` of the agents' ``Discrete`` actions, or a ``Box``
  ``(n_agents, *agent_act_shape)``.

So every agent's observation, reward and flags land in the engine's shared buffers.  An agent
that the env does not report on (dead, or not yet born) gets SuperSuit's "black death" row: zero
observation, reward 0, flags False, ``active`` False, and no action is sent for it.  The env
ends when no agent is left alive (``agents`` empty, or every agent in it done this step): the
Gymnasium-level ``terminated``/``truncated`` (``truncated`` when every agent that ended this step
was truncated, not terminated), after which the worker's autoreset resets it and the engine's
terminal observation holds the last stack.

Agents whose spaces differ are refused naming them, or with ``pad=True`` brought to one space as
SuperSuit's ``pad_observations_v0``/``pad_action_space_v0`` do: observations zero-padded to the
largest shape, ``Discrete`` actions to the largest ``n`` (an action out of an agent's own range
becomes 0), ``Box`` actions cut to the agent's own shape.  AEC envs are converted with
PettingZoo's ``aec_to_parallel`` when their metadata says ``is_parallelizable``.

Action masks (sb3-contrib's ``MaskablePPO``), in either of PettingZoo's two conventions: an
agent's observation is a ``Dict`` of ``"observation"`` and ``"action_mask"`` (the row's
observation is then the ``"observation"`` part), or its info has an ``"action_mask"``.
:meth:`AgentsEnv.action_masks` returns every agent's mask of its last reset or step, flat and in
``possible_agents`` order (MaskablePPO's layout for the stacked ``MultiDiscrete``), and the
engine's mask machinery (:mod:`shmvec._masks`) takes it into shared memory.  An agent without a
mask this step (inactive, or none given) has every action allowed; with ``pad=True`` the actions
past an agent's own ``n`` are not.

The rows are fixed when the vec env starts: an agent that is not in ``possible_agents`` has none.
Every reset and step checks the env's reports against them (the keys of its observations,
rewards, terminations, truncations and infos, and its ``agents``), and one that names another
agent raises :class:`shmvec._errors.UnknownAgentError` in the worker (the parent re-raises it with
the worker's traceback, naming the env and the command), at the first reset or step it appears:
its values would otherwise go nowhere, or into other agents' rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec._errors import SpaceError, UnknownAgentError

__all__ = ["AgentsEnv", "AgentsFactory", "agent_spaces", "as_parallel", "homogenize"]

KEYS = ("obs", "rew", "term", "trunc", "active")


def as_parallel(env: Any, index: int | None = None) -> Any:
    """``env`` as a PettingZoo ``ParallelEnv``: itself, or an AEC env through ``aec_to_parallel``.

    :raises TypeError: ``env`` is neither, or an AEC env that PettingZoo cannot run in parallel.
    """
    from pettingzoo import AECEnv, ParallelEnv

    where = f"env_fns[{index}]" if index is not None else "the factory"
    if isinstance(env, ParallelEnv):
        return env
    if isinstance(env, AECEnv):
        if not env.metadata.get("is_parallelizable", False):
            raise TypeError(
                f"{where} returned the AEC env {type(env).__name__}, whose metadata does not say "
                "is_parallelizable: PettingZoo's aec_to_parallel cannot step its agents at once. Return a "
                "ParallelEnv (most PettingZoo envs have a parallel_env() constructor)."
            )
        from pettingzoo.utils.conversions import aec_to_parallel

        return aec_to_parallel(env)
    raise TypeError(
        f"{where} returned {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv. "
        "ShmMultiAgentVecEnv runs PettingZoo envs; use ShmVecEnv for single-agent Gymnasium envs."
    )


def homogenize(all_spaces: Sequence[spaces.Space], agents: Sequence[str], what: str) -> spaces.Space:
    """One space for every agent, as SuperSuit's ``homogenize_spaces`` builds it (Box or Discrete).

    :raises SpaceError: the spaces cannot be padded to one (other types, ndims or dtypes).
    """
    first = all_spaces[0]
    kinds = {type(s) for s in all_spaces}
    if isinstance(first, spaces.Box) and kinds == {spaces.Box}:
        ndims = {len(s.shape) for s in all_spaces}
        dtypes = {np.dtype(s.dtype) for s in all_spaces}
        if len(ndims) == 1 and len(dtypes) == 1:
            shape = tuple(int(d) for d in np.max([s.shape for s in all_spaces], axis=0))
            lows = np.stack([_pad(s.low, shape, np.minimum(0, np.min(s.low))) for s in all_spaces])
            highs = np.stack([_pad(s.high, shape, np.maximum(1e-5, np.max(s.high))) for s in all_spaces])
            return spaces.Box(lows.min(axis=0), highs.max(axis=0), dtype=first.dtype)
    elif isinstance(first, spaces.Discrete) and kinds == {spaces.Discrete}:
        return spaces.Discrete(max(int(s.n) for s in all_spaces))
    listed = ", ".join(f"{a}: {s}" for a, s in zip(agents, all_spaces))
    raise SpaceError(
        f"pad=True cannot bring the agents' {what} spaces to one ({listed}): padding takes Box spaces of one "
        "dtype and number of dimensions, or Discrete spaces, as SuperSuit's pad wrappers do."
    )


def _pad(arr: np.ndarray, shape: tuple[int, ...], value: Any) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.shape == shape:
        return arr
    return np.pad(arr, [(0, n - o) for n, o in zip(shape, arr.shape)], constant_values=value)


MASK_KEY = "action_mask"


def masked_dict(space: spaces.Space) -> bool:
    """Whether ``space`` is PettingZoo's masked observation: a ``Dict`` of ``observation`` and ``action_mask``."""
    return isinstance(space, spaces.Dict) and set(space.spaces) == {"observation", MASK_KEY}


def agent_spaces(env: Any, what: str, pad: bool) -> tuple[spaces.Space, list[spaces.Space]]:
    """The one per-agent ``what`` space (``"observation"`` or ``"action"``), and each agent's own
    (of a masked observation: its ``"observation"`` part).

    :raises SpaceError: the agents' spaces differ (naming them) and ``pad`` is False, or cannot be padded.
    """
    agents = list(env.possible_agents)
    own = [getattr(env, f"{what}_space")(a) for a in agents]
    own = [s["observation"] if masked_dict(s) else s for s in own]
    if all(s == own[0] for s in own):
        common = own[0]
    elif pad:
        common = homogenize(own, agents, what)
    else:
        groups: dict[str, list[str]] = {}
        for a, s in zip(agents, own):
            groups.setdefault(str(s), []).append(a)
        listed = "; ".join(f"{', '.join(names)}: {s}" for s, names in groups.items())
        raise SpaceError(
            f"the agents' {what} spaces differ ({listed}); one policy shared by every agent needs one space. "
            f"Pass pad=True to zero-pad them to one (SuperSuit's pad_observations/pad_action_space semantics)."
        )
    if not isinstance(common, (spaces.Box, spaces.Discrete)):
        raise SpaceError(f"the agents' {what} space {common} is not a Box or Discrete: ShmMultiAgentVecEnv "
                         "stacks agents of those only.")
    return common, own


def stack_space(space: spaces.Space, n: int) -> spaces.Space:
    """``n`` agents' values of ``space`` as one space (Box -> Box, Discrete -> MultiDiscrete)."""
    if isinstance(space, spaces.Discrete):
        return spaces.MultiDiscrete(np.full(n, space.n, dtype=np.int64), start=np.full(n, space.start, dtype=np.int64))
    return spaces.Box(np.stack([space.low] * n), np.stack([space.high] * n), dtype=space.dtype)


def agent_space(stacked: spaces.Space) -> spaces.Space:
    """One agent's space of a :func:`stack_space` (the front-end's row space)."""
    if isinstance(stacked, spaces.MultiDiscrete):
        return spaces.Discrete(int(stacked.nvec[0]), start=int(stacked.start[0]))
    assert isinstance(stacked, spaces.Box)
    return spaces.Box(stacked.low[0], stacked.high[0], dtype=stacked.dtype)


class AgentsFactory:
    """A factory of :class:`AgentsEnv`: the user's ``ParallelEnv`` factory, wrapped in the worker."""

    def __init__(self, env_fn: Callable[[], Any], index: int, pad: bool = False) -> None:
        if not callable(env_fn):
            raise TypeError(f"env_fns[{index}] is a {type(env_fn).__name__}, not a callable that builds an env "
                            "(pass a function, e.g. lambda: simple_spread_v3.parallel_env())")
        self.env_fn, self.index, self.pad = env_fn, index, pad

    def __call__(self) -> AgentsEnv:
        return AgentsEnv(self.env_fn(), pad=self.pad, index=self.index)


class AgentsEnv(gym.Env):
    """A PettingZoo ``ParallelEnv`` as a Gymnasium env of stacked agents (the module docstring).

    Attributes that it does not have itself are read from the ``ParallelEnv`` (``get_attr``).

    :raises TypeError: ``env`` is not a PettingZoo env (see :func:`as_parallel`).
    :raises SpaceError: the agents' spaces differ and ``pad`` is False, or are not Box/Discrete.
    """

    par_env: Any = None

    def __init__(self, env: Any, pad: bool = False, index: int | None = None) -> None:
        self.par_env = env = as_parallel(env, index)
        self.possible_agents = agents = list(env.possible_agents)
        self._index = {agent: k for k, agent in enumerate(agents)}
        self._known = frozenset(agents)
        self._env_index = index
        self.n_agents = n = len(agents)
        self._mask_in_obs = [masked_dict(env.observation_space(a)) for a in agents]
        self.masked_observations = any(self._mask_in_obs)  # (ShmParallelEnv refuses them)
        obs_space, self._own_obs = agent_spaces(env, "observation", pad)
        act_space, self._own_act = agent_spaces(env, "action", pad)
        self._discrete_act = isinstance(act_space, spaces.Discrete)
        # Each agent's mask of the last reset or step (action_masks()); Discrete actions only.
        self._all_allowed = np.ones((n, int(act_space.n) if self._discrete_act else 0), dtype=np.bool_)
        for k, own_act in enumerate(self._own_act):
            if self._discrete_act:
                self._all_allowed[k, int(own_act.n):] = False  # padded actions past the agent's own
        self._masks = self._all_allowed.copy()
        self._pad_obs = [s != obs_space for s in self._own_obs]
        self._pad_act = [s != act_space for s in self._own_act]
        flag = spaces.Box(0, 1, (n,), dtype=np.bool_)
        self.observation_space = spaces.Dict({
            "obs": stack_space(obs_space, n),
            "rew": spaces.Box(-np.inf, np.inf, (n,), dtype=np.float32),
            "term": flag, "trunc": flag, "active": flag,
        })
        self.action_space = stack_space(act_space, n)
        self._obs_shape = (n, *((obs_space.shape or ()) if isinstance(obs_space, spaces.Box) else ()))
        self._obs_dtype = self.observation_space["obs"].dtype
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self.render_mode = getattr(env, "render_mode", None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "par_env":
            raise AttributeError(name)
        return getattr(self.par_env, name)

    def set_env_attr(self, name: str, value: Any) -> None:
        """Sets ``name`` on the ``ParallelEnv`` (the front-end's ``set_attr``)."""
        setattr(self.par_env, name, value)

    def env_call(self, name: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        """The ``ParallelEnv``'s ``name`` called with the arguments, or returned if not callable
        (Gymnasium's ``VectorEnv.call``; this wrapper's own names do not hide the env's)."""
        attr = getattr(self.par_env, name)
        return attr(*args, **(kwargs or {})) if callable(attr) else attr

    def action_masks(self) -> np.ndarray:
        """Every agent's mask of the last reset or step, flat (see the module docstring)."""
        return self._masks.reshape(-1)

    def _take_mask(self, k: int, mask: Any) -> None:
        own = int(self._own_act[k].n)
        self._masks[k, :own] = np.asarray(mask, dtype=np.bool_).reshape(-1)[:own]

    # ---- the stack ------------------------------------------------------------------------------------
    def _stack(self, obs: dict, rews: dict | None, terms: dict | None, truncs: dict | None,
               infos: dict) -> dict:
        n = self.n_agents
        out_obs = np.zeros(self._obs_shape, dtype=self._obs_dtype)
        rew = np.zeros(n, dtype=np.float32)
        term = np.zeros(n, dtype=np.bool_)
        trunc = np.zeros(n, dtype=np.bool_)
        active = np.zeros(n, dtype=np.bool_)
        self._masks[:] = self._all_allowed
        for k, agent in enumerate(self.possible_agents):
            if agent not in obs:
                continue  # black death (or not born yet): zeros, inactive
            value = obs[agent]
            if self._mask_in_obs[k]:
                if self._discrete_act:
                    self._take_mask(k, value[MASK_KEY])
                value = value["observation"]
            info = infos.get(agent)
            if info and MASK_KEY in info and self._discrete_act:
                self._take_mask(k, info[MASK_KEY])
            if self._pad_obs[k]:
                value = _pad(value, self._obs_shape[1:], 0)
            out_obs[k] = value
            active[k] = True
            if rews is not None:
                rew[k] = rews.get(agent, 0.0)
                term[k] = bool(terms.get(agent, False))
                trunc[k] = bool(truncs.get(agent, False))
        return {"obs": out_obs, "rew": rew, "term": term, "trunc": trunc, "active": active}

    def _check_agents(self, call: str, obs: dict, rews: dict | None, terms: dict | None, truncs: dict | None,
                      infos: dict) -> None:
        """:raises UnknownAgentError: the env's ``call`` ("reset", "step") reported an agent that
        is not one of ``possible_agents`` (the module docstring)."""
        known = self._known
        reports = (("observations", obs), ("rewards", rews), ("terminations", terms), ("truncations", truncs),
                   ("infos", infos), ("agents", getattr(self.par_env, "agents", None) or ()))
        for what, reported in reports:
            if reported is not None and not known.issuperset(reported):
                raise self._unknown(next(a for a in reported if a not in known), what, call)

    def _unknown(self, agent: Any, what: str, call: str) -> UnknownAgentError:
        index = self._env_index
        where = f"env {index}" if index is not None else "the env"
        return UnknownAgentError(
            f"{where} ({type(self.par_env).__name__}) reported the agent {agent!r} in the {what} of its {call}(), "
            f"which is not one of its possible_agents {self.possible_agents}: the vec env has one row per possible "
            "agent, fixed when it starts, and none for another. List every agent that can ever appear in "
            "possible_agents (it is read once, from the env as built).",
            agent, index, call, self.possible_agents)

    @staticmethod
    def _infos(infos: dict) -> dict:
        return {agent: info for agent, info in infos.items() if info}

    # ---- Gymnasium API ----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = self.par_env.reset(seed=seed, options=options)
        infos = infos or {}
        self._check_agents("reset", obs, None, None, None, infos)
        return self._stack(obs, None, None, None, infos), self._infos(infos)

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        env = self.par_env
        acts = {}
        for agent in env.agents:
            k = self._index.get(agent)
            if k is None:  # (added to env.agents since its last reset or step)
                raise self._unknown(agent, "agents", "step")
            a = action[k]
            if self._discrete_act:
                if self._pad_act[k] and a >= self._own_act[k].start + self._own_act[k].n:
                    a = self._own_act[k].start  # SuperSuit's dehomogenize_actions: out of range -> the first
            else:
                a = np.array(a)  # its own copy: the shared action buffer is rewritten by the next step
                if self._pad_act[k]:
                    a = a[tuple(slice(0, d) for d in self._own_act[k].shape)]
            acts[agent] = a
        obs, rews, terms, truncs, infos = env.step(acts)
        infos = infos or {}
        self._check_agents("step", obs, rews, terms, truncs, infos)
        stacked = self._stack(obs, rews, terms, truncs, infos)
        ended_now = [a for a in set(terms) | set(truncs) if terms.get(a) or truncs.get(a)]
        alive = [a for a in env.agents if not (terms.get(a) or truncs.get(a))]
        ended = not alive
        truncated = ended and bool(ended_now) and all(truncs.get(a) and not terms.get(a) for a in ended_now)
        return stacked, 0.0, ended and not truncated, truncated, self._infos(infos)

    def render(self) -> Any:
        return self.par_env.render()

    def close(self) -> None:
        if self.par_env is not None:
            self.par_env.close()
