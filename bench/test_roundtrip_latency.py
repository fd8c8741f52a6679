"""Round-trip latency of one vec step with one env of zero cost.

Answers: what does a backend's own machinery cost per step (for ShmVecEnv: the futex wake of the
worker and the completion wake of the parent; for SubprocVecEnv: two pickles through a pipe)?
"""
import pytest
from conftest import local_backends


@pytest.mark.parametrize("backend", [b for b in local_backends() if b != "EnvPool"])
def test_roundtrip(benchmark, open_backend, backend):
    handle, actions = open_backend(backend, "zero-cost", 1, workers=1)
    benchmark(handle.step, actions[0])
