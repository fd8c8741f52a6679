"""Promises of the pools (ShmEnvPool, ShmVecEnvPool) at the edges: a hung env in a fed pool, a
forked child that closes the pool, a nearly full /dev/shm (issue 36, items 7 to 9).

- ``timeout=`` bounds each env's step from its ``send()``: an env that hangs while other workers
  keep every ``recv()`` fed raises WorkerTimeoutError naming it (and the envs queued behind it),
  while an env that finished and waits for a slow caller is never late.
- A child of ``os.fork()`` that closes the pool, or drops its last reference to it, drops only
  its own mapping: the parent's pool goes on (docs/failures.md).
- Every segment a pool creates has its pages reserved: a /dev/shm without room for them raises
  ShmVecEnvError at construction, never SIGBUS (tested in a small tmpfs mounted over /dev/shm in
  a mount namespace of its own, where the machine lets the test mount one).

The fuzz at the end draws pools (envs, workers, batch size, start method), the env that hangs and
when, the caller's pauses and a forked child that closes the pool on the way; more cases::

    SHMVEC_POOL_EDGE_FUZZ_CONFIGS=40 python -m pytest tests/faults/test_edge_promises_pools.py -q -k fuzz
"""

from __future__ import annotations

import errno
import functools
import gc
import json
import os
import random
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest

import edgeenvs_pools
from helpers import TESTS_DIR, pythonpath
from shmvec import ShmEnvPool, ShmVecEnvError, WorkerTimeoutError
from shmvec._errors import ForkedVecEnvError

START_METHODS = ["fork", "forkserver", "spawn"]
FUZZ_SEED = int(os.environ.get("SHMVEC_POOL_EDGE_FUZZ_SEED", "3600"))
FUZZ_CASES = int(os.environ.get("SHMVEC_POOL_EDGE_FUZZ_CONFIGS", "4"))


def _fns(n: int, hang: dict[int, int] | None = None, step_s: float = 0.0) -> list:
    """``n`` counter envs; env i hangs at its step ``hang[i]``."""
    hang = hang or {}
    return [functools.partial(edgeenvs_pools.make_hang_env, i, hang.get(i), 60.0, step_s) for i in range(n)]


def _receive_all(pool: ShmEnvPool) -> np.ndarray:
    """After reset(): receives the envs still waiting while a batch is there; returns those that
    can be sent (all of them when ``batch_size`` divides ``num_envs``)."""
    while pool._in_flight.sum() >= pool.batch_size:
        pool.recv()
    return np.flatnonzero(~pool._in_flight)


