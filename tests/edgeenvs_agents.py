"""PettingZoo test envs for the edges of the multi-agent faces (an importable module: spawned workers find them).

- :class:`TwoAgents`: two agents, ``Discrete(3)`` actions (or ``Box`` ones), a step counter in
  every observation, an optional nap in each step (to interrupt a step in the parent);
- :class:`Intruder`: a :class:`TwoAgents` that reports an agent outside ``possible_agents``,
  ``"intruder"``, in one of its reports (``where``) at its reset, its ``at``-th step, or the
  reset the worker's autoreset makes after the first episode (``when``).
"""

from __future__ import annotations

import time

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

AGENTS = ["agent_0", "agent_1"]
WHERE = ("observations", "rewards", "terminations", "truncations", "infos", "agents")


class TwoAgents(ParallelEnv):
    metadata = {"name": "two_agents_v0", "render_modes": []}

    def __init__(self, actions: str = "discrete", nap_s: float = 0.0, episode: int = 50):
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._obs_space = spaces.Box(-1e6, 1e6, (2,), dtype=np.float32)
        self._act_space = (spaces.Discrete(3) if actions == "discrete"
                           else spaces.Box(-1.0, 1.0, (2,), dtype=np.float32))
        self.nap_s, self.episode = nap_s, episode
        self.t = 0
        self.resets = 0
        self.last_actions: dict = {}
        self.render_mode = None

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent), self.t], dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.resets += 1
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        if self.nap_s:
            time.sleep(self.nap_s)
        self.last_actions = {a: np.asarray(v).tolist() for a, v in actions.items()}
        self.t += 1
        done = self.t >= self.episode
        obs = {a: self._obs(a) for a in self.agents}
        rews = {a: float(self.t) for a in self.agents}
        terms = {a: done for a in self.agents}
        truncs = {a: False for a in self.agents}
        infos = {a: {"t": self.t} for a in self.agents}
        if done:
            self.agents = []
        return obs, rews, terms, truncs, infos


class Intruder(TwoAgents):
    """Reports ``"intruder"`` in ``where`` (one of :data:`WHERE`) at ``when``: ``"reset"`` (its
    first reset), ``"step"`` (its ``at``-th step) or ``"autoreset"`` (its second reset, which the
    worker makes in the step that ends the first episode, of ``at`` steps); only if ``intrude``."""

    def __init__(self, where: str, when: str = "step", at: int = 2, intrude: bool = True):
        super().__init__(episode=at if when == "autoreset" else 50)
        assert where in WHERE and when in ("reset", "step", "autoreset")
        if when == "reset" or when == "autoreset":
            assert where in ("observations", "infos", "agents")  # what a reset reports
        self.where, self.when, self.at, self.intrude = where, when, at, intrude

    def _add(self, reports: dict) -> None:
        if self.where == "agents":
            self.agents = [*self.agents, "intruder"]
            return
        value = {"observations": np.zeros(2, dtype=np.float32), "rewards": 5.0, "terminations": False,
                 "truncations": False, "infos": {"secret": 1}}[self.where]
        reports[self.where]["intruder"] = value

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed, options)
        if self.intrude and (self.when == "reset" and self.resets == 1 or self.when == "autoreset" and self.resets == 2):
            self._add({"observations": obs, "infos": infos})
        return obs, infos

    def step(self, actions):
        actions = {a: v for a, v in actions.items() if a != "intruder"}
        obs, rews, terms, truncs, infos = super().step(actions)
        if self.intrude and self.when == "step" and self.t == self.at:
            self._add({"observations": obs, "rewards": rews, "terminations": terms, "truncations": truncs,
                       "infos": infos})
        return obs, rews, terms, truncs, infos


def intruder_fns(n_envs: int, bad: int, **kwargs) -> list:
    """Factories of :class:`Intruder`; only env ``bad`` intrudes."""
    import functools

    return [functools.partial(Intruder, intrude=(i == bad), **kwargs) for i in range(n_envs)]


def two_agents_fns(n_envs: int, **kwargs) -> list:
    import functools

    return [functools.partial(TwoAgents, **kwargs) for _ in range(n_envs)]
