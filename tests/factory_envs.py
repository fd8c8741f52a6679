"""Envs for the factory, start-up, seeding and isolation tests (importable by spawned workers).

Importing this module registers ``FactoryProbe-v0`` with Gymnasium, so the id
``"factory_envs:FactoryProbe-v0"`` makes ``gym.make`` (and :func:`shmvec.make_env`) import it.
"""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ProbeEnv(gym.Env):
    """A small seeded env that reports facts about the process it lives in.

    ``loaded_modules()`` lists ``sys.modules``; ``cpus()`` its CPU affinity; ``pid()`` its
    process; ``built`` the (start, end) wall-clock times of its construction, which sleeps
    ``build_s`` seconds.  Observations and rewards come from ``np_random`` (deterministic given
    the reset seed).
    """

    metadata = {"render_modes": []}

    def __init__(self, size: int = 3, build_s: float = 0.0, import_torch: bool = False) -> None:
        start = time.time()
        if import_torch:
            import torch  # noqa: F401  (an env that needs torch)
        if build_s:
            time.sleep(build_s)
        self.size = size
        self.observation_space = spaces.Box(-5.0, 5.0, shape=(size,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.built = (start, time.time())
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.normal(size=self.size).astype(np.float32), {}

    def step(self, action):
        self._t += 1
        obs = self.np_random.normal(size=self.size).astype(np.float32)
        reward = float(self.np_random.normal()) + float(action)
        terminated = bool(self.np_random.random() < 0.1)
        return obs, reward, terminated, False, {}

    def loaded_modules(self) -> list[str]:
        return sorted(sys.modules)

    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    def pid(self) -> int:
        return os.getpid()


def make_probe(size: int = 3, build_s: float = 0.0, import_torch: bool = False) -> gym.Env:
    return ProbeEnv(size, build_s, import_torch)


gym.register(id="FactoryProbe-v0", entry_point="factory_envs:ProbeEnv", max_episode_steps=20)


# ---------------------------------------------------------------------------------------------
# One instance per process
# ---------------------------------------------------------------------------------------------

_INSTANCES_IN_THIS_PROCESS = 0


class SingletonSimEnv(ProbeEnv):
    """Stands in for a simulator that loads once per process (a DLL, a license-bound binary).

    Constructing a second instance in the same process raises RuntimeError.
    """

    def __init__(self, size: int = 3) -> None:
        global _INSTANCES_IN_THIS_PROCESS
        if _INSTANCES_IN_THIS_PROCESS:
            raise RuntimeError(f"SingletonSimEnv: a second instance in process {os.getpid()}; one per process only")
        _INSTANCES_IN_THIS_PROCESS += 1
        super().__init__(size)


def make_singleton_sim(size: int = 3) -> gym.Env:
    return SingletonSimEnv(size)


class ReportProcess(gym.Wrapper):
    """A wrapper that adds the process probes of :class:`ProbeEnv` to any env (e.g. CartPole)."""

    def loaded_modules(self) -> list[str]:
        return sorted(sys.modules)

    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    def pid(self) -> int:
        return os.getpid()

    def import_pid(self) -> int:
        return IMPORTED_IN_PID


# The process that imported this module: a worker itself, or the forkserver when preloaded.
IMPORTED_IN_PID = os.getpid()


def make_probe_4() -> gym.Env:
    """A module-level factory without arguments (described by its import string)."""
    return ProbeEnv(4)


# ---------------------------------------------------------------------------------------------
# Factories that return something else than a Gymnasium env (the errors say what to do)
# ---------------------------------------------------------------------------------------------

class ParallelEnv:
    """Stands in for PettingZoo's ``ParallelEnv`` (not installed): shmvec knows it by its module."""

    __module__ = "pettingzoo.utils.env"


class UserParallelEnv(ParallelEnv):
    """A user's multi-agent env, a subclass of PettingZoo's ParallelEnv, in the user's module."""

    __module__ = __name__
    possible_agents = ["a", "b"]


class OldGymEnv:
    """Stands in for an env of the old ``gym`` package (``gym.core.Env``)."""

    __module__ = "gym.core"


def make_parallel_env() -> UserParallelEnv:
    return UserParallelEnv()


def make_old_gym_env() -> OldGymEnv:
    return OldGymEnv()


def make_vector_env() -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")


def make_nothing() -> None:
    ProbeEnv()  # built, but not returned


def make_probe_class() -> type:
    return ProbeEnv
