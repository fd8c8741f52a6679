"""Dict observations (a float vector, a 16x16x1 uint8 image, a discrete flag), n_envs=64.

Answers: does a Dict space (one shared buffer per leaf) cost more than a flat Box?  Compare with
CartPole-v1 in test_cartpole_throughput.py.
"""
import pytest
from conftest import step_n

STEPS = 100


@pytest.mark.parametrize("backend", ["DummyVecEnv", "SubprocVecEnv", "ShmVecEnv", "SyncVectorEnv"])
def test_dict_steps(benchmark, open_backend, backend):
    handle, actions = open_backend(backend, "dict-obs", 64)
    benchmark.pedantic(step_n, args=(handle.step, actions, STEPS), rounds=10, iterations=1)
