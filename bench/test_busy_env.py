"""An env whose step burns 200 us of CPU, n_envs=16: time of 20 vec steps.

Answers: once the env itself costs something, do the workers use the cores?  Issue 6's target:
ShmVecEnv at least 1.8x DummyVecEnv on two cores (the limit is the number of cores).
env steps/s = 20 x 16 / mean.
"""
import pytest
from conftest import step_n

STEPS = 20


@pytest.mark.parametrize("backend", ["DummyVecEnv", "SubprocVecEnv", "ShmVecEnv", "AsyncVectorEnv"])
def test_busy_steps(benchmark, open_backend, backend):
    handle, actions = open_backend(backend, "busy-200us", 16)
    benchmark.extra_info["env_steps_per_round"] = STEPS * 16
    benchmark.pedantic(step_n, args=(handle.step, actions, STEPS), rounds=10, iterations=1)
