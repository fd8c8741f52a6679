"""The leak checks of conftest.py detect what they claim to detect."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver
import os
import secrets
import subprocess
import sys
from multiprocessing.shared_memory import SharedMemory

import pytest

from conftest import find_leaks, take_snapshot


def test_clean_state_has_no_leaks():
    assert find_leaks(take_snapshot(), grace_s=0.0) == []


@pytest.mark.allow_leaks
def test_detects_shared_memory_segment():
    before = take_snapshot()
    shm = SharedMemory(name=f"shmvec_leaktest_{secrets.token_hex(4)}", create=True, size=64)
    try:
        problems = find_leaks(before, grace_s=0.2)
        assert any(shm.name in p and "shared-memory" in p for p in problems), problems
    finally:
        shm.close()
        shm.unlink()
    assert find_leaks(before, grace_s=0.0) == []


@pytest.mark.allow_leaks
def test_detects_open_file_descriptor():
    before = take_snapshot()
    r, w = os.pipe()
    try:
        problems = find_leaks(before, grace_s=0.2)
        assert any(f"file descriptor {r} " in p for p in problems), problems
        assert any(f"file descriptor {w} " in p for p in problems), problems
    finally:
        os.close(r)
        os.close(w)
    assert find_leaks(before, grace_s=0.0) == []


@pytest.mark.allow_leaks
def test_detects_child_process():
    before = take_snapshot()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        problems = find_leaks(before, grace_s=0.2)
        assert any(f"pid {proc.pid} " in p for p in problems), problems
    finally:
        proc.kill()
        proc.wait()
    assert find_leaks(before, grace_s=0.0) == []


def _sleep_forever():  # module level: importable by forkserver children
    import time

    time.sleep(60)


@pytest.mark.allow_leaks
def test_detects_forkserver_grandchild_but_not_the_forkserver():
    ctx = mp.get_context("forkserver")
    # Start the forkserver (and resource tracker) first: they are helpers, not leaks.
    warmup = ctx.Process(target=os.getpid)
    warmup.start()
    warmup.join()
    warmup.close()
    before = take_snapshot()
    assert find_leaks(before, grace_s=0.0) == []
    proc = ctx.Process(target=_sleep_forever, daemon=True)
    proc.start()
    try:
        problems = find_leaks(before, grace_s=0.2)
        assert any(f"pid {proc.pid} " in p for p in problems), problems
        assert not any(f"pid {mp.forkserver._forkserver._forkserver_pid} " in p for p in problems)
    finally:
        proc.kill()
        proc.join()
        proc.close()
    assert find_leaks(before) == []


@pytest.mark.allow_leaks
def test_ignores_library_segments_of_other_processes():
    """Segments named shmvec_<pid>_... by an unrelated process (a benchmark running beside) are not ours."""
    before = take_snapshot()
    mine = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=64)
    # pid 1 is neither this process nor one of its descendants
    other = SharedMemory(name=f"shmvec_1_{secrets.token_hex(4)}", create=True, size=64)
    try:
        problems = find_leaks(before, grace_s=0.0)
        segments = [p for p in problems if p.startswith("shared-memory segment")]
        assert any(mine.name in p for p in segments), problems
        assert not any(other.name in p for p in segments), problems
    finally:
        for shm in (mine, other):
            shm.close()
            shm.unlink()
    assert find_leaks(before, grace_s=0.0) == []


def test_a_forked_copy_of_a_vec_envs_resources_lets_its_mapping_go_quietly():
    """A fork worker of a second vec env inherits the first one's garbage (a dropped env in a
    reference cycle); its collector runs the finalizer there, which must not stop or free the
    parent's workers and block, and must drop its copy of the mapping without the BufferError
    that SharedMemory.__del__ printed while views of it were still alive."""
    import os
    import sys
    from multiprocessing.shared_memory import SharedMemory

    import numpy as np

    from shmvec._workers import WorkerSet

    res = WorkerSet.__new__(WorkerSet)  # no workers: only the block matters here
    res.shm = SharedMemory(create=True, size=4096)
    name = res.shm.name
    try:
        view = np.frombuffer(res.shm.buf, dtype=np.uint8)  # alive in the same garbage
        res.owner_pid = os.getpid() + 1  # as seen from a forked child
        unraisable = []
        old, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            assert res.release() == []
            shm, res.shm = res.shm, None
            del shm  # SharedMemory.__del__
        finally:
            sys.unraisablehook = old
        assert not unraisable, [u.exc_value for u in unraisable]
        del view
    finally:
        SharedMemory(name=name).unlink()


def test_a_bare_fork_child_that_exits_leaves_the_parents_workers_alone():
    """A child of os.fork() (a user's own, a library's) inherits multiprocessing's set of children;
    its normal exit (multiprocessing's exit function) terminated the daemonic ones: our workers."""
    import os
    from multiprocessing import util

    import numpy as np
    import testenvs

    from shmvec import ShmVecEnv

    env = ShmVecEnv(testenvs.bare_env_fns(2), n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        pid = os.fork()
        if pid == 0:  # the child: exits as a Python program does, then leaves at once
            try:
                util._exit_function()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        env.step(np.zeros(2, dtype=np.int64))  # was WorkerDiedError: worker 0 ... SIGTERM
        assert all(p.is_alive() for p in env._engine.workers.processes)
    finally:
        env.close()
