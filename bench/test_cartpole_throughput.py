"""CartPole-v1: time of 100 vec steps per backend at n_envs 8 and 64.

Answers: how many env steps/s does ShmVecEnv reach against every peer on the cheapest common
env (issue 6's first target: CartPole at 64 envs against DummyVecEnv, SubprocVecEnv,
AsyncVectorEnv, PufferLib; PufferLib only through ``python -m shmvec.bench --puffer-python``).
env steps/s = 100 x n_envs / mean.
"""
import pytest
from conftest import local_backends, step_n

STEPS = 100


@pytest.mark.parametrize("n_envs", [8, 64])
@pytest.mark.parametrize("backend", local_backends())
def test_cartpole_steps(benchmark, open_backend, backend, n_envs):
    handle, actions = open_backend(backend, "CartPole-v1", n_envs)
    benchmark.extra_info["env_steps_per_round"] = STEPS * n_envs
    benchmark.pedantic(step_n, args=(handle.step, actions, STEPS), rounds=10, iterations=1)
