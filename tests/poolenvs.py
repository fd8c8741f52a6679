"""Envs for the asynchronous pool's tests: SpacesEnv with a random step time.

Module level so that ``spawn``/``forkserver`` workers can import it.  The delay is drawn from a
generator of its own, so the observations, rewards and infos stay those of :class:`SpacesEnv`
for the same seed: the pool must reproduce each env's own trajectory whatever order the envs
finish in.
"""

from __future__ import annotations

import time

import numpy as np
from gymnasium.wrappers import TimeLimit

from testenvs import SpacesEnv


class JitterEnv(SpacesEnv):
    """A ``SpacesEnv`` whose ``step`` sleeps an exponentially distributed time (mean ``mean_s``)."""

    def __init__(self, *args, mean_s: float = 0.001, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mean_s = mean_s
        self._delays = np.random.default_rng(1000 + self.tag)

    def step(self, action):
        time.sleep(float(self._delays.exponential(self.mean_s)))
        return super().step(action)


def make_jitter_env(obs_kind: str = "box", act_kind: str = "discrete", index: int = 0, mean_s: float = 0.001):
    env = JitterEnv(obs_kind, act_kind, tag=index, mean_s=mean_s)
    return TimeLimit(env, max_episode_steps=6 + index % 5)
