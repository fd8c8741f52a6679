"""Shared fixtures of the pytest-benchmark files (run with `pytest bench/`; plain `pytest` skips them)."""
import numpy as np
import pytest

from shmvec.bench import machine


@pytest.fixture(scope="session", autouse=True)
def _record_machine(request):
    # pytest-benchmark writes machine_info itself; this adds the core count we reason with.
    request.config._shmvec_machine = machine()


def step_n(venv, actions, n):
    """Steps ``venv`` n times cycling through pre-drawn ``actions``."""
    for k in range(n):
        venv.step(actions[k % len(actions)])


def draw_actions(venv, count=64):
    venv.action_space.seed(0)
    return [np.array([venv.action_space.sample() for _ in range(venv.num_envs)]) for _ in range(count)]
