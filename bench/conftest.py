"""Shared fixtures of the pytest-benchmark files.

Run with ``python -m pytest bench/`` (plain ``pytest`` collects only ``tests/``).  Each file
answers one question; compare the backends' times within one run (pytest-benchmark records the
machine; the core count we reason with is added to each benchmark's ``extra_info``).  The envs and
backends are those of ``python -m shmvec.bench`` (``shmvec._bench``); a backend that is not
installed is skipped.
"""

import pytest

from shmvec._bench import backends as B
from shmvec._bench.measures import ACTION_BATCHES, cores


@pytest.fixture
def open_backend(request):
    """``open_backend(name, env, n_envs, workers=cores)`` builds, resets and returns ``(handle, actions)``;
    closed after the test."""
    opened = []

    def _open(name, env, n_envs, workers=None):
        backend = B.get(name)
        reason = "runs in its own interpreter: use python -m shmvec.bench --puffer-python" if backend.remote \
            else backend.missing()
        if reason:
            pytest.skip(f"{name}: {reason}")
        if not backend.supports(env):
            pytest.skip(f"{name} runs only its own envs ({', '.join(backend.envs or ())})")
        handle = B.build(name, B.BuildSpec(env, n_envs, workers or cores(), "fork"))
        opened.append(handle)
        handle.reset()
        actions = handle.sample_actions(ACTION_BATCHES)
        step_n(handle.step, actions, 20)  # warm up: first episodes, caches, worker spin state
        return handle, actions

    yield _open
    for handle in opened:
        handle.close()


@pytest.fixture(autouse=True)
def _record_machine(request):
    bm = request.node.funcargs.get("benchmark")
    if bm is not None:
        bm.extra_info["cores"] = cores()


def step_n(step, actions, n):
    """Calls ``step`` n times, cycling through pre-drawn ``actions``."""
    m = len(actions)
    for k in range(n):
        step(actions[k % m])


def local_backends():
    """Every registered backend that runs in this interpreter (installed or not: missing ones skip)."""
    return [name for name, b in B.REGISTRY.items() if not b.remote]
