"""A vec env dropped without ``close()`` after a failure is freed at once, not at the next full GC.

A failure is raised through the vec env's own frames, and its traceback holds them (and so the
vec env).  Kept anywhere the vec env reaches (its ``_broken``, which names the failure in every
later error) or in a local of one of those frames, the exception made a reference cycle: the vec
env, its worker processes and its shared memory lived on until the garbage collector's next full
pass, which in a long training run can be minutes away.  ``shmvec._errors.detached`` keeps a copy
without the traceback, and the raising code holds no exception in a local (``shmvec._state.record``).

Each test runs with the collector off: the vec env must go as soon as the last reference does.
"""

from __future__ import annotations

import functools
import gc
import os
import time
import weakref
from collections.abc import Callable

import numpy as np
import psutil
import pytest

import testenvs
from shmvec import ShmEnvPool, ShmVecEnv, ShmVecEnvPool, ShmVectorEnv
from shmvec._errors import RemoteTraceback, detached
from shmvec._state import FirstFailure

N = 4


def _raising(fail_at: int = 3) -> list:
    return [functools.partial(testenvs.make_raising_env, fail_at if i == 1 else 10**9) for i in range(N)]


def _raised(call: Callable[[], object]) -> str | None:
    """Calls ``call``; the type name of what it raised (the exception itself is not kept)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - any failure: the test names the one it expects
        return type(exc).__name__
    return None


def _worker_pids(env: object) -> list[int]:
    engine = env
    for name in ("_pool", "_engine"):
        engine = getattr(engine, name, engine)
    return [p.pid for p in engine.workers.processes]


def _step_sb3(env) -> Callable[[], object]:
    return lambda: [env.step(np.zeros(N, dtype=np.int64)) for _ in range(5)]


def _sb3_step_raises(**kw):
    env = ShmVecEnv(_raising(), n_workers=2, start_method="fork", **kw)
    env.reset()
    return env, [(_step_sb3(env), "EnvBoom"), (env.reset, "BrokenVecEnvError")]


def _sb3_worker_killed():
    env = ShmVecEnv([functools.partial(testenvs.make_suicide_env, 2)] * N, n_workers=2, start_method="fork")
    env.reset()
    return env, [(_step_sb3(env), "WorkerDiedError"), (lambda: env.get_attr("at"), "BrokenVecEnvError")]


def _sb3_timeout():
    env = ShmVecEnv([functools.partial(testenvs.make_sleepy_env, 60.0)] * N, n_workers=2, start_method="fork",
                    timeout=0.3)
    env.reset()
    return env, [(_step_sb3(env), "WorkerTimeoutError")]


def _sb3_too_many_restarts():
    env = ShmVecEnv(_raising(), n_workers=2, start_method="fork", on_failure="restart", max_restarts=0)
    env.reset()
    return env, [(_step_sb3(env), "TooManyRestartsError"), (env.reset, "BrokenVecEnvError")]


def _sb3_rare_call_raises():  # not broken: the env stays usable, and is dropped usable
    env = ShmVecEnv(_raising(), n_workers=2, start_method="fork")
    env.reset()
    return env, [(lambda: env.env_method("no_such_method"), "AttributeError"), (env.reset, None)]


def _vector_step_raises():
    env = ShmVectorEnv(_raising(), n_workers=2, start_method="fork")
    env.reset(seed=0)
    step = lambda: [env.step(np.zeros(N, dtype=np.int64)) for _ in range(5)]  # noqa: E731
    return env, [(step, "EnvBoom"), (env.reset, "BrokenVecEnvError")]


def _pool_recv_raises():
    env = ShmEnvPool(_raising(), batch_size=N, n_workers=2, start_method="fork")
    env.reset()

    def steps():
        for _ in range(5):
            env.send(np.zeros(N, dtype=np.int64))
            env.recv()
    return env, [(steps, "EnvBoom"), (env.reset, "BrokenVecEnvError")]


def _sb3_pool_step_raises():
    env = ShmVecEnvPool(_raising(), n_workers=2, start_method="fork")
    env.reset()
    return env, [(_step_sb3(env), "EnvBoom"), (env.reset, "BrokenVecEnvError")]


CASES = {
    "ShmVecEnv, an env raises in step": _sb3_step_raises,
    "ShmVecEnv, a worker is killed": _sb3_worker_killed,
    "ShmVecEnv, a worker times out": _sb3_timeout,
    "ShmVecEnv, restarts run out": _sb3_too_many_restarts,
    "ShmVecEnv, a rare call raises": _sb3_rare_call_raises,
    "ShmVectorEnv, an env raises in step": _vector_step_raises,
    "ShmEnvPool, an env raises in step": _pool_recv_raises,
    "ShmVecEnvPool, an env raises in step": _sb3_pool_step_raises,
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_vec_env_dropped_without_close_is_freed_at_once(case):
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        env, calls = CASES[case]()
        pids = _worker_pids(env)
        for call, expected in calls:
            assert _raised(call) == expected
        del call
        ref = weakref.ref(env)
        del env, calls
        assert ref() is None, f"{case}: still referenced: {[type(r).__name__ for r in gc.get_referrers(ref())]}"
        deadline = time.monotonic() + 10.0
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            assert time.monotonic() < deadline, f"{case}: workers {pids} outlived their vec env"
            time.sleep(0.05)
    finally:
        if enabled:
            gc.enable()


def test_detached_keeps_the_message_notes_and_the_worker_traceback_and_drops_the_frames():
    def raise_it():
        exc = testenvs.EnvBoom("boom")
        exc.add_note("shmvec: a note")
        exc.__cause__ = RemoteTraceback("worker traceback text")
        raise exc
    try:
        raise_it()
    except testenvs.EnvBoom as exc:
        kept = detached(exc)
        assert kept is not exc and exc.__traceback__ is not None
    assert type(kept) is testenvs.EnvBoom and str(kept) == "boom" and kept.__traceback__ is None
    assert kept.__notes__ == ["shmvec: a note"]
    assert isinstance(kept.__cause__, RemoteTraceback) and "worker traceback text" in str(kept.__cause__)
    # A chained exception that was raised here loses its frames too.
    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise KeyError("outer") from inner
    except KeyError as exc:
        kept = detached(exc)
    assert kept.__traceback__ is None and kept.__cause__.__traceback__ is None
    assert str(kept.__cause__) == "inner" and kept.__suppress_context__


def test_detached_keeps_an_exception_that_does_not_copy_as_itself():
    try:
        raise testenvs.AwkwardError(7, "step")  # its constructor does not take its own args
    except testenvs.AwkwardError as exc:
        assert detached(exc) is exc


def test_first_failure_stores_the_detached_copy():
    class Holder:
        _broken = FirstFailure()

        def __init__(self) -> None:
            self._broken = None  # as its owners' __init__ do first: reads are plain attribute reads
    holder = Holder()
    assert holder._broken is None
    exc = ValueError("never raised, raised later")
    holder._broken = exc
    assert holder._broken is not exc and str(holder._broken) == str(exc)
    holder._broken = None
    assert holder._broken is None


def _shm_fds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/shmvec"):  # ours (not multiprocessing's pym-* arenas)
            out.append(f"{fd} -> {target}")
    return out


def _vector_bad_info():
    env = ShmVectorEnv([functools.partial(testenvs.make_unbatchable_info_env, i) for i in range(2)], n_workers=2,
                       start_method="fork")
    env.reset(seed=0)
    return env, lambda: [env.step(np.zeros(2, dtype=np.int64)) for _ in range(3)]


def _pool_bad_info():
    env = ShmEnvPool([functools.partial(testenvs.make_unbatchable_info_env, i) for i in range(2)], n_workers=2,
                     start_method="fork")
    env.reset(seed=0)
    return env, lambda: [env.step(np.zeros(2, dtype=np.int64)) for _ in range(3)]


def _sb3_list_info():
    env = ShmVecEnv([functools.partial(testenvs.make_list_info_env, i) for i in range(2)], n_workers=2,
                    start_method="fork")
    env.reset()
    return env, lambda: [env.step(np.zeros(2, dtype=np.int64)) for _ in range(3)]


@pytest.mark.parametrize("build", [_vector_bad_info, _pool_bad_info, _sb3_list_info],
                         ids=["ShmVectorEnv", "ShmEnvPool", "ShmVecEnv"])
def test_an_exception_kept_after_close_does_not_keep_the_shared_memory_mapped(build):
    """An error raised in the parent while a step's return is built (an info Gymnasium cannot
    batch, or one SB3 cannot take), kept by the caller (as ``pytest.raises`` keeps it) past
    ``close()``: no frame of its traceback holds a view of a shared block, so close() unmaps it."""
    env, step = build()
    kept = None
    try:
        step()
    except (ValueError, TypeError) as exc:
        kept = exc
    finally:
        env.close()
    assert kept is not None and kept.__traceback__ is not None, "the step did not raise"
    assert _shm_fds() == []
