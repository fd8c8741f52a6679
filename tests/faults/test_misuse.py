"""Misuse and rare faults: two threads, close() from another thread, a forked child, a pool that loses
a worker while others keep it fed, an env's own children, an info that does not load, a missing space.

Each case checks the behaviour docs/failures.md promises: calls from several threads are serialized,
never interleaved; a forked child cannot drive the parent's workers; a dead worker is noticed within
the same bound everywhere; nothing is left running.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

import misuseenvs
import testenvs
from shmvec import ShmEnvPool, ShmVecEnv, ShmVectorEnv, SpaceError, WorkerDiedError
from shmvec._errors import ClosedVecEnvError, ConcurrentCallError, ForkedVecEnvError


def _echo_fns(n: int, nap: float = 0.0) -> list:
    return [functools.partial(misuseenvs.make_echo_env, i, nap) for i in range(n)]


@pytest.mark.parametrize("face", ["ShmVecEnv", "ShmVectorEnv"])
def test_two_threads_stepping_one_vec_env_each_get_their_own_steps(face):
    """An evaluation thread and a training thread share the vec env: every step() returns the
    observations of its own actions (calls are serialized), and neither thread hangs."""
    cls = ShmVecEnv if face == "ShmVecEnv" else ShmVectorEnv
    env = cls(_echo_fns(4), n_workers=2, start_method="fork", timeout=30.0)
    errors: list[BaseException] = []
    steps = 300

    def run(base: int) -> None:
        try:
            for k in range(steps):
                actions = np.full(4, base + k, dtype=np.int64)
                out = env.step(actions)
                obs = out[0]
                assert obs[:, 0].tolist() == [float(base + k)] * 4, (base, k, obs[:, 0].tolist())
                assert obs[:, 1].tolist() == [0.0, 1.0, 2.0, 3.0]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    try:
        env.reset()
        threads = [threading.Thread(target=run, args=(base,)) for base in (0, 100_000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert not errors, errors[0]
        env.step(np.zeros(4, dtype=np.int64))  # still usable
    finally:
        env.close()


def test_a_rare_call_from_another_thread_waits_for_the_step():
    """A logging callback's get_attr() while the training thread steps: serialized, both succeed."""
    env = ShmVecEnv(_echo_fns(4, nap=0.002), n_workers=2, start_method="fork", timeout=30.0)
    stop = threading.Event()
    seen: list = []

    def log() -> None:
        while not stop.is_set():
            seen.append(env.get_attr("index"))

    try:
        env.reset()
        t = threading.Thread(target=log)
        t.start()
        try:
            for k in range(100):
                obs, *_ = env.step(np.full(4, k, dtype=np.int64))
                assert obs[:, 0].tolist() == [float(k)] * 4
        finally:
            stop.set()
            t.join(30)
        assert seen and all(s == [0, 1, 2, 3] for s in seen)
    finally:
        env.close()


