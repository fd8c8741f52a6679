"""An env whose info is non-empty on every step (MuJoCo-style reward terms), n_envs=64.

Answers: does a non-empty info on every step erase shmvec's advantage?  Infos travel
pickled through each worker's shared-memory mailbox, not a pipe; compare with the
CartPole-v1 numbers of test_cartpole_throughput.py.
"""
import pytest
from conftest import draw_actions, step_n

from shmvec.bench import make_backend

STEPS = 100


@pytest.mark.parametrize("backend", ["DummyVecEnv", "ShmVecEnv"])
def test_info_steps(benchmark, backend):
    venv = make_backend(backend, "CartPole-info", 64)
    try:
        actions = draw_actions(venv)
        venv.reset()
        step_n(venv, actions, 20)
        benchmark.pedantic(step_n, args=(venv, actions, STEPS), rounds=10, iterations=1)
    finally:
        venv.close()
