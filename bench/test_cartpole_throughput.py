"""CartPole-v1 through make_vec_env: time of 100 vec steps per backend at n_envs 8 and 64.

Answers: how many env steps/s does ShmVecEnv reach against DummyVecEnv and SubprocVecEnv
(the issue's targets: >= 2x Dummy and >= 15x Subproc at 64 envs, >= 1.2x Dummy at 8).
Compare the backends' means within one run; absolute times depend on the machine.
"""
import pytest
from conftest import draw_actions, step_n

from shmvec.bench import BACKENDS, make_backend

STEPS = 100


@pytest.mark.parametrize("n_envs", [8, 64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cartpole_steps(benchmark, backend, n_envs):
    venv = make_backend(backend, "CartPole-v1", n_envs)
    try:
        actions = draw_actions(venv)
        venv.reset()
        step_n(venv, actions, 20)
        benchmark.extra_info["env_steps_per_round"] = STEPS * n_envs
        benchmark.pedantic(step_n, args=(venv, actions, STEPS), rounds=10, iterations=1)
    finally:
        venv.close()
