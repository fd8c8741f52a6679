"""Random fault injection: whatever fails, where and under which start method, the error says so.

Each case (one seed) draws the number of envs and workers, the start method, the env that fails,
how (a native crash: SIGSEGV or SIGABRT; ``os._exit``; SIGKILL; an exception; a hang) and where
(``step``, ``reset``, or reading an attribute through ``get_attr``), and when.  It then checks
what the caller gets, against what docs/failures.md promises:

- a worker's death: ``WorkerDiedError`` naming the env it was in (``in env <i>``), with the
  worker's Python stack as ``__cause__`` after a fatal signal (``WorkerStacks``) and no cause
  after ``os._exit`` or SIGKILL (nothing could be written);
- a hang: ``WorkerTimeoutError`` naming the env, with the stuck worker's stack as ``__cause__``;
- an exception: the env's own type, with a note naming the env.

The leak check of ``conftest.py`` runs after every case (no process, segment or descriptor
left).  The default run is a fixed set of cases; longer runs::

    SHMVEC_FAULT_FUZZ_CONFIGS=200 python -m pytest tests/faults/test_fault_fuzz.py -q
    SHMVEC_FAULT_FUZZ_SEED=5000 SHMVEC_FAULT_FUZZ_CONFIGS=200 python -m pytest tests/faults/test_fault_fuzz.py -q
"""

from __future__ import annotations

import functools
import os
import random

import numpy as np
import pytest

import faultenvs
import testenvs
from shmvec import ShmVecEnv, WorkerDiedError, WorkerTimeoutError
from shmvec._errors import WorkerStacks

FIRST_SEED = int(os.environ.get("SHMVEC_FAULT_FUZZ_SEED", "100"))
N_CASES = int(os.environ.get("SHMVEC_FAULT_FUZZ_CONFIGS", "24"))


def _draw(seed: int) -> dict:
    rng = random.Random(seed)
    n = rng.choice([2, 3, 5, 8, 13])
    where = rng.choice(["step", "step", "reset", "attr"])
    return {
        "n": n,
        "n_workers": rng.randint(1, min(n, 4)),
        "method": rng.choice(["fork", "fork", "forkserver", "spawn"]),
        "bad": rng.randrange(n),
        "how": rng.choice(["segv", "abort", "exit", "kill", "raise", "hang"]),
        "where": where,
        "at": 1 if where == "attr" else rng.randint(1, 4),
        "obs_kind": rng.choice(["box", "dict"]),
    }


def _run(case: dict) -> BaseException | None:
    """Drives the vec env until the fault fires; returns what was raised (None: nothing)."""
    n, bad = case["n"], case["bad"]
    fault = {"at": case["at"], "how": case["how"], "where": case["where"]}
    fns = [functools.partial(faultenvs.make_crash_env, i, obs_kind=case["obs_kind"], **(fault if i == bad else {}))
           for i in range(n)]
    env = ShmVecEnv(fns, n_workers=case["n_workers"], start_method=case["method"], timeout=1.5)
    try:
        env.reset()
        for k in range(12):  # at most 4 steps, resets or reads of each kind are needed
            if case["where"] == "attr":
                env.get_attr("explode")
            elif case["where"] == "reset" and k % 3 == 2:
                env.reset()
            else:
                env.step(np.array([(k + i) % 3 for i in range(n)], dtype=np.int64))
    except BaseException as exc:  # noqa: BLE001 - the error under test
        return exc
    finally:
        env.close()
    return None


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_CASES))
def test_a_random_fault_is_reported_as_the_readme_says(seed):
    case = _draw(seed)
    replay = f"case {case} (replay: SHMVEC_FAULT_FUZZ_SEED={seed} SHMVEC_FAULT_FUZZ_CONFIGS=1)"
    exc = _run(case)
    assert exc is not None, f"the fault never fired: {replay}"
    bad, how = case["bad"], case["how"]
    message = str(exc)
    if how == "raise":
        assert isinstance(exc, testenvs.EnvBoom), f"{type(exc).__name__}: {message}; {replay}"
        assert any(f"raised by env {bad} " in note for note in exc.__notes__), f"{exc.__notes__}; {replay}"
        return
    expected = WorkerTimeoutError if how == "hang" else WorkerDiedError
    assert isinstance(exc, expected), f"{type(exc).__name__}: {message}; {replay}"
    assert f"in env {bad}" in message, f"{message}; {replay}"
    if how in ("segv", "abort", "hang"):
        assert isinstance(exc.__cause__, WorkerStacks), f"no stack: {message}; {replay}"
        assert "faultenvs.py" in str(exc.__cause__), f"{exc.__cause__}; {replay}"
    else:  # os._exit and SIGKILL leave nothing to write
        assert exc.__cause__ is None, f"{exc.__cause__!r}; {replay}"
