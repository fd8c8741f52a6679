"""Where the workers run (shmvec._placement): trials measure both placements and keep the faster,
on real processes with real CPU affinity (the loop's periods come from a clock the test moves);
steps stay equal to DummyVecEnv's while placements switch; a worker whose affinity cannot be set
stops the trials, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from shmvec import make_env
from shmvec import _placement as PL
from shmvec._machine import TICKS_PER_S, Load

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="placement needs os.sched_setaffinity and two CPUs")

CORES = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


@pytest.fixture
def sleepers():
    """Two real processes (the workers' stand-ins: only their affinity is set)."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL)
             for _ in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


class Clock:
    """The loop's clock: each post comes the loop's time after the last (the workers' affinity
    is real; the periods are given, so that a busy machine cannot change a trial's verdict)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drive(placement: PL.Placement, steps: int, packed_s: float = 0.0, spread_s: float = 0.0, period=None) -> None:
    """``steps`` posts, each after the loop's time in the current placement (``period(placement)``
    if given)."""
    for _ in range(steps):
        placement.clock.now += period(placement) if period else packed_s if placement.packed else spread_s
        placement.posting()


class Readings:
    """The cores' load as the machine reports it (shmvec._machine.read_load), given: other
    processes take ``foreign`` cores, and worker i waits ``waited[i]`` of the time, last on
    ``cpus[i]`` (this process and its workers run one core's worth)."""

    def __init__(self, clock: Clock, pids: list[int], cpus: list[int]) -> None:
        self.clock, self.pids, self.cpus = clock, pids, cpus
        self.foreign, self.waited = 0.0, [0.0] * len(pids)
        self.busy = self.own = 0
        self.waits = [0] * len(pids)
        self.ran = [0] * len(pids)
        self.active = 1.0  # the share of the time the workers want a core (the loop pauses the rest)
        self.at = clock()
        self.readings = 0
        self.per_cpu: dict[int, float] = {}  # each CPU's busy share (none given: not read)
        self.cpu_ticks = {cpu: 0 for cpu in CORES}

    def __call__(self, cores: frozenset[int], pids: list[int]) -> Load:
        span, self.at = self.clock() - self.at, self.clock()
        self.readings += 1
        self.own += round(span * TICKS_PER_S)
        self.busy += round((1.0 + self.foreign) * span * TICKS_PER_S)
        for i, share in enumerate(self.waited):  # (a worker waits or runs ``active`` of the span)
            self.waits[i] += round(share * self.active * span * 1e9)
            self.ran[i] += round((1.0 - share) * self.active * span * 1e9)
        for cpu, share in self.per_cpu.items():
            self.cpu_ticks[cpu] += round(share * span * TICKS_PER_S)
        return Load(self.busy, {os.getpid(): self.own},
                    {pid: (self.waits[i], self.cpus[i], self.ran[i]) for i, pid in enumerate(self.pids)},
                    {cpu: self.cpu_ticks[cpu] for cpu in self.per_cpu})


def placed(sleepers, spins=None) -> tuple[PL.Placement, Readings]:
    clock = Clock()
    pids = [p.pid for p in sleepers]
    readings = Readings(clock, pids, [min(CORES), max(CORES)])
    return PL.Placement(lambda: pids, CORES, (spins if spins is not None else []).append, 0.0, clock=clock,
                        load=readings), readings


def end_hold(placement: PL.Placement) -> None:
    """The hold is over at the next post."""
    placement.held, placement.countdown = placement.hold, 1


def trial_steps(first: bool = False, moves: bool = False) -> int:
    """Posts that complete a trial: the first waits START steps (then spreads the workers); a trial
    whose other placement wins times the first one again."""
    return (2 + moves) * (PL.SETTLE + PL.WINDOW) + (PL.START if first else 0)


def test_a_trial_keeps_the_faster_placement_and_moves_only_the_workers(sleepers):
    spins = []
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, spins.append, 0.0, clock=Clock())
    parent_before = os.sched_getaffinity(0)
    drive(pl, trial_steps(first=True, moves=True), packed_s=0.0002, spread_s=0.003)
    assert pl.packed and pl.phase == "hold" and pl.trials == 1 and pl.switches == 3, pl.as_dict()
    for p in sleepers:
        cores = os.sched_getaffinity(p.pid)
        assert cores < CORES and len(cores) == len(CORES) - 1  # every core but the parent's
    assert os.sched_getaffinity(0) == parent_before  # the user's process is never moved
    assert spins[-1] == PL.PACKED_SPIN_S  # packed, the parent spins on its own core
    shown = pl.as_dict()
    assert shown["value"] == "packed" and "spread" in shown["why"] and "packed" in shown["why"]
    # The next trial (after the hold), with the loop now faster spread: back to every core.
    end_hold(pl)
    drive(pl, 1 + trial_steps(moves=True), packed_s=0.003, spread_s=0.0002)
    assert not pl.packed and pl.phase == "hold" and pl.trials == 2, pl.as_dict()
    for p in sleepers:
        assert os.sched_getaffinity(p.pid) == CORES
    assert spins[-1] == 0.0 and pl.hold == PL.HOLD  # a changed choice holds the shortest time