def test_step_wait_in_another_thread_than_step_async_is_refused():
    env = ShmVecEnv(_echo_fns(2), n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step_async(np.full(2, 7, dtype=np.int64))
        got: list = []
        t = threading.Thread(target=lambda: got.append(_raises(env.step_wait)))
        t.start()
        t.join(30)
        assert isinstance(got[0], ConcurrentCallError) and "step_async() in thread" in str(got[0])
        obs, *_ = env.step_wait()  # the thread that started it collects it
        assert obs[:, 0].tolist() == [7.0, 7.0]
    finally:
        env.close()


def _raises(func):
    try:
        func()
    except BaseException as exc:
        return exc
    return None


@pytest.mark.parametrize("face", ["ShmVecEnv", "ShmVectorEnv", "ShmEnvPool"])
def test_close_from_another_thread_while_a_step_waits(face):
    """The waiting thread gets ClosedVecEnvError (or its step, if it was done), never an
    AttributeError from inside shmvec; close() returns promptly and everything is released."""
    fns = _echo_fns(2, nap=2.0)
    if face == "ShmEnvPool":
        env = ShmEnvPool(fns, batch_size=2, n_workers=2, start_method="fork", timeout=30.0)
    else:
        env = (ShmVecEnv if face == "ShmVecEnv" else ShmVectorEnv)(fns, n_workers=2, start_method="fork",
                                                                    timeout=30.0)
    got: list = []

    def step() -> None:
        got.append(_raises(lambda: env.step(np.zeros(2, dtype=np.int64))))

    env.reset()
    t = threading.Thread(target=step)
    t.start()
    time.sleep(0.3)  # the step waits for the workers (2 s naps)
    start = time.monotonic()
    env.close()
    assert time.monotonic() - start < 10.0
    t.join(30)
    assert not t.is_alive()
    assert got and (got[0] is None or isinstance(got[0], ClosedVecEnvError)), repr(got[0])
    with pytest.raises(ClosedVecEnvError):
        env.step(np.zeros(2, dtype=np.int64))


def test_a_forked_child_cannot_drive_the_parents_workers():
    """os.fork() after building: the child's step raises ForkedVecEnvError at once, its close()
    leaves the parent's workers alone, and the parent's next step works."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = _echo_fns(3)
    env, ref = ShmVecEnv(fns, n_workers=2, start_method="fork", timeout=30.0), DummyVecEnv(fns)
    try:
        env.reset()
        ref.reset()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                try:
                    env.step(np.ones(3, dtype=np.int64))
                except ForkedVecEnvError as exc:
                    code = 0 if "os.fork()" in str(exc) else 2
                env.close()
                os.write(write, bytes([code]))
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        assert os.read(read, 1) == b"\x00"
        os.close(read)
        for k in range(5):
            act = np.full(3, k, dtype=np.int64)
            np.testing.assert_array_equal(env.step(act)[0], ref.step(act)[0])
    finally:
        env.close()
        ref.close()


def test_a_pool_kept_busy_by_other_workers_notices_a_dead_worker():
    """Worker 1 is killed while worker 0 keeps every recv() fed: recv() raises WorkerDiedError
    within the bound of a ShmVecEnv (a few POLL_S), instead of serving worker 0's envs for ever."""
    pool = ShmEnvPool(_echo_fns(4, nap=0.001), batch_size=1, n_workers=2, start_method="fork", timeout=30.0)
    try:
        pool.reset()
        for _ in range(3):
            pool.recv()  # every env reset and received once: all four are free to send
        ids = np.arange(4)
        pool.send(np.zeros(4, dtype=np.int64), ids)
        victim = pool._engine.workers.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="worker 1"):
            while time.monotonic() - start < 20.0:
                _, _, _, _, infos = pool.recv()
                env_id = infos["env_id"]
                pool.send(np.zeros(1, dtype=np.int64), env_id)
        assert time.monotonic() - start < 5.0
    finally:
        pool.close()


def test_an_envs_own_children_end_with_its_killed_worker():
    """A simulator started by the env (subprocess.Popen) does not outlive its worker."""
    env = ShmVecEnv([misuseenvs.make_parent_env] * 2, n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        children = [info["child"] for info in env.reset_infos]
        assert all(psutil.pid_exists(c) for c in children)
        os.kill(env._engine.workers.processes[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            for _ in range(100):
                env.step(np.zeros(2, dtype=np.int64))
                time.sleep(0.01)
        deadline = time.monotonic() + 5.0
        while _alive(children[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(children[0]), "the killed worker's env child is still running"
        assert _alive(children[1])  # the live worker's env keeps its child until close()
    finally:
        env.close()
    assert not any(_alive(c) for c in children)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_info_that_does_not_load_names_the_worker_and_its_envs():
    env = ShmVecEnv([testenvs.make_unloadable_info_env] * 2, n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(Exception, match="only the worker can rebuild this") as info:
            env.step(np.zeros(2, dtype=np.int64))
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "worker 0 (env 0)" in notes and "step" in notes and "plain data" in notes
    finally:
        env.close()


@pytest.mark.parametrize("which", ["observation_space", "action_space"])
def test_an_env_without_a_space_is_named(which):
    fns = [functools.partial(misuseenvs.make_no_space_env, which)] * 2
    with pytest.raises(SpaceError, match=rf"env 0's {which} is None .*set self.{which}"):
        ShmVecEnv(fns, n_workers=1, start_method="fork")


def test_a_list_of_floats_for_an_integer_box_is_checked_as_an_array_would_be():
    """[1.5, 2.0] for an int32 Box raises ObservationError (as np.array([1.5, 2.0]) does), where it
    was truncated silently; whole floats in a list are taken, as in an array."""
    from shmvec import ObservationError

    env = ShmVecEnv([functools.partial(misuseenvs.make_list_obs_env, (1.5, 2.0))], n_workers=1, start_method="fork")
    try:
        np.testing.assert_array_equal(env.reset(), [[1, 2]])
        with pytest.raises(ObservationError, match="dtype float64, which does not cast to the space's int32"):
            env.step(np.zeros(1, dtype=np.int64))
    finally:
        env.close()
    env = ShmVecEnv([functools.partial(misuseenvs.make_list_obs_env, (3.0, -4.0))], n_workers=1, start_method="fork")
    try:
        env.reset()
        obs, *_ = env.step(np.zeros(1, dtype=np.int64))
        assert obs.dtype == np.int32 and obs.tolist() == [[3, -4]]
    finally:
        env.close()
