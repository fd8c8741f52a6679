"""Envs for the asynchronous pool's tests: SpacesEnv with a random step time.

Module level so that ``spawn``/``forkserver`` workers can import it.  The delay is drawn from a
generator of its own, so the observations, rewards and infos stay those of :class:`SpacesEnv`
for the same seed: the pool must reproduce each env's own trajectory whatever order the envs
finish in.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces
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


class CounterEnv(gym.Env):
    """Observation ``[tag, t]``; reward ``10 * tag + t + 0.25 * action``; ends at ``t == 4 + tag % 3``.

    Every transition can be checked on its own: the next observation is ``[tag, t + 1]`` and the
    reward names the env, the time step and the action.  The step time is random (mean ``mean_s``).
    """

    def __init__(self, tag: int = 0, mean_s: float = 0.0005, box: bool = False) -> None:
        self.observation_space = spaces.Box(0.0, 1000.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32) if box else spaces.Discrete(3)
        self.tag = tag
        self.mean_s = mean_s
        self._t = 0
        self._delays = np.random.default_rng(2000 + tag)

    def _obs(self):
        return np.array([self.tag, self._t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        time.sleep(float(self._delays.exponential(self.mean_s)))
        reward = 10.0 * self.tag + self._t + 0.25 * float(np.sum(action))
        self._t += 1
        return self._obs(), reward, self._t >= 4 + self.tag % 3, False, {}


def make_counter_env(index: int = 0, mean_s: float = 0.0005, box: bool = False) -> gym.Env:
    return CounterEnv(index, mean_s, box)