def test_a_choice_kept_again_is_held_twice_as_long(sleepers):
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    drive(pl, trial_steps(first=True), packed_s=0.003, spread_s=0.0002)
    assert not pl.packed and pl.hold == PL.HOLD
    end_hold(pl)
    drive(pl, 1 + trial_steps(), packed_s=0.003, spread_s=0.0002)
    assert not pl.packed and pl.trials == 2 and pl.hold == 2 * PL.HOLD
    assert pl.switches == 4  # each trial packed once to measure it, then spread back


def test_a_clearly_slower_second_placement_loses_early(sleepers):
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    drive(pl, PL.START + PL.SETTLE + PL.WINDOW + PL.SETTLE + PL.EARLY, packed_s=0.004, spread_s=0.0002)
    assert pl.phase == "hold" and not pl.packed and pl.trials == 1, pl.as_dict()
    assert pl.measured["packed"] > (1 + PL.EARLY_MARGIN) * pl.measured["spread"]


def test_a_move_is_timed_against_the_first_placement_twice(sleepers):
    """One slow window of the first placement (a spell of another process) does not move the workers."""
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    drive(pl, PL.START + PL.SETTLE + PL.WINDOW, packed_s=0.003, spread_s=0.003)  # spread, in a slow spell
    drive(pl, trial_steps(moves=True) - PL.SETTLE - PL.WINDOW, packed_s=0.001, spread_s=0.0002)
    assert not pl.packed and pl.phase == "hold" and pl.trials == 1, pl.as_dict()
    assert len(pl.trial[False]) == 2 and pl.measured["spread"] < pl.measured["packed"]


def test_a_far_slower_other_placement_is_abandoned_within_steps(sleepers):
    """On a core another process keeps busy a step may wait a whole scheduler tick: the trial
    gives the other placement up once its steps take ABANDON times the first's, not EARLY steps."""
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    drive(pl, PL.START + PL.SETTLE + PL.WINDOW, packed_s=0.02, spread_s=0.0002)
    assert pl.packed and pl.watch
    drive(pl, 2, packed_s=0.02, spread_s=0.0002)
    assert not pl.packed and pl.phase == "hold" and pl.trials == 1 and not pl.watch, pl.as_dict()
    assert pl.measured["packed"] > PL.ABANDON * pl.measured["spread"]