def _keep_fed(pool: ShmEnvPool, seconds: float) -> None:
    """recv() one batch and send it back, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        infos = pool.recv()[4]
        ids = infos["env_id"]
        pool.send(np.zeros(len(ids), dtype=np.int64), ids)


# ---- 7. the timeout bounds each env's step, also in a pool that other workers keep fed -------------------
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_hung_env_in_a_fed_pool_times_out_naming_it_and_the_env_queued_behind_it(start_method):
    """Env 0 hangs at its first step, env 1 is queued behind it on worker 0, and worker 1's envs
    keep every recv() fed: recv() raises within about ``timeout`` of their send, naming both."""
    pool = ShmEnvPool(_fns(4, hang={0: 1}), batch_size=1, n_workers=2, start_method=start_method, timeout=1.5)
    try:
        pool.reset()
        _receive_all(pool)
        start = time.monotonic()
        pool.send(np.zeros(4, dtype=np.int64))  # worker 0: env 0 (hangs), then env 1
        with pytest.raises(WorkerTimeoutError) as info:
            _keep_fed(pool, 12.0)
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert "the steps of envs 0, 1 did not finish within 1.5 s of their send()" in message, message
        assert "worker 0, in env 0 (env 1 queued behind it)" in message, message
        assert "worker 1" not in message, message  # its envs kept coming back
        assert "call close()" in message, message
        assert 1.4 < elapsed < 6.0, elapsed
        with pytest.raises(ShmVecEnvError, match="unusable"):
            pool.recv()
    finally:
        pool.close()  # terminates the hung worker


def test_a_hung_env_times_out_while_a_slow_one_keeps_arriving_and_a_slow_caller_is_never_late():
    """timeout=1.5: env 0 takes 0.4 s a step (always within it); the caller sleeps 2 s between
    send() and recv() (the envs finished meanwhile: not late); then env 1 hangs while env 0 keeps
    arriving every 0.4 s (no wait ever lasts 1.5 s): recv() raises for env 1 alone."""
    fns = [functools.partial(edgeenvs_pools.make_hang_env, 0, None, 60.0, 0.4),
           functools.partial(edgeenvs_pools.make_hang_env, 1, 3, 60.0, 0.0)]
    pool = ShmEnvPool(fns, batch_size=1, n_workers=2, start_method="fork", timeout=1.5)
    try:
        pool.reset()
        _receive_all(pool)
        for _ in range(2):  # env 1's steps 1 and 2, env 0's 1 and 2
            pool.send(np.zeros(2, dtype=np.int64))
            time.sleep(2.0)  # a long learner step: both envs finished and wait in the queue
            assert sorted(int(pool.recv()[4]["env_id"][0]) for _ in range(2)) == [0, 1]
        pool.send(np.zeros(2, dtype=np.int64))  # env 1's step 3 hangs
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            _keep_fed(pool, 12.0)
        assert time.monotonic() - start < 5.0
        message = str(info.value)
        assert "the step of env 1 did not finish within 1.5 s of its send()" in message, message
        assert "env 0" not in message, message
    finally:
        pool.close()


def test_step_envs_with_a_hung_env_times_out_from_its_send():
    """step_envs([0, 1]): env 0 back after 1 s, env 1 hung; timeout=1.2 counts from the send
    (raises about 1.2 s in), not from env 0's arrival (about 2.2 s in)."""
    fns = [functools.partial(edgeenvs_pools.make_hang_env, 0, None, 60.0, 1.0),
           functools.partial(edgeenvs_pools.make_hang_env, 1, 1, 60.0, 0.0)]
    pool = ShmEnvPool(fns, batch_size=2, n_workers=2, start_method="fork", timeout=1.2)
    try:
        pool.reset()
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"the step of env 1 did not finish within 1.2 s of its send\(\)"):
            pool.step_envs(np.zeros(2, dtype=np.int64), [0, 1])
        assert 1.15 < time.monotonic() - start < 2.0
    finally:
        pool.close()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_hung_env_in_a_fed_sb3_pool_times_out(start_method):
    """ShmVecEnvPool (batch_size=2 of 4): envs 0 and 1 go to worker 0, where env 0 hangs; envs 2
    and 3 keep every step_wait() fed: it raises WorkerTimeoutError naming env 0 and env 1."""
    pytest.importorskip("stable_baselines3")
    from shmvec import ShmVecEnvPool

    env = ShmVecEnvPool(_fns(4, hang={0: 1}), batch_size=2, n_workers=2, start_method=start_method, timeout=1.5)
    try:
        env.reset()  # rows: envs 0 and 1, which the next step sends
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            while time.monotonic() - start < 12.0:
                env.step(np.zeros(2, dtype=np.int64))
        message = str(info.value)
        assert "envs 0, 1 did not finish within 1.5 s of their send()" in message, message
        assert "worker 0, in env 0 (env 1 queued behind it)" in message, message
        assert time.monotonic() - start < 6.0
    finally:
        env.close()


# ---- 8. a forked child's close() leaves the parent's pool running ------------------------------------
def _in_child(body) -> None:
    """Runs ``body()`` in a child of os.fork(); asserts it returned True there."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if body() else 2
        except BaseException:
            code = 3
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    got = os.read(read, 1)
    os.close(read)
    assert got == b"\x00", f"the child's check failed (code {got!r})"


def _forked_calls_refused(call) -> bool:
    try:
        call()
    except ForkedVecEnvError as exc:
        return "os.fork()" in str(exc)
    return False


@pytest.mark.parametrize("how", ["close", "del"])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_forked_child_that_closes_a_pool_leaves_the_parents_pool_running(start_method, how):
    """The child closes the pool (or drops its last reference to it) while envs are in flight:
    the parent receives them and steps on, every env's counter where it should be."""
    pool = ShmEnvPool(_fns(4), batch_size=2, n_workers=2, start_method=start_method, timeout=3.0)
    try:
        pool.reset()
        _receive_all(pool)
        pool.send(np.zeros(4, dtype=np.int64))  # in flight across the fork
        alive = weakref.ref(pool)

        def child() -> bool:
            nonlocal pool
            ok = _forked_calls_refused(pool.recv)
            if how == "close":
                pool.close()
            else:
                pool = None
                gc.collect()
                ok = ok and alive() is None
            return ok

        _in_child(child)
        steps = {i: 1 for i in range(4)}  # steps each env has taken once this send is received
        for _ in range(10):
            obs, _, _, _, infos = pool.recv()
            for row, i in zip(obs, infos["env_id"].tolist()):
                assert row.tolist() == [i, steps[i]]  # CounterEnv: [tag, t]
                steps[i] += 1
            pool.send(np.zeros(2, dtype=np.int64), infos["env_id"])
    finally:
        pool.close()


