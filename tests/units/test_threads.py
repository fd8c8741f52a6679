"""The parent's torch threads while workers run (``parent_threads``, shmvec._threads), on real vec envs.

torch is loaded in the test process (conftest sets it to one thread); each test sets the count
it starts from and restores the suite's afterwards.  The once-per-process warning is checked in
a fresh interpreter, where no earlier test has shown it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from shmvec import ParentThreadsWarning, ShmVecEnv, ShmVectorEnv
from shmvec import _threads as T
from shmvec._machine import usable_cores
from helpers import TESTS_DIR, pythonpath
from testenvs import make_cartpole


@pytest.fixture
def threads():
    """Sets torch's threads to the count a test asks for; restores the suite's count afterwards."""
    before = torch.get_num_threads()

    def start_from(n: int) -> None:
        torch.set_num_threads(n)

    yield start_from
    torch.set_num_threads(before)


def free_cores(n_workers: int) -> int:
    return max(1, usable_cores() - n_workers)


def vec(n_workers: int = 1, **kw):
    return ShmVecEnv([make_cartpole] * 2, n_workers=n_workers, start_method="fork", **kw)


def test_auto_leaves_the_cores_the_workers_need_and_restores_at_close(threads):
    threads(usable_cores() + 3)
    with pytest.warns(ParentThreadsWarning) if not T._warned else _no_check():
        env = vec(n_workers=1)
    try:
        assert torch.get_num_threads() == free_cores(1)
        d = env._engine.threads
        assert (d.option, d.before, d.after) == ("auto", usable_cores() + 3, free_cores(1))
        assert "spin" in d.reason and "restored at close" in d.reason
    finally:
        env.close()
    assert torch.get_num_threads() == usable_cores() + 3


def test_no_change_when_torch_already_fits(threads):
    threads(1)
    env = vec(n_workers=1)
    try:
        assert torch.get_num_threads() == 1
        d = env._engine.threads
        assert d.after is None and "left as they are" in d.reason
    finally:
        env.close()
    assert torch.get_num_threads() == 1


def test_the_last_close_restores_and_a_users_change_is_kept(threads):
    threads(usable_cores() + 2)
    a = vec(n_workers=1)
    b = ShmVectorEnv([make_cartpole] * 2, n_workers=1, start_method="fork", parent_threads=1)
    try:
        assert torch.get_num_threads() == 1
        a.close()
        assert torch.get_num_threads() == 1  # b still runs
    finally:
        a.close()
        b.close()
    assert torch.get_num_threads() == usable_cores() + 2
    # The user sets a count while the vec env runs: theirs stays after close.
    c = vec(n_workers=1)
    try:
        torch.set_num_threads(3)
    finally:
        c.close()
    assert torch.get_num_threads() == 3


def test_none_leaves_torch_alone_and_a_number_sets_it(threads):
    threads(usable_cores() + 3)
    env = vec(n_workers=1, parent_threads=None)
    try:
        assert torch.get_num_threads() == usable_cores() + 3
        assert "parent_threads=None" in env._engine.threads.reason
    finally:
        env.close()
    env = vec(n_workers=1, parent_threads=2)
    try:
        assert torch.get_num_threads() == 2
    finally:
        env.close()
    assert torch.get_num_threads() == usable_cores() + 3


def test_omp_num_threads_is_the_users_choice(threads, monkeypatch):
    threads(usable_cores() + 3)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    env = vec(n_workers=1)
    try:
        assert torch.get_num_threads() == usable_cores() + 3
        assert "OMP_NUM_THREADS is set" in env._engine.threads.reason
    finally:
        env.close()


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-1, ValueError), (1.5, TypeError), ("all", TypeError),
                                      (True, TypeError)])
def test_bad_values_are_refused(bad, exc):
    with pytest.raises(exc, match="parent_threads"):
        vec(parent_threads=bad)


def test_describe_says_what_was_decided(threads):
    threads(usable_cores() + 3)
    env = vec(n_workers=1)
    try:
        d = env.describe()
        assert d["options"]["parent_threads"] == "auto"
        assert d["decided"]["parent_threads"]["after"] == free_cores(1)
        assert d["decided"]["n_workers"]["value"] == 1
    finally:
        env.close()


def test_the_warning_is_shown_once_per_process_and_says_how_to_keep_torchs_count():
    code = textwrap.dedent("""
        import warnings
        import torch
        from shmvec import ShmVecEnv, ParentThreadsWarning
        from shmvec._machine import usable_cores
        from testenvs import make_cartpole
        torch.set_num_threads(usable_cores() + 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                env = ShmVecEnv([make_cartpole] * 2, n_workers=1, start_method="fork")
                env.close()
        shown = [w for w in caught if issubclass(w.category, ParentThreadsWarning)]
        assert len(shown) == 1, [str(w.message) for w in caught]
        text = str(shown[0].message)
        assert "parent_threads=None" in text and "torch.set_num_threads(" in text, text
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": pythonpath(TESTS_DIR)})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


class _no_check:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_auto_follows_the_gap_between_steps(threads):
    """A heavy policy (long gaps between steps) gets torch's own count back; a light one is reduced again;
    one long gap (an update) among short ones changes nothing."""
    import time

    threads(usable_cores() + 3)
    env = vec(n_workers=1)
    d = env._engine.threads
    try:
        reduced, own = free_cores(1), usable_cores() + 3

        def gaps(seconds: float, n: int = T.GAPS) -> None:
            for _ in range(n):
                d.returned = time.perf_counter() - seconds
                d.posting()

        assert torch.get_num_threads() == reduced
        gaps(0.001, T.GAPS - 1)
        gaps(0.5, 1)  # an update between rollouts
        assert torch.get_num_threads() == reduced
        gaps(2 * T.HEAVY_GAP_S)
        assert torch.get_num_threads() == own and "heavy policy" in d.reason
        gaps(T.LIGHT_GAP_S / 2)
        assert torch.get_num_threads() == reduced and "light policy" in d.reason
        # Steps really run between: the gaps come from step() itself.
        env.reset()
        for _ in range(2 * T.GAPS):
            env.step(np.zeros(2, dtype=np.int64))
        assert torch.get_num_threads() == reduced
        torch.set_num_threads(5)  # the user's own count: no longer followed
        gaps(2 * T.HEAVY_GAP_S)
        assert torch.get_num_threads() == 5 and not d.adaptive
    finally:
        env.close()


class _Training:
    """Drives a real vec env's thread decision through rollouts and updates on a fake clock:
    ``period`` light steps, then an update that takes ``update_s`` at torch's reduced count and
    ``lent_update_s`` at its own, after which a lent update costs the next rollout ``spin_s``
    (torch's second thread spinning on a worker's core)."""

    def __init__(self, d, period: int, update_s: float, lent_update_s: float, spin_s: float = 0.0):
        self.d, self.period, self.now = d, period, 100.0
        self.update_s, self.lent_update_s, self.spin_s = update_s, lent_update_s, spin_s
        self.threads_in_updates: list[int] = []
        self.threads_in_steps: set[int] = set()
        d.clock = lambda: self.now

    def iteration(self, before_update=None) -> None:
        d = self.d
        spin = self.spin_s if self.threads_in_updates and self.threads_in_updates[-1] == self.own else 0.0
        for k in range(self.period):
            self.now += 1e-4 + (spin if k == 0 else 0.0)  # the policy's gap (and the spin, once)
            d.posting()
            self.threads_in_steps.add(torch.get_num_threads())
            self.now += 2e-4  # the step
            d.stepped()
        if before_update:
            before_update()
        n = torch.get_num_threads()
        self.threads_in_updates.append(n)
        self.now += self.lent_update_s if n == self.own else self.update_s

    own = usable_cores() + 3


@pytest.mark.parametrize("faster", [True, False])
def test_auto_lends_torch_its_threads_through_updates_only_where_that_is_faster(threads, faster):
    """Long gaps every ``period`` steps (PPO's updates): after two, a trial alternates updates at
    torch's own count and at the reduced one, timing whole iterations; lending stays where it won
    (the update on more threads), not where torch's spin into the next rollout cost more."""
    threads(usable_cores() + 3)
    env = vec(n_workers=1)
    d = env._engine.threads
    try:
        reduced = free_cores(1)
        if faster:
            run = _Training(d, period=16, update_s=0.05, lent_update_s=0.03, spin_s=0.002)
        else:
            run = _Training(d, period=16, update_s=0.05, lent_update_s=0.045, spin_s=0.02)
        for _ in range(2 + T.TRIAL + 3):
            run.iteration()
        own = _Training.own
        assert run.threads_in_steps == {reduced}  # every step, and the policy before it, at the reduced count
        # Two long gaps find the period; the next starts the trial: not lent, lent, not lent, lent.
        if faster:
            assert run.threads_in_updates[:2 + T.TRIAL] == [reduced] * 2 + [reduced, own, reduced, own]
            assert run.threads_in_updates[2 + T.TRIAL:] == [own] * 3
        else:  # the first lent iteration far slower: the trial ends there
            assert run.threads_in_updates == [reduced] * 3 + [own] + [reduced] * (T.TRIAL + 1)
        assert d.lend is faster and d.period == 16
        said = env.describe()["decided"]["parent_threads"]["long_gaps"]
        assert said["every"] == 16 and said["lending"] == ("lent" if faster else "kept")
        assert ("gets its" in said["why"]) is faster
        # The choice holds LEND_HOLD iterations, then another trial; the same choice holds twice as long.
        for _ in range(T.LEND_HOLD + T.TRIAL):
            run.iteration()
        assert d.lend is faster and d.hold == 2 * T.LEND_HOLD
    finally:
        env.close()
    assert torch.get_num_threads() == _Training.own


def test_lending_stops_for_a_users_count_a_short_gap_and_a_close(threads):
    """A count the user sets in a lent gap is theirs (no more following); a gap predicted long that
    is not forgets the period; a vec env closed in a lent gap gives the other holders their count back."""
    threads(usable_cores() + 3)
    env, other = vec(n_workers=1), vec(n_workers=1)
    d = env._engine.threads
    try:
        reduced, own = free_cores(1), _Training.own
        run = _Training(d, period=8, update_s=0.05, lent_update_s=0.03)
        for _ in range(2 + T.TRIAL + 1):
            run.iteration()
        assert d.lend is True and run.threads_in_updates[-1] == own
        # A longer rollout (an evaluation between two): the gap predicted long is short.
        run.period = 12
        run.iteration()
        assert d.confirmed == 0 and run.threads_in_updates[-1] == reduced
        run.period = 8
        for _ in range(3):
            run.iteration()
        assert run.threads_in_updates[-1] == own  # found again: the trial's choice still holds
        # Closed in a lent gap: the other vec env still holds the reduced count.
        env.close()
        assert torch.get_num_threads() == reduced
        other.close()
        assert torch.get_num_threads() == own
        # The user's count in a lent gap: kept, and the decision stops following.
        other = vec(n_workers=1)
        d2 = other._engine.threads
        run2 = _Training(d2, period=8, update_s=0.05, lent_update_s=0.03)
        for _ in range(2 + T.TRIAL + 1):
            run2.iteration()
        assert torch.get_num_threads() == own and d2.lent
        torch.set_num_threads(3)
        run2.iteration()
        assert not d2.adaptive and torch.get_num_threads() == 3
    finally:
        env.close()
        other.close()


def test_no_gap_is_lent_while_the_placement_is_tried_nor_an_iteration_across_a_trial_compared(threads):
    """The workers' placement times the loop too (shmvec._placement): while it tries a placement
    (calm() None) no gap is lent and the iteration is not timed; an iteration during which a trial
    began (its count changed) is not compared either."""
    threads(usable_cores() + 3)
    env = vec(n_workers=1)
    d = env._engine.threads
    try:
        reduced, own = free_cores(1), _Training.own
        placement = {"calm": 0}
        d.calm = lambda: placement["calm"]
        run = _Training(d, period=8, update_s=0.05, lent_update_s=0.03)
        for _ in range(2 + 1):
            run.iteration()  # the period found; the first predicted gap marks
        placement["calm"] = None  # a placement trial: not lent, nothing recorded
        for _ in range(3):
            run.iteration()
        assert run.threads_in_updates[-3:] == [reduced] * 3 and d.iterations == [] and d.lend is None
        placement["calm"] = 1  # held again, one trial later: the trial of lending starts over
        for _ in range(1 + T.TRIAL):
            run.iteration()
        assert run.threads_in_updates[-T.TRIAL - 1:] == [reduced, own, reduced, own, own] and d.lend is True
        placement["calm"] = 2  # a trial began and ended within one iteration: that one is not counted
        held = d.held
        run.iteration()
        assert d.held == held and run.threads_in_updates[-1] == own
    finally:
        env.close()
