"""Envs for tests/faults/test_edge_promises_pools.py: pool envs that hang or take their time.

Module level so that ``spawn``/``forkserver`` workers can import it (as ``import edgeenvs_pools``).
"""

from __future__ import annotations

import time

import gymnasium as gym

from poolenvs import CounterEnv


class HangAtEnv(CounterEnv):
    """A :class:`poolenvs.CounterEnv` (never-ending episodes) whose step number ``hang_at``
    (1 = the first step after a reset) sleeps ``hang_s``: an env that hangs; every other step
    takes ``step_s``."""

    def __init__(self, tag: int = 0, hang_at: int | None = None, hang_s: float = 60.0, step_s: float = 0.0) -> None:
        super().__init__(tag, mean_s=0.0)
        self.hang_at = hang_at
        self.hang_s = hang_s
        self.step_s = step_s
        self._steps = 0

    def reset(self, *, seed=None, options=None):
        self._steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._steps += 1
        time.sleep(self.hang_s if self._steps == self.hang_at else self.step_s)
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


def make_hang_env(index: int = 0, hang_at: int | None = None, hang_s: float = 60.0, step_s: float = 0.0) -> gym.Env:
    return HangAtEnv(index, hang_at, hang_s, step_s)