@pytest.mark.parametrize("how", ["close", "del"])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_forked_child_that_closes_an_sb3_pool_leaves_the_parents_pool_running(start_method, how):
    pytest.importorskip("stable_baselines3")
    from shmvec import ShmVecEnvPool

    env = ShmVecEnvPool(_fns(4), batch_size=4, n_workers=2, start_method=start_method, timeout=3.0)
    try:
        env.reset()
        env.step_async(np.zeros(4, dtype=np.int64))  # in flight across the fork
        alive = weakref.ref(env)

        def child() -> bool:
            nonlocal env
            ok = _forked_calls_refused(env.step_wait)
            if how == "close":
                env.close()
            else:
                env = None
                gc.collect()
                ok = ok and alive() is None
            return ok

        _in_child(child)
        for t in range(1, 6):
            obs = env.step_wait()[0]
            assert obs.tolist() == [[i, t] for i in range(4)]
            env.step_async(np.zeros(4, dtype=np.int64))
        env.step_wait()
    finally:
        env.close()


# ---- 9. every segment a pool creates has its pages reserved --------------------------------------------
def test_the_pools_segment_is_reserved_so_no_room_raises_instead_of_sigbus(monkeypatch):
    """The engine's block is reserved, then the pool's segment finds no room (ENOSPC from its
    reservation): ShmVecEnvError naming /dev/shm, nothing left behind.  (Without the reservation
    the pool was built, and its first write to a missing page would be SIGBUS.)"""
    real = os.posix_fallocate
    calls = []

    def room_for_the_first_only(fd, offset, length):
        calls.append(length)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", room_for_the_first_only)
    with pytest.raises(ShmVecEnvError, match=r"/dev/shm has no room for \d+ bytes of the pool's queues"):
        ShmEnvPool(_fns(2), batch_size=1, n_workers=2, start_method="fork", timeout=10.0)
    assert len(calls) == 2


_TMPFS_SCRIPT = textwrap.dedent("""
    import functools, json, os, sys
    import numpy as np
    import edgeenvs_pools
    from shmvec import ShmEnvPool, ShmVecEnvError

    def free():
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize

    def pages(n):
        return -(-n // PAGE)

    def build():
        fns = [functools.partial(edgeenvs_pools.make_hang_env, i) for i in range(4)]
        kwargs = dict(batch_size=2, n_workers=2, start_method="fork", info_bytes=65536, timeout=30.0)
        if FACE == "ShmVecEnvPool":
            from shmvec import ShmVecEnvPool
            env = ShmVecEnvPool(fns, **kwargs)
            return env, env._pool
        env = ShmEnvPool(fns, **kwargs)
        return env, env

    def try_build():
        try:
            env, _ = build()
        except ShmVecEnvError as exc:
            return str(exc)
        try:  # built: it steps
            infos = env.reset() if FACE == "ShmVecEnvPool" else env.reset()[1]
            for _ in range(4):
                if FACE == "ShmVecEnvPool":
                    env.step(np.zeros(2, dtype=np.int64))
                else:
                    infos = env.step(np.zeros(2, dtype=np.int64), infos["env_id"])[4]
        finally:
            env.close()
        return None

    if __name__ == "__main__":
        FACE = sys.argv[1]
        PAGE = os.statvfs("/dev/shm").f_frsize
        env, pool = build()  # in the empty tmpfs: the sizes
        engine_pages = pages(pool._engine.layout.base_nbytes)
        pool_pages = pages(pool._pool_layout.nbytes)
        env.close()
        SHORT = pool_pages if sys.argv[2] == "all" else int(sys.argv[2])
        # Room for the engine's block and all but SHORT pages of the pool's segment.
        filler = os.open("/dev/shm/filler", os.O_RDWR | os.O_CREAT)
        os.posix_fallocate(filler, 0, free() - (engine_pages + pool_pages - SHORT) * PAGE)
        out = {"pool_pages": pool_pages, "short": try_build()}
        os.ftruncate(filler, os.fstat(filler).st_size - SHORT * PAGE)  # now exactly room for both
        out["exact"] = try_build()
        print(json.dumps(out))
""")


def _can_mount_a_tmpfs() -> str | None:
    """Why a test cannot mount a tmpfs over /dev/shm in a mount namespace of its own, or None."""
    try:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not usable here ({exc})"
    if probe.returncode != 0:
        return f"mounting a tmpfs in a mount namespace is not permitted here: {probe.stderr.strip()}"
    return None