def test_a_loop_that_changes_starts_a_trial_at_once(sleepers, monkeypatch):
    monkeypatch.setattr(PL, "SPACING", 0)
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    drive(pl, trial_steps(first=True), packed_s=0.003, spread_s=0.0002)
    assert not pl.packed and pl.phase == "hold" and pl.hold == PL.HOLD
    drive(pl, PL.SETTLE + PL.WINDOW, packed_s=0.003, spread_s=0.0002)  # the same loop: held
    assert pl.phase == "hold" and pl.changes == 0
    pl.suspect = True  # one window off (after a pause) ...
    drive(pl, PL.WINDOW, packed_s=0.003, spread_s=0.0002)
    assert pl.phase == "hold" and pl.changes == 0 and not pl.suspect  # ... and the next one not: held
    for p in sleepers:
        os.sched_setaffinity(p.pid, {min(CORES)})  # the scheduler put both on one core
    for _ in range(2 * PL.WINDOW):  # one window off: the placement is applied again (a repair), no trial
        drive(pl, 1, packed_s=0.003, spread_s=0.001)
        if pl.repairs:
            break
    assert pl.repairs == 1 and pl.changes == 0 and pl.phase == "hold"
    assert all(os.sched_getaffinity(p.pid) == CORES for p in sleepers)
    drive(pl, PL.WINDOW, packed_s=0.003, spread_s=0.0002)  # repaired: the loop is as it was
    assert pl.phase == "hold" and pl.changes == 0 and not pl.suspect
    for _ in range(3 * PL.WINDOW):  # the loop changed (packed is faster now): two whole windows show it
        drive(pl, 1, packed_s=0.0002, spread_s=0.003)
        if pl.changes:
            break
    assert pl.phase == "settle" and pl.changes == 1 and not pl.trial
    drive(pl, trial_steps(moves=True), packed_s=0.0002, spread_s=0.003)
    assert pl.packed and pl.phase == "hold" and pl.hold == PL.HOLD and pl.as_dict()["changes"] == 1
    monkeypatch.setattr(PL, "SPACING", 10**6)  # a change too soon after a trial only repairs
    for _ in range(4 * PL.WINDOW):
        drive(pl, 1, packed_s=0.003, spread_s=0.0002)
    assert pl.changes == 1 and pl.repairs >= 2 and pl.phase == "hold"


def test_packed_must_win_by_the_margin(sleepers):
    """Equal loops: the placement stays spread (a switch has a cost; noise must not flip it)."""
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    drive(pl, trial_steps(first=True), packed_s=0.002, spread_s=0.002)
    assert not pl.packed and pl.trials == 1


def test_a_worker_whose_affinity_cannot_be_set_stops_the_trials(sleepers):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process
    spins = []
    pl = PL.Placement(lambda: [sleepers[0].pid, gone.pid], CORES, spins.append, 0.0, clock=Clock())
    drive(pl, trial_steps(first=True), packed_s=0.0002, spread_s=0.003)
    shown = pl.as_dict()
    assert shown["value"] == "off" and "ProcessLookupError" in shown["why"], shown
    assert not pl.packed and spins[-1] == 0.0
    assert os.sched_getaffinity(sleepers[0].pid) == CORES  # the live one is back on every core
    before = pl.countdown
    drive(pl, 2 * PL.WINDOW, packed_s=0.0, spread_s=0.0)  # stopped: a post does nothing
    assert pl.countdown == before and not pl.periods and pl.as_dict()["value"] == "off"


def test_the_plan_says_when_placement_is_off():
    assert not PL.plan(2, {"cpu_affinity": False}, 0).on
    assert "cpu_affinity" in PL.plan(2, {"cpu_affinity": [0, 1]}, 0).why
    assert "spin_us" in PL.plan(2, {"spin_us": 0}, 0).why
    assert "one worker" in PL.plan(1, {}, 0).why
    assert not PL.plan(1, {}, 0).on


def test_describe_says_what_the_engine_decided():
    from shmvec import ShmVecEnv

    env = ShmVecEnv([make_env("CartPole-v1")] * 2, n_workers=2, start_method="fork")
    off = ShmVecEnv([make_env("CartPole-v1")] * 2, n_workers=2, start_method="fork", cpu_affinity=False)
    try:
        shown = env.describe()["decided"]["placement"]
        if env._engine.placement is not None:  # (this machine's CPU budget decides)
            assert shown["value"] == "spread" and "first trial" in shown["why"]
        else:
            assert shown["value"] == "off" and shown["why"]
        shown_off = off.describe()["decided"]["placement"]
        assert shown_off["value"] == "off" and "cpu_affinity" in shown_off["why"]
    finally:
        env.close()
        off.close()


def test_a_dropped_engine_with_a_placement_is_freed_without_the_collector():
    import gc
    import weakref

    from shmvec import ShmVecEnv

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        env = ShmVecEnv([make_env("CartPole-v1")] * 2, n_workers=2, start_method="fork")
        env.reset()
        engine = weakref.ref(env._engine)
        if engine().placement is None:
            env.close()
            pytest.skip(f"no placement on this machine: {env.describe()['decided']['placement']['why']}")
        env.close()
        del env
        assert engine() is None, "the engine and its placement hold each other"
    finally:
        if enabled:
            gc.enable()


