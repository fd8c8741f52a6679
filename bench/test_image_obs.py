"""Image observations (84x84x4 and 210x160x3 uint8) at n_envs=64: time of 20 vec steps.

Answers: how much does writing observations straight into shared memory save against pickling
them through pipes?  Issue 6's target: ShmVecEnv at least 10x SubprocVecEnv at 84x84x4.
env steps/s = 20 x 64 / mean.
"""
import pytest
from conftest import step_n

STEPS = 20


@pytest.mark.parametrize("env", ["image-84x84x4", "image-210x160x3"])
@pytest.mark.parametrize("backend", ["DummyVecEnv", "SubprocVecEnv", "ShmVecEnv", "AsyncVectorEnv"])
def test_image_steps(benchmark, open_backend, backend, env):
    handle, actions = open_backend(backend, env, 64)
    benchmark.extra_info["env_steps_per_round"] = STEPS * 64
    benchmark.pedantic(step_n, args=(handle.step, actions, STEPS), rounds=5, iterations=1)
