"""Defaults on a machine where another process keeps a core busy (``shmvec._machine.cores_taken``).

A real process spins on a core while the vec env starts: the default ``n_workers`` leaves that
core out and the parent does not spin.  These need at least two cores in the CPU budget.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv
from shmvec._machine import CpuBudget, cores_taken, cpu_budget, usable_cores
from testenvs import make_cartpole

needs_two_cores = pytest.mark.skipif(usable_cores() < 2, reason="needs a CPU budget of two cores or more")


@pytest.fixture
def hog():
    """Another process that keeps one core busy for the test."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    time.sleep(0.3)  # running, as a job already on the machine
    yield proc
    proc.kill()
    proc.wait()


@needs_two_cores
def test_a_busy_core_is_seen_as_taken(hog):
    taken = cores_taken(seconds=0.1)
    assert taken.cores >= 1 and taken.busy >= 1, taken
    assert "other processes kept" in taken.reason


@needs_two_cores
def test_the_default_leaves_the_busy_core_out_and_steps_as_dummy_does(hog):
    n = 2 * usable_cores()
    env = ShmVecEnv([make_cartpole] * n, start_method="fork")
    ref = DummyVecEnv([make_cartpole] * n)
    try:
        assert env.n_workers <= usable_cores() - 1
        decided = env.describe()["decided"]
        assert "other processes" in decided["n_workers"]["why"], decided
        assert decided["spin_us"]["parent"] == 0.0  # no core free for it to spin on
        env.seed(3)
        ref.seed(3)
        np.testing.assert_array_equal(env.reset(), ref.reset())
        for a in np.random.default_rng(0).integers(0, 2, (50, n)):
            got, want = env.step(a), ref.step(a)
            for g, w in zip(got[:3], want[:3]):
                np.testing.assert_array_equal(g, w)
    finally:
        env.close()
        ref.close()


@needs_two_cores
def test_given_workers_are_kept_on_a_busy_machine(hog):
    env = ShmVecEnv([make_cartpole] * 4, n_workers=usable_cores(), start_method="fork")
    try:
        assert env.n_workers == usable_cores()
        assert env.describe()["decided"]["n_workers"]["why"] == "as given"
    finally:
        env.close()


@needs_two_cores
def test_the_workers_of_this_process_are_not_taken_for_other_processes():
    """A second vec env built while the first one's workers still spin after a step gets every core."""
    if cores_taken().cores:
        pytest.skip("other processes keep a core busy on this machine now")
    first = ShmVecEnv([make_cartpole] * 4, start_method="fork", spin_us=(0, 200_000))  # workers spin 0.2 s
    try:
        first.reset()
        first.step(np.zeros(4, dtype=np.int64))
        second = ShmVecEnv([make_cartpole] * 4, start_method="fork")
        try:
            assert second.n_workers == min(4, usable_cores()), second.describe()["decided"]
        finally:
            second.close()
    finally:
        first.close()


def test_not_measured_on_one_core_under_a_quota_or_in_a_cpuset():
    cpuset = CpuBudget(logical=8, affinity=4, physical=4, quota=None, quota_source=None, chosen=4, reason="affinity")
    t = cores_taken(cpuset)
    assert t.cores == 0 and t.busy is None and "cpuset" in t.reason
    one = CpuBudget(logical=4, affinity=4, physical=4, quota=1.5, quota_source="cpu.max", chosen=1, reason="quota")
    assert cores_taken(one).cores == 0 and cores_taken(one).busy is None
    quota = CpuBudget(logical=8, affinity=8, physical=8, quota=3.0, quota_source="cpu.max", chosen=3, reason="quota")
    t = cores_taken(quota)
    assert t.cores == 0 and t.busy is None and "quota" in t.reason


def test_at_least_one_core_is_left():
    budget = cpu_budget()
    taken = cores_taken(budget, seconds=0.05)
    assert 0 <= taken.cores <= max(0, budget.chosen - 1)