def test_steps_equal_dummy_while_placements_switch(monkeypatch):
    """Placements switching every few steps change where the workers run, never what they return."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv

    monkeypatch.setattr(PL, "START", 1)
    monkeypatch.setattr(PL, "SETTLE", 1)
    monkeypatch.setattr(PL, "WINDOW", 2)
    monkeypatch.setattr(PL, "EARLY", 1)
    monkeypatch.setattr(PL, "HOLD", 1)
    monkeypatch.setattr(PL, "MAX_HOLD", 2)
    monkeypatch.setattr(PL, "MARGIN", -1.0)  # the other placement always "wins": every trial switches
    monkeypatch.setattr(PL, "EARLY_MARGIN", 1e9)
    n = 4
    shm = ShmVecEnv([make_env("CartPole-v1")] * n, n_workers=2, start_method="fork")
    ref = DummyVecEnv([make_env("CartPole-v1")] * n)
    try:
        placement = shm._engine.placement
        if placement is None:
            pytest.skip(f"no placement on this machine: {shm.describe()['decided']['placement']['why']}")
        placement.countdown = 1
        shm.seed(3)
        ref.seed(3)
        np.testing.assert_array_equal(shm.reset(), ref.reset())
        rng = np.random.default_rng(0)
        for _ in range(300):
            actions = rng.integers(0, 2, n)
            got, want = shm.step(actions), ref.step(actions)
            for a, b in zip(got[:3], want[:3]):
                np.testing.assert_array_equal(a, b)
            assert [sorted(i) for i in got[3]] == [sorted(i) for i in want[3]]
        assert placement.switches > 20 and placement.off is None, placement.as_dict()
    finally:
        shm.close()
        ref.close()


HOG = max(CORES) if CORES else 0


def hogged(placement: PL.Placement) -> float:
    """The loop's period with another process on core HOG: slow while a worker may run there."""
    return 0.004 if HOG not in placement.avoid else 0.0002


def until(placement: PL.Placement, done, period, limit: int = 20000) -> int:
    for n in range(limit):
        if done(placement):
            return n
        drive(placement, 1, period=period)
    raise AssertionError(f"not within {limit} steps: {placement.as_dict()}")


def test_a_core_another_process_takes_is_left_out_and_used_again_once_free(sleepers):
    pl, readings = placed(sleepers)
    readings.foreign, readings.waited = 1.0, [0.05, 0.9]  # the worker last seen on HOG waits there
    until(pl, lambda p: p.phase == "hold" and p.avoid, hogged)
    assert pl.avoid == {HOG} and pl.avoids == 1, pl.as_dict()
    # The cores as they were, then each core left out, the most waited-on first.
    assert list(pl.left_out)[:2] == [frozenset(), frozenset({HOG})] and len(pl.left_out) == min(len(CORES), 3) + 1
    assert pl.left_out[frozenset({HOG})] < pl.left_out[frozenset()]
    for p in sleepers:
        assert os.sched_getaffinity(p.pid) == CORES - {HOG}
    shown = pl.as_dict()
    assert shown["cores_left_out"] == [HOG] and "other processes took them" in shown["why"]
    # Still taken: held (no trial of the cores every reading).
    drive(pl, 2000, period=hogged)
    assert pl.avoid == {HOG} and pl.avoids == 1
    # The other process is gone: every core again (and a trial of the placements, the loop changed).
    readings.foreign, readings.waited = 0.0, [0.05, 0.05]
    until(pl, lambda p: not p.avoid, lambda p: 0.0002)
    assert pl.avoids == 2 and pl.phase == "settle"
    for p in sleepers:
        assert os.sched_getaffinity(p.pid) == CORES


def test_a_taken_core_is_found_though_the_loop_pauses_between_readings(sleepers):
    """Workers that step a tenth of the time (the loop pauses, as between a benchmark's rounds or
    PPO's rollouts) and wait for most of it: the wait is a share of the time they wanted a core."""
    pl, readings = placed(sleepers)
    readings.foreign, readings.waited, readings.active = 1.0, [0.05, 0.9], 0.1
    until(pl, lambda p: p.phase == "hold" and p.avoid, hogged)
    assert pl.avoid == {HOG}, pl.as_dict()


