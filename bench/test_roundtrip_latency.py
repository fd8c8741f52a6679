"""Round-trip latency of one vec step with envs of zero cost.

Answers: what does the signalling itself cost (futex wake of each worker, completion
wake of the parent), with 1 and 2 workers, one env each?
"""
import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVecEnv


class ZeroCost(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("n_workers", [1, 2])
def test_roundtrip(benchmark, n_workers):
    venv = ShmVecEnv([ZeroCost] * n_workers, n_workers=n_workers, start_method="fork")
    try:
        venv.reset()
        actions = np.zeros(n_workers, dtype=np.int64)
        benchmark(venv.step, actions)
    finally:
        venv.close()
