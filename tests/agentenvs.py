"""PettingZoo test envs for ShmMultiAgentVecEnv (an importable module: spawned workers find them).

- :class:`DyingAgents`: agents that die at different times (each lives a random number of
  steps drawn at reset), an env truncated at ``max_steps``, and infos on some steps;
- :class:`MixedSpaces`: agents whose observation and action spaces differ (for ``pad=True``);
- :class:`SerialOnlyAEC`: an AEC env whose metadata does not say ``is_parallelizable``.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv


class DyingAgents(ParallelEnv):
    metadata = {"name": "dying_agents_v0", "render_modes": []}

    def __init__(self, n_agents: int = 3, max_steps: int = 12, max_life: int = 10, late_agent: bool = False):
        self.possible_agents = [f"agent_{k}" for k in range(n_agents)]
        self.max_steps, self.max_life, self.late_agent = max_steps, max_life, late_agent
        self._obs_space = spaces.Box(-10.0, 10.0, (3,), dtype=np.float32)
        self._act_space = spaces.Discrete(3)
        self.render_mode = None
        self.rng = np.random.default_rng()
        self.agents: list[str] = []

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _obs(self, agent):
        k = self.possible_agents.index(agent)
        return np.array([k, self.t, self.rng.uniform(-1, 1)], dtype=np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.life = {a: int(self.rng.integers(1, self.max_life + 1)) for a in self.possible_agents}
        self.agents = list(self.possible_agents)
        if self.late_agent:  # the last agent is born at step 2
            self.agents = self.agents[:-1]
        obs = {a: self._obs(a) for a in self.agents}
        return obs, {a: ({"born": 0} if k == 0 else {}) for k, a in enumerate(self.agents)}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.t += 1
        obs, rews, terms, truncs, infos = {}, {}, {}, {}, {}
        for a in self.agents:
            obs[a] = self._obs(a)
            rews[a] = float(actions[a]) * 0.5 + self.rng.normal()
            terms[a] = self.t >= self.life[a]
            truncs[a] = self.t >= self.max_steps and not terms[a]
            infos[a] = {"t": self.t} if self.t % 3 == 0 else {}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        late = self.possible_agents[-1]
        if self.late_agent and self.t == 2 and self.agents and late not in self.agents:
            self.agents.append(late)
            obs[late], rews[late], terms[late], truncs[late], infos[late] = self._obs(late), 0.0, False, False, {}
        return obs, rews, terms, truncs, infos


class MixedSpaces(DyingAgents):
    """agent_0 sees 3 values and picks among 3 actions; the others see (2,) and pick among 5."""

    metadata = {"name": "mixed_spaces_v0", "render_modes": []}

    def observation_space(self, agent):
        return self._obs_space if agent == "agent_0" else spaces.Box(-10.0, 10.0, (2,), dtype=np.float32)

    def action_space(self, agent):
        return self._act_space if agent == "agent_0" else spaces.Discrete(5)

    def _obs(self, agent):
        full = super()._obs(agent)
        return full if agent == "agent_0" else full[:2]

    def step(self, actions):
        for a, act in actions.items():
            assert self.action_space(a).contains(act), (a, act)
        self.seen = dict(actions)
        return super().step(actions)


class SerialOnlyAEC(AECEnv):
    metadata = {"name": "serial_only_v0", "render_modes": []}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["a", "b"]


class Faulty(DyingAgents):
    """Fails in its ``fail_at``-th step: raises, or kills its worker (once per ``marker`` file, when given)."""

    def __init__(self, fail_at: int = 2, how: str = "raise", marker: str | None = None):
        super().__init__(n_agents=2, max_steps=50, max_life=50)
        self.fail_at, self.how, self.marker = fail_at, how, marker

    def step(self, actions):
        import os
        import signal

        if self.t + 1 == self.fail_at:
            if self.how == "raise":
                raise RuntimeError("boom in a multi-agent step")
            if self.marker is None or not os.path.exists(self.marker):
                if self.marker is not None:
                    open(self.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return super().step(actions)


class MaskedAgents(DyingAgents):
    """Agents with action masks, in either of PettingZoo's conventions (``mask_in``: ``"obs"``, a
    Dict of ``observation`` and ``action_mask``; or ``"info"``): a random non-empty subset of the 4
    actions is allowed per agent and step, and a step with a disallowed action raises."""

    metadata = {"name": "masked_agents_v0", "render_modes": []}

    def __init__(self, mask_in: str = "obs", n_agents: int = 3, max_steps: int = 12, max_life: int = 10):
        super().__init__(n_agents, max_steps, max_life)
        self.mask_in = mask_in
        self._act_space = spaces.Discrete(4)
        self._masked_space = spaces.Dict({"observation": self._obs_space,
                                          "action_mask": spaces.Box(0, 1, (4,), dtype=np.int8)})
        self.masks: dict = {}

    def observation_space(self, agent):
        return self._masked_space if self.mask_in == "obs" else self._obs_space

    def _mask(self, agent):
        mask = self.rng.integers(0, 2, 4).astype(np.int8)
        mask[self.rng.integers(4)] = 1
        self.masks[agent] = mask
        return mask

    def _with_masks(self, obs, infos):
        self.masks = {}  # the masks of the agents in these observations
        for a in list(obs):
            mask = self._mask(a)
            if self.mask_in == "obs":
                obs[a] = {"observation": obs[a], "action_mask": mask}
            else:
                infos[a] = {**(infos.get(a) or {}), "action_mask": mask}
        return obs, infos

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed, options)
        return self._with_masks(obs, dict(infos))

    def step(self, actions):
        for a, act in actions.items():
            if not self.masks[a][act]:
                raise ValueError(f"{a} took action {act}, which its mask {self.masks[a]} does not allow")
        obs, rews, terms, truncs, infos = super().step(actions)
        obs, infos = self._with_masks(obs, dict(infos))
        return obs, rews, terms, truncs, infos


class RenderedAgents(DyingAgents):
    """DyingAgents with ``render_mode="rgb_array"`` frames and a global ``state()`` that follow its episode."""

    metadata = {"name": "rendered_agents_v0", "render_modes": ["rgb_array"]}

    def __init__(self, n_agents: int = 2):
        super().__init__(n_agents, 12, 10)
        self.render_mode = "rgb_array"

    def render(self):
        return np.full((4, 5, 3), (self.t * 7 + int(self.rng.integers(0, 2 ** 8))) % 256, dtype=np.uint8)

    def state(self):
        return np.array([self.t, len(self.agents), *self.life.values()], dtype=np.float32)
