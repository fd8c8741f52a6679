"""Start-up time: construct a vec env and take its first ``reset()``.

Answers: how long until the first observation, for ShmVecEnv (one worker per core building a
slice of the envs, workers started in parallel) against SB3's ``SubprocVecEnv`` and
Gymnasium's ``AsyncVectorEnv`` (one process per env), with CartPole-v1 and the ``fork`` and
``forkserver`` start methods; and what ``preload=["torch"]`` saves when every env imports torch.

Each round runs in a fresh interpreter (``python -m shmvec._startup --one``), so that a
forkserver or an import cache left by one round does not help the next; the timed region
starts after that interpreter has imported SB3 and Gymnasium.  ``python -m shmvec._startup``
prints the same measurements as a table (256 envs by default).

Run with ``pytest bench/test_startup.py``; plain ``pytest`` does not collect ``bench/``.
"""

import pytest

from shmvec._startup import measure_fresh

N_ENVS = 64

# pytest-benchmark reads this clock before and after each round.  It advances only by the time
# the fresh interpreter measured (construct + first reset), so the table shows that time, not
# the interpreter's start-up and imports around it.
_inner_clock = [0.0]


def _clock() -> float:
    return _inner_clock[0]


pytestmark = pytest.mark.benchmark(timer=_clock, group="startup")


def _run(benchmark, *args, **kwargs):
    results = []

    def once():
        seconds = measure_fresh(*args, **kwargs)
        results.append(seconds)
        _inner_clock[0] += seconds[0]

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info["construct_and_reset_s"] = results[0][0]
    if len(results[0]) > 1:
        benchmark.extra_info["second_vec_env_s"] = results[0][1]


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
@pytest.mark.parametrize("backend", ["shmvec", "subproc", "async"])
def test_startup_cartpole(benchmark, backend, start_method):
    if backend == "subproc" and start_method != "fork":
        # Every SubprocVecEnv worker imports SB3 (and torch): minutes for 64 envs on 2 cores.
        pytest.skip("SubprocVecEnv with forkserver: see python -m shmvec._startup --backends subproc")
    _run(benchmark, backend, N_ENVS, start_method)


@pytest.mark.parametrize("preload", [None, ["torch"]], ids=["no-preload", "preload-torch"])
def test_startup_forkserver_preload_torch(benchmark, preload):
    options = {"envs_per_worker": 1}
    if preload:
        options["preload"] = preload
    _run(benchmark, "shmvec", 8, "forkserver", env="torch", options=options, repeats=2)
