"""An env whose info is non-empty on every step (MuJoCo-style reward terms), n_envs=64.

Answers: does a non-empty info on every step erase shmvec's advantage?  Infos travel pickled
through each worker's shared-memory mailbox, not a pipe; compare with test_cartpole_throughput.py.
"""
import pytest
from conftest import step_n

STEPS = 100


@pytest.mark.parametrize("backend", ["DummyVecEnv", "SubprocVecEnv", "ShmVecEnv", "SyncVectorEnv"])
def test_info_steps(benchmark, open_backend, backend):
    handle, actions = open_backend(backend, "CartPole-info", 64)
    benchmark.pedantic(step_n, args=(handle.step, actions, STEPS), rounds=10, iterations=1)