@pytest.mark.parametrize("face", ["ShmEnvPool", "ShmVecEnvPool"])
@pytest.mark.parametrize("short", ["all", "one page"])
def test_a_pool_in_a_nearly_full_dev_shm_raises_instead_of_sigbus(tmp_path, face, short):
    """/dev/shm (a small tmpfs of this test's own) has room for the engine's block and for all
    but ``short`` pages of the pool's segment: construction raises ShmVecEnvError naming /dev/shm
    (it was SIGBUS, or a pool built on pages that were not there); with exactly the room needed,
    the pool is built and steps."""
    why = _can_mount_a_tmpfs()
    if why is not None:
        pytest.skip(why)
    if face == "ShmVecEnvPool":
        pytest.importorskip("stable_baselines3")
    script = tmp_path / "nearly_full.py"
    script.write_text(_TMPFS_SCRIPT)
    env = dict(os.environ, PYTHONPATH=pythonpath(TESTS_DIR))
    cmd = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script} {face} "
           + ("all" if short == "all" else "1"))
    run = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0, f"exit {run.returncode} (-7: SIGBUS)\n{run.stdout}\n{run.stderr[-3000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["short"] is not None, "built on pages /dev/shm does not have"
    assert "/dev/shm has no room for" in out["short"] and "the pool's queues" in out["short"], out["short"]
    assert "--shm-size" in out["short"]
    assert out["exact"] is None, out["exact"]


# ---- fuzz: a hung env in a fed pool, a slow caller, a forked child's close() ------------------------------
def _draw(seed: int) -> dict:
    rng = random.Random(seed)
    n_workers = rng.choice([2, 3])
    per_worker = rng.choice([1, 2, 3])
    n = n_workers * per_worker
    return {
        "n": n, "n_workers": n_workers, "per_worker": per_worker,
        "batch_size": rng.randint(1, n - per_worker),  # the other workers can fill every batch
        "method": START_METHODS[seed % 3],
        "hung": rng.randrange(n), "hang_at": rng.randint(1, 4),
        "pause_s": rng.choice([0.0, 0.05, 0.3]),  # the caller's time between recv() and send()
        "fork_at": rng.choice([None, 1, 3]),  # the recv() after which a forked child closes the pool
        "fork_how": rng.choice(["close", "del"]),
    }


@pytest.mark.parametrize("seed", range(FUZZ_SEED, FUZZ_SEED + FUZZ_CASES))
def test_fuzz_a_hung_env_in_a_fed_pool(seed):
    """Whatever the pool and wherever the hang, recv() raises WorkerTimeoutError within about
    ``timeout`` of the hung step's send, naming the env and its worker; nothing is late before."""
    case = _draw(seed)
    timeout = 2.0
    fns = [functools.partial(edgeenvs_pools.make_hang_env, i, case["hang_at"] if i == case["hung"] else None)
           for i in range(case["n"])]
    pool = ShmEnvPool(fns, batch_size=case["batch_size"], n_workers=case["n_workers"],
                      start_method=case["method"], timeout=timeout)
    replay = f"case {case} (seed {seed})"
    try:
        pool.reset()
        ids = _receive_all(pool)
        sends = 0  # of the hung env
        hang_sent: float | None = None
        with pytest.raises(WorkerTimeoutError) as info:
            for k in range(100_000):
                if case["hung"] in ids.tolist():
                    sends += 1
                    if sends == case["hang_at"]:
                        hang_sent = time.monotonic()
                pool.send(np.zeros(len(ids), dtype=np.int64), ids)
                if hang_sent is not None and time.monotonic() - hang_sent > timeout + 8.0:
                    pytest.fail(f"no WorkerTimeoutError {timeout + 8.0:g} s after the hung step's send: {replay}")
                ids = pool.recv()[4]["env_id"]
                if k + 1 == case["fork_at"]:
                    alive = weakref.ref(pool)

                    def child() -> bool:
                        nonlocal pool
                        if case["fork_how"] == "close":
                            pool.close()
                            return True
                        pool = None
                        gc.collect()
                        return alive() is None

                    _in_child(child)
                time.sleep(case["pause_s"])
        elapsed = time.monotonic() - hang_sent if hang_sent is not None else None
        assert elapsed is not None, f"a WorkerTimeoutError before any step hung: {info.value} ({replay})"
        assert timeout - 0.1 < elapsed < timeout + 4.0, f"{elapsed:.2f} s: {replay}"
        worker = case["hung"] // case["per_worker"]
        message = str(info.value)
        assert f"worker {worker}, in env {case['hung']}" in message, f"{message} ({replay})"
        assert "did not finish within 2 s of" in message, f"{message} ({replay})"
    finally:
        pool.close()
