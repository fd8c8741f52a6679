"""Envs for tests/faults/test_misuse.py (importable: spawned workers import them by name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class EchoEnv(gym.Env):
    """Its observation is the last action it received (and its own index), so a step that
    returned another thread's results shows at once; ``nap`` seconds per step."""

    def __init__(self, index: int = 0, nap: float = 0.0) -> None:
        self.observation_space = spaces.Box(-1e9, 1e9, shape=(2,), dtype=np.float64)
        self.action_space = spaces.Discrete(1_000_000)
        self.index, self.nap = index, nap

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([-1.0, self.index]), {}

    def step(self, action):
        if self.nap:
            time.sleep(self.nap)
        return np.array([float(action), self.index]), 0.0, False, False, {}


def make_echo_env(index: int = 0, nap: float = 0.0) -> gym.Env:
    return EchoEnv(index, nap)


class ParentEnv(gym.Env):
    """Starts a child process of its own (as a simulator would) and reports its pid in its info."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"child": self.child.pid, "worker": os.getpid()}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def close(self):
        self.child.kill()
        self.child.wait()


def make_parent_env() -> gym.Env:
    return ParentEnv()


class NoSpaceEnv(gym.Env):
    """Forgot to set one of its spaces (it stays None)."""

    def __init__(self, which: str = "observation_space") -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        setattr(self, which, None)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


def make_no_space_env(which: str = "observation_space") -> gym.Env:
    return NoSpaceEnv(which)


class ListObsEnv(gym.Env):
    """Returns its observation as a Python list (of ``values``) for an int32 Box."""

    def __init__(self, values: tuple = (1.5, 2.0)) -> None:
        self.observation_space = spaces.Box(-10, 10, shape=(2,), dtype=np.int32)
        self.action_space = spaces.Discrete(2)
        self.values = list(values)

    def reset(self, *, seed=None, options=None):
        return [1, 2], {}

    def step(self, action):
        return list(self.values), 0.0, False, False, {}


def make_list_obs_env(values: tuple = (1.5, 2.0)) -> gym.Env:
    return ListObsEnv(values)
