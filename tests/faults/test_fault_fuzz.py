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

The same faults go through ``ShmEnvPool`` (send/recv), and through one ``ShmVecEnv`` called from
two threads at once (the first failing call reports the fault, later ones ``BrokenVecEnvError``,
and no thread hangs).

The leak check of ``conftest.py`` runs after every case (no process, segment or descriptor
left).  The default run is a fixed set of cases; longer runs::

    SHMVEC_FAULT_FUZZ_CONFIGS=200 python -m pytest tests/faults/test_fault_fuzz.py -q
    SHMVEC_FAULT_FUZZ_SEED=5000 SHMVEC_FAULT_FUZZ_CONFIGS=200 python -m pytest tests/faults/test_fault_fuzz.py -q
"""

from __future__ import annotations

import functools
import os
import random
import threading

import numpy as np
import pytest

import faultenvs
import testenvs
from shmvec import BrokenVecEnvError, ShmEnvPool, ShmVecEnv, WorkerDiedError, WorkerTimeoutError
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
    n = case["n"]
    env = ShmVecEnv(_fns(case), n_workers=case["n_workers"], start_method=case["method"], timeout=1.5)
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


def _fns(case: dict) -> list:
    fault = {"at": case["at"], "how": case["how"], "where": case["where"]}
    return [functools.partial(faultenvs.make_crash_env, i, obs_kind=case["obs_kind"],
                              **(fault if i == case["bad"] else {})) for i in range(case["n"])]


def _run_pool(case: dict) -> BaseException | None:
    """As ``_run``, through ShmEnvPool (send/recv of every env, and ``get_attr``)."""
    n = case["n"]
    pool = ShmEnvPool(_fns(case), batch_size=n, n_workers=case["n_workers"], start_method=case["method"],
                      timeout=1.5)
    try:
        pool.reset()
        for k in range(12):
            if case["where"] == "attr":
                pool.get_attr("explode")
            elif case["where"] == "reset" and k % 3 == 2:
                pool.reset()
            else:
                pool.step(np.array([(k + i) % 3 for i in range(n)], dtype=np.int64))
    except BaseException as exc:  # noqa: BLE001 - the error under test
        return exc
    finally:
        pool.close()
    return None


def _run_threads(case: dict) -> tuple[BaseException | None, list[BaseException]]:
    """As ``_run``, with two threads calling the same vec env at once: the first failure (in time)
    and what each thread raised.  Nothing may hang: both threads end."""
    n = case["n"]
    env = ShmVecEnv(_fns(case), n_workers=case["n_workers"], start_method=case["method"], timeout=1.5)
    raised: list[BaseException] = []
    lock = threading.Lock()

    def drive(offset: int) -> None:
        try:
            for k in range(12):
                if case["where"] == "attr" and offset:
                    env.get_attr("explode")
                elif case["where"] == "reset" and k % 3 == 2:
                    env.reset()
                else:
                    env.step(np.array([(k + i + offset) % 3 for i in range(n)], dtype=np.int64))
        except BaseException as exc:  # noqa: BLE001 - the error under test
            with lock:
                raised.append(exc)

    try:
        env.reset()
        threads = [threading.Thread(target=drive, args=(offset,)) for offset in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), f"a thread hung: {case}"
    finally:
        env.close()
    return (raised[0] if raised else None), raised


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_CASES))
def test_a_random_fault_is_reported_as_the_readme_says(seed):
    case = _draw(seed)
    replay = f"case {case} (replay: SHMVEC_FAULT_FUZZ_SEED={seed} SHMVEC_FAULT_FUZZ_CONFIGS=1)"
    _check(_run(case), case, replay)


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_CASES // 3))
def test_a_random_fault_in_a_pool_is_reported_as_in_a_vec_env(seed):
    case = _draw(seed + 7919)
    replay = f"pool case {case} (seed {seed + 7919})"
    _check(_run_pool(case), case, replay)


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_CASES // 3))
def test_a_random_fault_with_two_threads_is_reported_once_and_nothing_hangs(seed):
    """The first failing call raises the fault as a single thread would; every later call, in
    either thread, raises BrokenVecEnvError naming it."""
    case = _draw(seed + 104729)
    replay = f"two-thread case {case} (seed {seed + 104729})"
    first, raised = _run_threads(case)
    _check(first, case, replay)
    for exc in raised[1:]:
        assert isinstance(exc, BrokenVecEnvError) or type(exc) is type(first), f"{exc!r}; {replay}"


def _check(exc: BaseException | None, case: dict, replay: str) -> None:
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