def test_no_trial_of_the_cores_while_no_worker_waits_for_one(sleepers):
    pl, readings = placed(sleepers)
    readings.foreign, readings.waited = 1.5, [0.05, 0.1]  # others run, on cores the workers do not need
    drive(pl, 3000, period=lambda p: 0.0002)
    assert readings.readings > 2 and not pl.left_out and not pl.avoid and pl.avoids == 0


def test_a_trial_that_keeps_the_cores_waits_twice_as_long_for_the_next(sleepers):
    pl, readings = placed(sleepers)
    readings.foreign, readings.waited = 1.0, [0.5, 0.5]  # workers wait, and leaving a core out does not help
    until(pl, lambda p: p.left_out and p.phase == "hold", lambda p: 0.001)
    assert not pl.avoid and pl.leave_hold == PL.LEAVE_HOLD_S and len(pl.left_out) == 3  # both cores were tried
    first_end = pl.left_at
    until(pl, lambda p: p.phase == "hold" and p.leave_hold > PL.LEAVE_HOLD_S, lambda p: 0.001, limit=100000)
    assert not pl.avoid and pl.leave_hold == 2 * PL.LEAVE_HOLD_S and pl.avoids == 0
    assert pl.left_at - first_end >= PL.LEAVE_HOLD_S


def test_a_far_slower_set_of_cores_is_abandoned_within_steps(sleepers):
    pl, readings = placed(sleepers)
    # The most waited-on core is not the taken one: leaving it out first puts the workers on HOG.
    readings.foreign, readings.waited = 1.0, [0.9, 0.05]
    periods = {frozenset(): 0.001, frozenset({min(CORES)}): 0.02, frozenset({HOG}): 0.0002}
    until(pl, lambda p: p.phase == "cores", lambda p: 0.0002)
    start = pl.clock()
    until(pl, lambda p: p.phase == "hold", lambda p: periods[p.avoid])
    assert pl.avoid == {HOG} and pl.left_out[frozenset({min(CORES)})] == float("inf"), pl.left_out
    # The first set timed (LEAVE_WINDOW_S at least), the far slower one given up once it took ABANDON
    # times that, the last timed: not the SETTLE + WINDOW steps of 20 ms the far slower would take.
    steps = PL.SETTLE + PL.WINDOW
    assert pl.clock() - start < 3 * PL.LEAVE_WINDOW_S + steps * 0.001 * (1 + PL.ABANDON) + 0.05 < steps * 0.02


def test_a_core_left_out_that_the_other_process_left_is_used_again_and_the_one_it_took_left_out(sleepers):
    """An unpinned process moves: from HOG, onto the core the workers were left on.  The core it
    left is no longer busy: used again; the workers then wait on the other, which is left out."""
    pl, readings = placed(sleepers)
    other = min(CORES)
    readings.foreign, readings.waited = 1.0, [0.05, 0.9]
    readings.per_cpu = {other: 0.6, HOG: 1.0}
    until(pl, lambda p: p.phase == "hold" and p.avoid, hogged)
    assert pl.avoid == {HOG} and pl.avoids == 1
    drive(pl, 2000, period=hogged)  # still there: held
    assert pl.avoid == {HOG} and pl.avoids == 1
    # It moved: as much taken (foreign), but HOG is nearly idle and the workers wait on the other core.
    readings.waited, readings.per_cpu = [0.9, 0.05], {other: 1.0, HOG: 0.2}
    until(pl, lambda p: not p.avoid, lambda p: 0.004)
    assert pl.avoids == 2
    until(pl, lambda p: p.phase == "hold" and p.avoid, lambda p: 0.004 if other not in p.avoid else 0.0002)
    assert pl.avoid == {other} and pl.avoids == 3, pl.as_dict()
    for p in sleepers:
        assert os.sched_getaffinity(p.pid) == CORES - {other}


