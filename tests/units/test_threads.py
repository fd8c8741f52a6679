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