def test_packed_never_has_the_parent_spin_on_a_core_left_out(sleepers):
    """The parent on a core another process takes: packing the workers off it would leave the
    parent spinning beside that process; it sleeps, as spread."""
    spins: list[float] = []
    pl, _ = placed(sleepers, spins)
    here = min(CORES)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {here})  # the parent stays on one core for the test
    try:
        pl.avoid = frozenset({here})
        pl._apply(True)
        assert spins[-1] == 0.0 and pl.packed
        for p in sleepers:
            assert os.sched_getaffinity(p.pid) == CORES - {here}
    finally:
        os.sched_setaffinity(0, before)


def test_real_workers_leave_a_core_another_process_takes_and_come_back_once_it_is_free():
    """A process that keeps a core busy, started after the vec env: its workers leave that core
    (a step would wait for it), then use it again once the process is gone."""
    import gymnasium as gym

    from shmvec import ShmVectorEnv
    from shmvec._machine import cores_taken

    def quiet_or_skip(when: str) -> None:
        taken = cores_taken()
        if taken.cores:
            pytest.skip(f"{when}, {taken.reason}: this test needs the other cores quiet")

    quiet_or_skip("before the test")
    env = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * (2 * len(CORES)), n_workers=len(CORES),
                       start_method="fork")
    hog = None
    try:
        env.reset(seed=0)
        if env._engine.placement is None:
            pytest.skip(f"no placement on this machine: {env._engine.explain()['placement']['why']}")
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        os.sched_setaffinity(hog.pid, {HOG})
        actions = np.zeros(env.num_envs, dtype=np.int64)

        def step_until(done, seconds: float = 30.0) -> dict:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for _ in range(50):
                    env.step(actions)
                shown = env._engine.explain()["placement"]  # (ShmVecEnv.describe()["decided"])
                if done(shown):
                    return shown
            raise AssertionError(f"not within {seconds} s: {env._engine.explain()['placement']}")

        shown = step_until(lambda shown: shown["cores_left_out"] == [HOG])
        assert "other processes took them" in shown["why"]
        assert all(os.sched_getaffinity(pid) == CORES - {HOG} for pid in env._engine.workers.pids())
        hog.kill()
        hog.wait()
        quiet_or_skip("once the spinning process was killed")
        step_until(lambda shown: shown["cores_left_out"] == [])
        assert all(os.sched_getaffinity(pid) <= CORES for pid in env._engine.workers.pids())
    finally:
        if hog is not None and hog.poll() is None:
            hog.kill()
            hog.wait()
        env.close()


@pytest.mark.parametrize("quiet", [True, False])
def test_the_steps_after_a_lent_gap_are_not_timed_and_trials_say_they_run(sleepers, quiet):
    """torch's lent thread spins on a worker's core after an update (shmvec._threads, "Lending"):
    the steps of QUIET_S after it do not count against the placement a trial times (timed, they
    make the faster placement, packed, lose), and calm() tells the thread decision when a trial
    runs and how many have begun."""
    pl = PL.Placement(lambda: [p.pid for p in sleepers], CORES, lambda s: None, 0.0, clock=Clock())
    if not quiet:  # (the counterfactual: the spin timed)
        pl.quiet = lambda seconds=PL.QUIET_S: None
    assert pl.calm() is None  # the first trial is coming
    spin_left = [0.0]

    def period(placement):  # packed is faster, but the steps just after a lent gap wait out the spin
        base = 0.0003 if placement.packed else 0.0006
        if spin_left[0] > 0:
            spin_left[0] -= 0.002
            return 0.002 + base
        return base

    drive(pl, PL.START + PL.SETTLE + PL.WINDOW + PL.SETTLE, period=period)  # spread timed; packed settles
    assert pl.packed and pl.phase == "measure"
    pl.quiet()  # a lent gap ends as packed's window starts
    spin_left[0] = PL.QUIET_S * 0.5
    for _ in range(4 * PL.WINDOW):
        if pl.phase == "hold":
            break
        drive(pl, 1, period=period)
    assert pl.phase == "hold" and pl.packed is quiet, pl.as_dict()
    assert pl.calm() == 0  # held; no trial began since the first
    end_hold(pl)
    drive(pl, 1, period=period)
    assert pl.calm() is None and pl.begun == 1
    drive(pl, trial_steps(moves=not quiet), period=period)
    assert pl.calm() == 1
