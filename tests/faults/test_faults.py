"""Faults with real processes: crashes, OOM, hangs, Ctrl-C, bad actions, and ``on_failure="restart"``.

The basic failure tests (an env raising, a worker killed between calls or during
``step_wait``, a hanging env, the parent killed) are in test_api.py; this file
adds the native crashes, deaths during ``get_attr`` and ``close``, out of memory,
a real Ctrl-C, invalid actions, and the recovery mode.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
import warnings

from multiprocessing.connection import wait as mp_wait

import numpy as np
import psutil
import pytest
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

import faultenvs
import testenvs
from helpers import SHMVEC_ROOT, TESTS_DIR, assert_same
from shmvec import (
    BrokenVecEnvError,
    InvalidActionError,
    InvalidActionWarning,
    RemoteEnvError,
    ShmVecEnv,
    SpaceError,
    TooManyRestartsError,
    WorkerDiedError,
    WorkerRestartWarning,
)
from shmvec._actions import make_action_checks
from shmvec import WorkerTimeoutError, _crash
from shmvec._errors import RemoteTraceback, WorkerStacks
from shmvec._layout import space_leaves
from shmvec._protocol import RESTART_INFO_KEY

_TESTS = TESTS_DIR
N = 4  # envs; two workers of two envs each: worker 1 owns envs 2 and 3


def _crash_fns(bad: int | None = None, **crash) -> list:
    """CrashEnv factories; env ``bad`` crashes as ``crash`` says, the others never."""
    return [functools.partial(faultenvs.make_crash_env, i, **(crash if i == bad else {})) for i in range(N)]


def _actions(k: int, n: int = N) -> np.ndarray:
    return np.array([(k + i) % 3 for i in range(n)], dtype=np.int64)


def _second_step_raises(env: ShmVecEnv, kind: type) -> tuple[BaseException, float]:
    """Resets ``env``, steps it once, then expects ``kind`` from the second step; returns the
    exception and the seconds that step took to raise."""
    env.reset()
    env.step(_actions(0))
    start = time.monotonic()
    with pytest.raises(kind) as info:
        env.step(_actions(1))
    return info.value, time.monotonic() - start


def _zombie_or_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(proc, timeout: float = 5.0) -> None:
    """Until the process's sentinel is ready: every thread has exited and closed its descriptors
    (a killed process shows as a zombie a moment before that)."""
    assert mp_wait([proc.sentinel], timeout), f"process {proc.pid} did not die"


# ---------------------------------------------------------------------------------------------
# Crashes with on_failure="raise" (the default): a clear error, then a clear refusal
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how, what", [("segv", "SIGSEGV"), ("abort", "SIGABRT"), ("kill", "SIGKILL")])
def test_native_crash_in_step_raises_worker_died_error_then_broken(how, what):
    env = ShmVecEnv(_crash_fns(bad=3, at=2, how=how), n_workers=2, start_method="fork")
    try:
        exc, seconds = _second_step_raises(env, WorkerDiedError)
        assert seconds < 3.0
        assert exc.worker == 1 and list(exc.env_indices) == [2, 3]
        assert what in str(exc) and "worker 1" in str(exc) and "envs 2..3" in str(exc) and "step" in str(exc)
        assert exc.exitcode == -getattr(signal, what)
        for call in (lambda: env.step(_actions(2)), env.reset, lambda: env.get_attr("tag")):
            with pytest.raises(BrokenVecEnvError, match="WorkerDiedError"):
                call()
    finally:
        env.close()


@pytest.mark.parametrize("how, what", [("segv", "SIGSEGV"), ("exit", "exit code 3")])
def test_worker_dying_during_reset_raises_worker_died_error(how, what):
    env = ShmVecEnv(_crash_fns(bad=1, at=2, how=how, where="reset"), n_workers=2, start_method="fork")
    try:
        env.reset()
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=what) as info:
            env.reset()  # env 1's second reset
        assert time.monotonic() - start < 3.0
        assert info.value.worker == 0 and "during reset" in str(info.value)
        with pytest.raises(BrokenVecEnvError):
            env.reset()
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# Where a dead or stuck worker was: the env it was in, and its Python stack (shmvec._crash)
# ---------------------------------------------------------------------------------------------

def _stack_of(exc: BaseException) -> str:
    assert isinstance(exc.__cause__, WorkerStacks), f"no stack attached to {exc!r}"
    return str(exc.__cause__)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("bad", [2, 3])  # the first env of worker 1's slice, and the one after it
def test_native_crash_names_the_env_and_carries_the_workers_python_stack(method, bad):
    env = ShmVecEnv(_crash_fns(bad=bad, at=2, how="segv"), n_workers=2, start_method=method)
    try:
        exc, _ = _second_step_raises(env, WorkerDiedError)
        message = str(exc)
        assert f"worker 1 (envs 2..3) died during step with signal SIGSEGV (11), in env {bad}. " in message
        assert "Its Python stack when it died (faulthandler) is shown above." in message
        stack = _stack_of(exc)
        assert "Fatal Python error: Segmentation fault" in stack
        assert "faultenvs.py" in stack and "in _end_process" in stack and "in _maybe_crash" in stack
        assert "Extension modules" not in stack  # Python's list of them is noise here
        assert stack.rstrip().endswith("(the worker's Python stack when it died, from faulthandler, above)")
        with pytest.raises(BrokenVecEnvError, match="in env") as broken:
            env.step(_actions(2))
        assert "in _maybe_crash" in _stack_of(broken.value.__cause__)  # the kept failure keeps its stack
    finally:
        env.close()


@pytest.mark.parametrize("how, what", [("abort", "signal SIGABRT (6)"), ("kill", "signal SIGKILL (9)"),
                                      ("exit", "exit code 3")])
def test_every_death_names_the_env_and_only_a_fatal_signal_brings_a_stack(how, what):
    env = ShmVecEnv(_crash_fns(bad=1, at=2, how=how, where="reset"), n_workers=2, start_method="fork")
    try:
        env.reset()
        with pytest.raises(WorkerDiedError) as info:
            env.reset()  # env 1's second reset
        assert f"worker 0 (envs 0..1) died during reset with {what}" in str(info.value)
        assert ", in env 1. " in str(info.value)
        if how == "abort":  # faulthandler writes on SIGABRT; SIGKILL and os._exit leave nothing to write
            assert "Fatal Python error: Aborted" in _stack_of(info.value) and "in reset" in _stack_of(info.value)
        else:
            assert info.value.__cause__ is None and "faulthandler" not in str(info.value)
    finally:
        env.close()


def test_native_crash_in_a_factory_carries_its_stack():
    fns = _crash_fns()
    fns[3] = functools.partial(faultenvs.crashing_factory, "segv")
    with pytest.raises(WorkerDiedError, match=r"worker 1 \(envs 2..3\) died during env construction with signal "
                                              r"SIGSEGV") as info:
        ShmVecEnv(fns, n_workers=2, start_method="forkserver")
    assert "in crashing_factory" in _stack_of(info.value)
    assert "in env" not in str(info.value)  # no block yet, so no ENV_AT: the stack tells


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_hanging_step_names_the_env_and_shows_where_it_hangs(method):
    env = ShmVecEnv(_crash_fns(bad=3, at=2, how="hang"), n_workers=2, start_method=method, timeout=1.0)
    try:
        exc, seconds = _second_step_raises(env, WorkerTimeoutError)
        assert seconds < 6.0  # the timeout, then at most a second for the stacks
        message = str(exc)
        assert "workers [1] (envs 2..3; worker 1, in env 3) did not answer within 1 s" in message
        assert "Where each was is shown above (faulthandler)." in message
        stack = _stack_of(exc)
        assert "in _end_process" in stack and "in step" in stack and "Fatal Python error" not in stack
        assert stack.rstrip().endswith("(the worker's Python stack where it hung, from faulthandler, above)")
        assert env._engine.workers.processes[1].is_alive()  # asked for its stacks, not killed: close() does that
    finally:
        env.close()


def test_a_hanging_rare_command_names_the_env_and_shows_where_it_hangs():
    env = ShmVecEnv(_crash_fns(bad=2, at=1, how="hang", where="attr"), n_workers=2, start_method="fork",
                    timeout=1.0)
    try:
        env.reset()
        with pytest.raises(WorkerTimeoutError) as info:
            env.get_attr("explode")
        assert "worker 1 (envs 2..3, in env 2) did not answer within 1 s." in str(info.value)
        assert "in explode" in _stack_of(info.value)
    finally:
        env.close()


def test_no_dump_signal_goes_to_a_worker_whose_env_took_it_over():
    fns = _crash_fns()
    fns[3] = functools.partial(faultenvs.make_dump_signal_taker_env, 3, at=2, how="hang")
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", timeout=1.0)
    try:
        exc, _ = _second_step_raises(env, WorkerTimeoutError)
        assert "(envs 2..3; worker 1, in env 3)" in str(exc)
        assert exc.__cause__ is None and "faulthandler" not in str(exc)
        assert env._engine.workers.processes[1].is_alive()  # the signal's default action would have killed it
    finally:
        env.close()


def test_catches_reads_the_signal_handlers_of_a_process():
    # Python's own handler (installed again: a suite started in the background inherits SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert _crash.catches(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    old = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert not _crash.catches(os.getpid(), signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, lambda *_: None)
        assert _crash.catches(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert not _crash.catches(2**22 + 12345, signal.SIGINT)  # no such process


def test_a_restart_names_the_env_and_warns_with_the_stack(tmp_path):
    fns = _crash_fns(bad=3, at=2, how="segv")
    fns[1] = functools.partial(faultenvs.make_crash_env, 1, at=3, how="hang", once=str(tmp_path / "hung-once"))
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart", max_restarts=2, timeout=1.0)
    try:
        env.reset()
        env.step(_actions(0))
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 died with signal SIGSEGV \(11\), in env 3") as rec:
            out = env.step(_actions(1))
        assert "in env 3" in out[3][2][RESTART_INFO_KEY]
        warned = str(rec[0].message)
        assert "Its Python stack when it failed (faulthandler):" in warned and "in _maybe_crash" in warned
        with pytest.warns(WorkerRestartWarning, match=r"did not answer within timeout=1 s \(stuck in env 1\)") as rec:
            env.step(_actions(2))  # env 1 hangs: its worker is asked for its stack, then killed
        assert "in _end_process" in str(rec[0].message)
        with pytest.raises(TooManyRestartsError, match="in env 3") as info:
            for k in range(3, 8):  # env 3, rebuilt, crashes again at its second step
                env.step(_actions(k))
        assert "in _maybe_crash" in _stack_of(info.value)
    finally:
        env.close()


def test_a_restart_of_a_worker_with_one_env_names_it_as_one_env():
    """'env 3', never 'envs 3..3', in the warning and in TooManyRestartsError (one helper formats env sets)."""
    env = ShmVecEnv(_crash_fns(bad=3, at=1, how="raise"), n_workers=N, start_method="fork", on_failure="restart",
                    max_restarts=0)
    try:
        env.reset()
        with pytest.raises(TooManyRestartsError) as info:
            for k in range(3):
                env.step(_actions(k))
        assert "worker 3 (env 3) failed during" in str(info.value) and ".." not in str(info.value).split("failed")[0]
    finally:
        env.close()


def test_unpicklable_exception_arrives_as_remote_env_error_with_the_traceback():
    env = ShmVecEnv(_crash_fns(bad=2, at=2, how="raise_unpicklable"), n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(_actions(0))
        with pytest.raises(RemoteEnvError) as info:
            env.step(_actions(1))
        exc = info.value
        assert exc.type_name == "faultenvs.UnpicklableError" and exc.message == "holds a lock"
        assert isinstance(exc.__cause__, RemoteTraceback) and "_end_process" in exc.__cause__.tb
        assert any("env 2" in note and "step" in note for note in exc.__notes__)
    finally:
        env.close()


@pytest.mark.parametrize("space", [
    spaces.Graph(node_space=spaces.Box(-1.0, 1.0, (2,)), edge_space=None),
    spaces.Sequence(spaces.Discrete(3)),
    spaces.Dict({"ok": spaces.Discrete(2), "words": spaces.Text(5)}),
])
def test_spaces_without_a_fixed_size_are_pickled_leaves_and_what_is_no_space_raises(space):
    """Their values travel pickled (tests/frontends/test_spaces.py); only a non-space raises SpaceError."""
    assert any(leaf.pickled for leaf in space_leaves(space))
    bad = spaces.Dict({"ok": space})
    bad.spaces["bad"] = "words"  # type: ignore[assignment]  # (Dict's constructor refuses it)
    with pytest.raises(SpaceError) as info:
        space_leaves(bad)
    msg = str(info.value)
    assert "['bad']" in msg and "str" in msg and "gymnasium.spaces.Space" in msg


def test_out_of_memory_in_step_arrives_as_memory_error_naming_the_env():
    """An env exceeding an RLIMIT_AS cap: Python's MemoryError crosses as itself."""
    env = ShmVecEnv(_crash_fns(bad=1, at=2, how="oom"), n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(_actions(0))
        with pytest.raises(MemoryError) as info:
            env.step(_actions(1))
        assert any("env 1" in note and "step" in note for note in info.value.__notes__)
        with pytest.raises(BrokenVecEnvError, match="MemoryError"):
            env.step(_actions(2))
    finally:
        env.close()


def test_worker_dying_during_get_attr_raises_within_a_second():
    env = ShmVecEnv(_crash_fns(bad=2, at=1, how="kill", where="attr"), n_workers=2, start_method="fork")
    try:
        env.reset()
        assert env.get_attr("explode", indices=[0, 1]) == [0, 1]
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            env.get_attr("explode")
        assert time.monotonic() - start < 2.0
        assert info.value.worker == 1 and "SIGKILL" in str(info.value) and "get_attr" in str(info.value)
        with pytest.raises(BrokenVecEnvError):
            env.get_attr("tag")
        with pytest.raises(BrokenVecEnvError):
            env.step(_actions(0))
    finally:
        env.close()


@pytest.mark.parametrize("how, what", [("kill", "SIGKILL"), ("segv", "SIGSEGV"), ("exit", "exit code 3")])
def test_worker_dying_in_env_close_is_reported_after_everything_is_released(how, what):
    env = ShmVecEnv(_crash_fns(bad=1, at=0, how=how, where="close"), n_workers=2, start_method="fork")
    env.reset()
    env.step(_actions(0))
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=what) as info:
        env.close()
    assert time.monotonic() - start < 5.0
    assert info.value.worker == 0 and "close" in str(info.value)
    if how == "segv":  # the env's close() that crashed, in the stack
        assert "its Python stack is shown above" in str(info.value) and "in close" in _stack_of(info.value)
    else:
        assert info.value.__cause__ is None
    env.close()  # idempotent; the leak check verifies that nothing is left


def test_hanging_env_close_is_terminated_and_close_stays_bounded():
    env = ShmVecEnv(_crash_fns(bad=0, at=0, how="hang", where="close"), n_workers=2, start_method="fork")
    env.reset()
    start = time.monotonic()
    env.close()  # waits _CLOSE_JOIN_S for the polite exit, then terminates: no error to report
    assert time.monotonic() - start < 10.0


_CTRL_C_SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a launcher (nohup, a job started with &) may ignore it
sys.path[:0] = [{tests!r}, {root!r}]  # the shmvec under test, wherever it is installed
import numpy as np
import functools
import faultenvs

if __name__ == "__main__":
    from shmvec import ShmVecEnv  # here, not above: spawned workers re-import this module

    fns = [functools.partial(faultenvs.make_crash_env, i, **({{"at": 1, "how": "nap"}} if i == 0 else {{}}))
           for i in range(4)]
    env = ShmVecEnv(fns, n_workers=2, start_method={method!r})
    env.reset()
    print(" ".join(str(p.pid) for p in env._engine.workers.processes), flush=True)
    try:
        env.step(np.zeros(4, dtype=np.int64))  # worker 0 naps in its env for 1.5 s
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
"""


@pytest.mark.parametrize("method", ["fork"])
def test_ctrl_c_during_step_wait_leaves_no_worker_and_no_segment(tmp_path, method):
    """A real Ctrl-C: SIGINT to the whole process group, as a terminal sends it."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(_CTRL_C_SCRIPT.format(tests=_TESTS, root=SHMVEC_ROOT, method=method))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        workers = [psutil.Process(pid) for pid in pids]
        time.sleep(0.3)  # the parent is in step_wait now
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert time.monotonic() - start < 15.0
        assert "interrupted" in out and "KeyboardInterrupt" in err, err
        deadline = time.monotonic() + 5.0
        while not all(_zombie_or_gone(w.pid) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_zombie_or_gone(w.pid) for w in workers), "a worker outlived the interrupted parent"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{proc.pid}_")]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# ---------------------------------------------------------------------------------------------
# Invalid actions: checked in the parent, nothing reaches the envs
# ---------------------------------------------------------------------------------------------

def _bare(act_kind: str, n: int = 3, **kwargs) -> ShmVecEnv:
    return ShmVecEnv(testenvs.bare_env_fns(n, act_kind=act_kind), n_workers=2, start_method="fork", **kwargs)


@pytest.mark.parametrize("act_kind, bad, envs", [
    ("discrete", np.array([0, 3, 1]), [1]),
    ("discrete", np.array([-1, 0, 2]), [0]),
    ("multidiscrete", np.array([[1, 2], [2, 0], [0, 3]]), [1, 2]),  # nvec [2, 3]
    ("multidiscrete", np.array([[0, -1], [1, 2], [0, 0]]), [0]),
    ("multibinary", np.array([[0, 1, 1], [0, 2, 0], [1, 1, 1]], dtype=np.int8), [1]),
])
def test_out_of_range_actions_raise_naming_the_envs(act_kind, bad, envs):
    env = _bare(act_kind)
    try:
        env.reset()
        before = env.get_attr("_t")
        with pytest.raises(InvalidActionError, match="out of range") as info:
            env.step(bad)
        assert isinstance(info.value, ValueError)
        assert info.value.env_indices == envs
        assert f"envs {envs}" in str(info.value)
        assert not env.waiting and env.get_attr("_t") == before  # nothing reached the envs
        env.step(env.action_space.sample()[None].repeat(3, 0) if act_kind != "discrete" else np.zeros(3, np.int64))
    finally:
        env.close()


def test_whole_float_actions_for_integer_spaces_are_accepted_like_sb3_sends_them():
    """SB3's PPO samples MultiBinary actions as float32 0.0/1.0: they must reach the envs as int8."""
    env = _bare("multibinary", n=2)
    try:
        env.reset()
        env.step(np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=np.float32))
        with pytest.raises(InvalidActionError, match=r"envs \[1\]"):
            env.step(np.array([[0.0, 1.0, 1.0], [2.0, 0.0, 0.0]], dtype=np.float32))
        for bad in ([[0.5, 1.0, 1.0], [1.0, 0.0, 0.0]], [[np.nan, 1.0, 1.0], [1.0, 0.0, 0.0]],
                    [[1e9, 1.0, 1.0], [1.0, 0.0, 0.0]]):
            with pytest.raises(ValueError, match="dtype float"):
                env.step(np.array(bad))
    finally:
        env.close()


def test_integer_actions_of_another_dtype_are_accepted_when_they_fit():
    """numpy's default int64 (or a list of Python ints) for a uint8 MultiDiscrete: DummyVecEnv hands
    them over, so they are cast when every value fits the buffer's dtype, and refused otherwise."""
    env = _bare("multidiscrete_u8", n=2)
    try:
        env.reset()
        env.step(np.array([[1, 199], [0, 7]], dtype=np.int64))
        np.testing.assert_array_equal(env._engine.views.act[()], [[1, 199], [0, 7]])
        assert env._engine.views.act[()].dtype == np.uint8
        env.step([[0, 3], [1, 150]])
        with pytest.raises(ValueError, match="dtype int64"):
            env.step(np.array([[0, 300], [1, 0]]))  # 300 does not fit uint8 (it would wrap to 44)
        with pytest.raises(ValueError, match="dtype int64"):
            env.step(np.array([[0, -1], [1, 0]]))
    finally:
        env.close()


def test_discrete_with_a_start_checks_its_own_range():
    space = spaces.Discrete(3, start=-1)
    check = make_action_checks(space, [()], "raise")[()]
    check(np.array([-1, 0, 1]))
    with pytest.raises(InvalidActionError, match=r"\[-1, 2\)"):
        check(np.array([-1, 2, 0]))
    with pytest.raises(InvalidActionError):
        check(np.array([-2, 0, 0], dtype=np.int8))


def test_nan_actions_raise_by_default_naming_the_envs():
    env = _bare("box", n=4)
    try:
        env.reset()
        acts = np.zeros((4, 2), dtype=np.float32)
        acts[1, 0] = acts[3, 1] = np.nan
        with pytest.raises(InvalidActionError, match="NaN") as info:
            env.step(acts)
        assert info.value.env_indices == [1, 3] and "envs [1, 3]" in str(info.value)
        assert not env.waiting
        acts64 = np.zeros((4, 2))
        acts64[2, 1] = np.nan  # checked before the cast to the space's float32
        with pytest.raises(InvalidActionError, match=r"envs \[2\]"):
            env.step(acts64)
        env.step(np.full((4, 2), np.inf, dtype=np.float32))  # inf and out-of-bounds pass: envs clip
        env.step(np.zeros((4, 2), dtype=np.float32))
    finally:
        env.close()


def test_nan_in_a_dict_action_names_the_field():
    fns = [functools.partial(testenvs.make_echo_env, "dict")] * 2
    env = ShmVecEnv(fns, n_workers=1, start_method="fork")
    try:
        env.reset()
        with pytest.raises(InvalidActionError, match=r"actions\['force'\] of envs \[0\]"):
            env.step({"move": np.array([0, 1]), "force": np.array([[np.nan, 0.0], [0.0, 0.0]])})
        with pytest.raises(InvalidActionError, match=r"actions\['move'\] of envs \[1\]"):
            env.step({"move": np.array([0, 3]), "force": np.zeros((2, 2))})
    finally:
        env.close()


def test_invalid_actions_warn_and_ignore():
    env = _bare("box", n=2, invalid_actions="warn")
    try:
        env.reset()
        acts = np.array([[np.nan, 0.0], [0.0, 0.0]], dtype=np.float32)
        with pytest.warns(InvalidActionWarning, match=r"envs \[0\]"):
            _, rewards, _, _ = env.step(acts)
        assert np.isnan(rewards[0]) and not np.isnan(rewards[1])  # the NaN reached the env
    finally:
        env.close()
    env = _bare("discrete", n=2, invalid_actions="ignore")
    try:
        env.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env.step(np.array([7, 0]))  # SpacesEnv does not check: it gets 7
    finally:
        env.close()
    with pytest.raises(ValueError, match="invalid_actions"):
        ShmVecEnv(testenvs.bare_env_fns(2), invalid_actions="maybe")


# ---------------------------------------------------------------------------------------------
# on_failure="restart"
# ---------------------------------------------------------------------------------------------

def _reference(fns: list) -> DummyVecEnv:
    return DummyVecEnv(fns)


def _assert_truncated_report(out, last_obs, envs, reason_part: str) -> None:
    obs, rewards, dones, infos = out
    for i in envs:
        assert dones[i], f"env {i} should end its episode"
        assert rewards[i] == 0.0
        assert infos[i]["TimeLimit.truncated"] is True
        assert reason_part in infos[i][RESTART_INFO_KEY], infos[i][RESTART_INFO_KEY]
        assert np.array_equal(infos[i]["terminal_observation"], last_obs[i])


def _assert_untouched(out, ref_out, envs) -> None:
    for i in envs:
        assert_same(out[0][i], ref_out[0][i], f"obs[{i}]")
        assert out[1][i] == np.float32(ref_out[1][i])
        assert out[2][i] == ref_out[2][i]
        assert_same(out[3][i], ref_out[3][i], f"infos[{i}]")


def _run_with_restart(method: str, fault: str, bad: int, steps: int = 60, **crash: object) -> None:
    """Steps a ShmVecEnv beside a DummyVecEnv; the worker of env ``bad`` fails once (``fault``).

    Envs of the other worker must match DummyVecEnv step for step; the failed worker's envs
    must be reported truncated once, then run on (with fresh seeds).
    """
    fns = _crash_fns()
    if fault in ("segv", "abort", "exit", "raise", "oom"):
        fns[bad] = functools.partial(faultenvs.make_crash_env, bad, **crash)
    env = ShmVecEnv(fns, n_workers=2, start_method=method, on_failure="restart")
    ref = _reference(_crash_fns())
    own = [2, 3] if bad >= 2 else [0, 1]
    others = [0, 1] if bad >= 2 else [2, 3]
    try:
        env.seed(7)
        ref.seed(7)
        last = env.reset()
        assert_same(last, ref.reset())
        restarted_at = None
        for k in range(steps):
            acts = _actions(k)
            if fault == "sigkill" and k == 10:  # the OOM killer's way, mid step
                env.env_method("set_nap", 0.3, indices=own)
                env.step_async(acts)
                time.sleep(0.1)
                os.kill(env._engine.workers.processes[own[0] // 2].pid, signal.SIGKILL)
                with pytest.warns(WorkerRestartWarning, match="SIGKILL"):
                    out = env.step_wait()
            elif fault != "sigkill" and k == crash["at"] - 1:
                with pytest.warns(WorkerRestartWarning) as record:
                    out = env.step(acts)
                assert len(record) == 1 and f"worker {own[0] // 2}" in str(record[0].message)
                assert record[0].filename == __file__  # points at the caller's step(), not at shmvec
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", WorkerRestartWarning)
                    out = env.step(acts)
            ref_out = ref.step(acts)
            _assert_untouched(out, ref_out, others)
            if any(RESTART_INFO_KEY in out[3][i] for i in own):
                assert restarted_at is None, "reported twice"
                restarted_at = k
                reason = {"sigkill": "SIGKILL", "segv": "SIGSEGV", "abort": "SIGABRT", "exit": "exit code 3",
                          "raise": "EnvBoom: crashed on purpose", "oom": "MemoryError"}[fault]
                _assert_truncated_report(out, last, own, reason)
                for i in own:
                    assert env.observation_space.contains(out[0][i])
            else:
                for i in own:
                    assert RESTART_INFO_KEY not in out[3][i]
            last = out[0]
        assert restarted_at is not None
        assert env.restarts == 1
        assert env.get_attr("steps", own) == [steps - restarted_at - 1] * 2  # rebuilt, stepped since
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_restart_after_sigkill_mid_step_leaves_other_envs_untouched(method):
    _run_with_restart(method, "sigkill", bad=2)


@pytest.mark.parametrize("fault", ["segv", "abort", "exit", "raise", "oom"])
def test_restart_after_crash_or_exception_in_step(fault, tmp_path):
    # A raising env is env 1, the last of its worker's slice: env 0 stepped before it did.
    _run_with_restart("fork", fault, bad=1 if fault == "raise" else 3, at=8, how=fault,
                      once=str(tmp_path / "crashed-once"))


@pytest.mark.parametrize("copy", [True, False])
def test_restart_reports_nested_terminal_observations(copy, tmp_path):
    """Dict/Tuple observations: the terminal observation is the nested value last returned,
    also with copy=False, where the returned views are overwritten by the restart's reset."""
    marker = str(tmp_path / "crashed-once")
    fns = [functools.partial(faultenvs.make_crash_env, i, obs_kind="nested",
                             **({"at": 3, "how": "segv", "once": marker} if i == 1 else {})) for i in range(N)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart", copy=copy)
    try:
        env.reset()
        for k in range(2):
            out = env.step(_actions(k))
        last = [{"inner": {key: np.array(v[i]) for key, v in out[0]["inner"].items()},
                 "pair": tuple(np.array(v[i]) for v in out[0]["pair"]), "flag": np.array(out[0]["flag"][i])}
                for i in range(N)]
        with pytest.warns(WorkerRestartWarning, match="SIGSEGV"):
            obs, rewards, dones, infos = env.step(_actions(2))
        assert dones.tolist() == [True, True, False, False] and rewards[:2].tolist() == [0.0, 0.0]
        for i in (0, 1):
            assert_same(infos[i]["terminal_observation"], last[i], strict_dtype=True)
            assert env.observation_space.contains({"inner": {key: v[i] for key, v in obs["inner"].items()},
                                                   "pair": tuple(v[i] for v in obs["pair"]),
                                                   "flag": obs["flag"][i]})
        for i in (2, 3):
            assert "terminal_observation" not in infos[i]
    finally:
        env.close()


def test_ppo_trains_through_native_crashes_with_restart():
    """SB3's PPO uses the truncation report as it is: it bootstraps from terminal_observation
    when TimeLimit.truncated is set.  Env 0 segfaults every 100 of its steps, PPO carries on."""
    from stable_baselines3 import PPO

    fns = _crash_fns(bad=0, at=100, how="segv")
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart", max_restarts=None)
    try:
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, verbose=0)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            model.learn(1024)
        restarts = [w for w in record if issubclass(w.category, WorkerRestartWarning)]
        assert env.restarts == len(restarts) == 2  # at env 0's steps 100 and 200 (of 256)
        assert all("SIGSEGV" in str(w.message) for w in restarts)
        assert env.get_attr("steps", [0, 2]) == [56, 256]  # env 0 was rebuilt, env 2 never
    finally:
        env.close()


def test_restart_is_bounded_by_max_restarts():
    fns = _crash_fns(bad=2, at=3, how="kill")  # every new copy dies again at its third step
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart", max_restarts=2)
    try:
        env.reset()
        restarts = []
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with pytest.raises(TooManyRestartsError) as info:
                for k in range(20):
                    out = env.step(_actions(k))
                    if RESTART_INFO_KEY in out[3][2]:
                        restarts.append(k)
        assert restarts == [2, 5]
        assert len([w for w in record if issubclass(w.category, WorkerRestartWarning)]) == 2
        msg = str(info.value)
        assert "max_restarts=2" in msg and "worker 1" in msg and "SIGKILL" in msg and "envs 2..3" in msg
        assert env.restarts == 2
        with pytest.raises(BrokenVecEnvError, match="TooManyRestartsError"):
            env.step(_actions(0))
    finally:
        env.close()


def test_restart_during_reset_replays_the_seeds(tmp_path):
    """A worker that dies in its first reset: the new one resets with the same seeds, so
    the observations equal DummyVecEnv's, and reset_infos say what happened."""
    marker = str(tmp_path / "died-once")
    fns = _crash_fns()
    fns[3] = functools.partial(faultenvs.make_crash_env, 3, at=1, how="segv", where="reset", once=marker)
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart")
    ref = _reference(_crash_fns())
    try:
        env.seed(11)
        ref.seed(11)
        with pytest.warns(WorkerRestartWarning, match="SIGSEGV"):
            obs = env.reset()
        assert_same(obs, ref.reset())
        for i in (2, 3):
            assert "SIGSEGV" in env.reset_infos[i][RESTART_INFO_KEY]
            assert env.reset_infos[i]["episode_start"] == ref.reset_infos[i]["episode_start"]
        for i in (0, 1):
            assert RESTART_INFO_KEY not in env.reset_infos[i]
        for k in range(10):
            assert_same(env.step(_actions(k)), ref.step(_actions(k)))
    finally:
        env.close()
        ref.close()


def test_worker_killed_between_steps_is_restarted_by_get_attr_then_reported_at_the_next_step():
    env = ShmVecEnv(_crash_fns(), n_workers=2, start_method="fork", on_failure="restart")
    try:
        env.reset()
        for k in range(3):
            last = env.step(_actions(k))[0]
        victim = env._engine.workers.processes[0]
        os.kill(victim.pid, signal.SIGKILL)
        _wait_dead(victim)
        with pytest.warns(WorkerRestartWarning, match="during get_attr"):
            assert env.get_attr("steps") == [0, 0, 3, 3]  # envs 0 and 1 are new
        assert env._engine.workers.processes[0] is not victim
        out = env.step(_actions(3))
        _assert_truncated_report(out, last, [0, 1], "SIGKILL")
        assert env.get_attr("steps") == [0, 0, 4, 4]  # the new envs were not stepped with stale actions
        assert not any(RESTART_INFO_KEY in info for info in env.step(_actions(4))[3])
        assert env.get_attr("steps") == [1, 1, 5, 5]
    finally:
        env.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_restarted_worker_keeps_its_cpu_set():
    cores = sorted(os.sched_getaffinity(0))[:2]
    env = ShmVecEnv(_crash_fns(), n_workers=2, start_method="fork", on_failure="restart",
                    cpu_affinity=[cores[1], cores[0]])
    try:
        env.reset()
        victim = env._engine.workers.processes[0]
        assert psutil.Process(victim.pid).cpu_affinity() == [cores[1]]
        os.kill(victim.pid, signal.SIGKILL)
        _wait_dead(victim)
        with pytest.warns(WorkerRestartWarning):
            env.step(_actions(0))
        assert env._engine.workers.processes[0] is not victim
        assert psutil.Process(env._engine.workers.processes[0].pid).cpu_affinity() == [cores[1]]
    finally:
        env.close()


def test_worker_dying_during_a_rare_command_still_raises_in_restart_mode():
    env = ShmVecEnv(_crash_fns(bad=0, at=1, how="kill", where="attr"), n_workers=2, start_method="fork",
                    on_failure="restart")
    try:
        env.reset()
        with pytest.raises(WorkerDiedError, match="get_attr"):
            env.get_attr("explode")
        with pytest.raises(BrokenVecEnvError):
            env.step(_actions(0))
    finally:
        env.close()


def test_hanging_worker_is_killed_and_restarted_when_a_timeout_is_set(tmp_path):
    marker = str(tmp_path / "hung-once")
    fns = _crash_fns()
    fns[1] = functools.partial(faultenvs.make_crash_env, 1, at=2, how="hang", once=marker)
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart", timeout=1.0)
    try:
        last = env.reset()
        last = env.step(_actions(0))[0]
        start = time.monotonic()
        with pytest.warns(WorkerRestartWarning, match="did not answer within timeout=1 s"):
            out = env.step(_actions(1))
        assert time.monotonic() - start < 10.0
        _assert_truncated_report(out, last, [0, 1], "killed")
        for i in (2, 3):
            assert RESTART_INFO_KEY not in out[3][i]
        env.step(_actions(2))
    finally:
        env.close()


def test_failure_while_restarting_raises_and_breaks(tmp_path):
    fns = _crash_fns()
    fns[2] = functools.partial(faultenvs.flaky_factory, str(tmp_path / "built"), 2)  # dies at step 2
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart")
    try:
        env.reset()
        env.step(_actions(0))
        with pytest.raises(faultenvs.FlakyFactoryError) as info:
            env.step(_actions(1))
        notes = "\n".join(info.value.__notes__)
        assert "while restarting" in notes and "SIGKILL" in notes and "env construction" in notes
        with pytest.raises(BrokenVecEnvError, match="FlakyFactoryError"):
            env.step(_actions(2))
    finally:
        env.close()


def test_repeated_restarts_leak_no_descriptor_process_or_thread():
    env = ShmVecEnv(_crash_fns(), n_workers=2, start_method="fork", on_failure="restart")
    try:
        env.reset()
        env.step(_actions(0))
        me = psutil.Process()
        fds, threads = me.num_fds(), me.num_threads()
        env.env_method("set_nap", 0.2)
        for k in range(6):
            env.step_async(_actions(k))
            time.sleep(0.05)
            os.kill(env._engine.workers.processes[k % 2].pid, signal.SIGKILL)
            with pytest.warns(WorkerRestartWarning):
                env.step_wait()
            env.env_method("set_nap", 0.2, indices=list(env.slices[k % 2]))  # the new envs nap too
        assert env.restarts == 6
        assert me.num_fds() == fds
        assert me.num_threads() == threads
        ours = {q.pid for q in env._engine.workers.processes}
        workers = [p for p in me.children() if p.pid in ours]
        assert len(workers) == 2 and all(p.status() != psutil.STATUS_ZOMBIE for p in workers)
        assert not [p for p in me.children() if p.status() == psutil.STATUS_ZOMBIE]  # the dead were reaped
    finally:
        env.close()


_ORPHAN_AFTER_RESTART = """
import os, signal, sys, time, warnings
sys.path[:0] = [{tests!r}, {root!r}]  # the shmvec under test, wherever it is installed
import numpy as np
import testenvs

if __name__ == "__main__":
    from shmvec import ShmVecEnv  # here, not above: forkserver workers re-import this module

    warnings.simplefilter("ignore")
    env = ShmVecEnv(testenvs.bare_env_fns(3), n_workers=2, start_method={method!r}, on_failure="restart")
    env.reset()
    os.kill(env._engine.workers.processes[1].pid, signal.SIGKILL)
    env.step(np.zeros(3, dtype=np.int64))  # restarts worker 1: it maps the segment from its descriptor
    assert env.restarts == 1
    print(" ".join(str(p.pid) for p in env._engine.workers.processes), flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("method", ["forkserver"])  # not fork: the new worker must not inherit the segment
def test_restarted_workers_exit_when_the_parent_dies_and_no_segment_remains(tmp_path, method):
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_AFTER_RESTART.format(tests=_TESTS, root=SHMVEC_ROOT, method=method))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # a killed parent's pymp-* folder
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10.0
        while not all(_zombie_or_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_zombie_or_gone(p) for p in pids), "workers outlived their parent"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{parent.pid}_")]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


def test_restart_option_validation():
    with pytest.raises(ValueError, match="on_failure"):
        ShmVecEnv(testenvs.bare_env_fns(2), on_failure="retry")
    with pytest.raises(ValueError, match="max_restarts"):
        ShmVecEnv(testenvs.bare_env_fns(2), on_failure="restart", max_restarts=-1)


def test_restart_is_refused_by_the_gymnasium_style_engines():
    from shmvec.shm_vector_env import ShmVectorEnv

    with pytest.raises(ValueError, match="supported by ShmVecEnv"):
        ShmVectorEnv(testenvs.bare_env_fns(2), on_failure="restart", start_method="fork")


def test_raise_mode_is_unchanged_by_the_recovery_code():
    env = ShmVecEnv(_crash_fns(bad=0, at=2, how="raise"), n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(_actions(0))
        with pytest.raises(testenvs.EnvBoom):
            env.step(_actions(1))
        assert env.restarts == 0
    finally:
        env.close()



# ---- restarts meeting other failures (review of the tenth session) ---------------------------------

def _restart_env(fns: list, **kwargs) -> ShmVecEnv:
    kwargs.setdefault("timeout", 30.0)
    return ShmVecEnv(fns, n_workers=len(fns), start_method="fork", on_failure="restart", **kwargs)


def _kill(env: ShmVecEnv, w: int) -> None:
    proc = env._engine.workers.processes[w]
    os.kill(proc.pid, signal.SIGKILL)
    mp_wait([proc.sentinel], timeout=10)


def test_a_worker_killed_while_another_is_restarted_is_restarted_at_the_next_step(tmp_path):
    """Env 0 raises; while its new worker resets (slowly, as a simulator loads), worker 1 is
    killed. Only a failure *of the restart* breaks the vec env: worker 1 is restarted next step."""
    marker = str(tmp_path / "env0-failed")
    fns = [functools.partial(faultenvs.make_rebuilt_differs_env, 0, rebuilt="slow", at=2, how="raise",
                             once=marker)]
    fns += [functools.partial(faultenvs.make_rebuilt_differs_env, i) for i in (1, 2)]
    env = _restart_env(fns)
    spawn = env._engine.workers.launch

    def spawn_then_kill_worker_1(w):  # the OOM killer strikes as the new worker starts
        spawn(w)
        _kill(env, 1)

    try:
        env.reset()
        env.step(np.zeros(3, dtype=np.int64))
        env._engine.workers.launch = spawn_then_kill_worker_1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerRestartWarning)
            _, _, dones, infos = env.step(np.zeros(3, dtype=np.int64))
            env._engine.workers.launch = spawn
            assert dones.tolist() == [True, False, False] and RESTART_INFO_KEY in infos[0]
            _, _, dones, infos = env.step(np.zeros(3, dtype=np.int64))
        assert dones.tolist() == [False, True, False] and "SIGKILL" in infos[1][RESTART_INFO_KEY]
        assert env.restarts == 2
        env.step(np.zeros(3, dtype=np.int64))
    finally:
        env.close()


def test_close_after_step_async_skips_a_worker_restarted_before_a_rare_command(tmp_path):
    """Worker 1 killed between steps, restarted by get_attr; its reset infos went through the
    pipe (larger than the mailbox) and were read then. close() after step_async must not wait
    for them a second time (it hung)."""
    fns = [functools.partial(faultenvs.make_rebuilt_differs_env, i, reset_blob=20_000) for i in range(2)]
    env = _restart_env(fns, mailbox_bytes=4096, timeout=None)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        _kill(env, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerRestartWarning)
            assert env.get_attr("tag") == [0, 1] and env.restarts == 1
        env.step_async(np.zeros(2, dtype=np.int64))
        start = time.monotonic()
        env.close()
        assert time.monotonic() - start < 5.0
    finally:
        env.close()


def test_a_worker_stuck_before_sending_its_result_is_restarted_at_the_timeout(tmp_path):
    """Worker 1 completes its step but never sends the info it had to put in the pipe (protocol
    step 6b). With a timeout, restart mode kills and restarts it like a worker that does not
    complete in time (it raised WorkerTimeoutError and broke the vec env)."""
    marker = str(tmp_path / "env1-stuck")
    fns = [functools.partial(faultenvs.make_stuck_before_sending_env, 0, once=marker + "-never", at=10**9),
           functools.partial(faultenvs.make_stuck_before_sending_env, 1, once=marker)]
    env = _restart_env(fns, mailbox_bytes=4096, timeout=1.0)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        with pytest.warns(WorkerRestartWarning, match="did not send its result"):
            _, rewards, dones, infos = env.step(np.zeros(2, dtype=np.int64))
        assert dones.tolist() == [False, True] and rewards[1] == 0.0
        assert "did not send its result within timeout=1 s" in infos[1][RESTART_INFO_KEY]
        assert infos[1]["TimeLimit.truncated"] and env.restarts == 1
        env.step(np.zeros(2, dtype=np.int64))
        assert env.get_attr("tag") == [0, 1]
    finally:
        env.close()


def _shm_mappings() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line.split()[-1] for line in f if "/shmvec_" in line]


def test_a_failed_restart_leaves_no_mapping_after_close(tmp_path):
    """The rebuilt env raises in reset: the vec env breaks (documented), and close() still unmaps
    the block although the error (and its traceback) stays referenced by the vec env."""
    marker = str(tmp_path / "env1-failed")
    fns = [functools.partial(faultenvs.make_rebuilt_differs_env, 0),
           functools.partial(faultenvs.make_rebuilt_differs_env, 1, rebuilt="raise", at=2, how="raise",
                             once=marker)]
    env = _restart_env(fns)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(testenvs.EnvBoom, match="fails to reset"):
            env.step(np.zeros(2, dtype=np.int64))
        assert env._engine.status.failure is not None
        env.close()
        assert _shm_mappings() == []
    finally:
        env.close()


def test_a_restart_warning_turned_into_an_error_loses_no_truncation_report():
    """-W error::WorkerRestartWarning: the rare command raises the warning, and the next step still
    reports the restarted env's episode as truncated (the old episode never runs into the new)."""
    env = _restart_env([functools.partial(faultenvs.make_rebuilt_differs_env, i) for i in range(2)])
    try:
        env.reset()
        last, _, _, _ = env.step(np.zeros(2, dtype=np.int64))
        _kill(env, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("error", WorkerRestartWarning)
            with pytest.raises(WorkerRestartWarning):
                env.get_attr("tag")
        _, rewards, dones, infos = env.step(np.zeros(2, dtype=np.int64))
        assert dones.tolist() == [False, True] and RESTART_INFO_KEY in infos[1]
        np.testing.assert_array_equal(infos[1]["terminal_observation"], last[1])
    finally:
        env.close()


def test_a_step_sized_timeout_still_lets_spawn_workers_start():
    """timeout= bounds commands; starting workers (imports, env construction) waits at least 60 s."""
    env = ShmVecEnv(testenvs.bare_env_fns(2), n_workers=2, start_method="spawn", timeout=0.05)
    try:
        assert env.timeout == 0.05
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()


@pytest.mark.parametrize("cls", ["ShmVecEnv", "ShmVectorEnv"])
def test_narrower_integer_box_actions_are_checked_not_wrapped(cls):
    """int64 actions for an int32 Box: numpy calls the cast "same kind", but 2**32 + 7 would wrap
    to 7. Taken when every value fits, refused otherwise (as for a uint8 space)."""
    from shmvec import ShmVectorEnv

    fns = testenvs.bare_env_fns(2, act_kind="box_i32")
    env = (ShmVecEnv if cls == "ShmVecEnv" else ShmVectorEnv)(fns, n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(np.array([[5, -3], [100, -100]], dtype=np.int64))
        engine = env._engine
        np.testing.assert_array_equal(engine.views.act[()], [[5, -3], [100, -100]])
        with pytest.raises(ValueError, match="dtype int64"):
            env.step(np.array([[2**32 + 7, -1], [0, 0]], dtype=np.int64))
    finally:
        env.close()


def test_bool_box_takes_zero_and_one_of_another_dtype():
    env = _bare("box_bool", n=2)
    try:
        env.reset()
        env.step(np.array([[1, 0], [0, 1]], dtype=np.int64))
        np.testing.assert_array_equal(env._engine.views.act[()], [[True, False], [False, True]])
        with pytest.raises(ValueError, match="dtype int64"):
            env.step(np.array([[2, 0], [0, 1]], dtype=np.int64))
    finally:
        env.close()


def test_a_forked_process_never_releases_its_parents_workers():
    """A process forked from the parent (a worker of another vec env, or the user's own) that
    collects its copy of an unclosed vec env must not post CLOSE to the parent's workers."""
    env = ShmVecEnv(testenvs.bare_env_fns(2), n_workers=2, start_method="fork")
    try:
        env.reset()
        pid = os.fork()
        if pid == 0:  # the child: release() is a no-op here
            code = 1
            try:
                code = 0 if env._engine.workers.release() == [] and not env._engine.workers.released else 1
            except BaseException:
                pass
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        env.step(np.zeros(2, dtype=np.int64))  # the workers still serve
    finally:
        env.close()


_NO_GUARD_SCRIPT = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]  # the shmvec under test, wherever it is installed
import testenvs
from shmvec import ShmVecEnv

env = ShmVecEnv([testenvs.make_bare_env], n_workers=1, start_method="spawn", timeout=60)  # no __main__ guard
env.close()
"""


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """spawn re-imports the main module in the worker, which then tries to start a worker of its
    own and exits with code 1: the error named native crashes and the OOM killer."""
    script = tmp_path / "no_guard.py"
    script.write_text(_NO_GUARD_SCRIPT.format(tests=_TESTS, root=SHMVEC_ROOT))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "WorkerDiedError" in proc.stderr and "exit code 1" in proc.stderr, proc.stderr[-2000:]
    assert 'if __name__ == "__main__":' in proc.stderr.splitlines()[-1], proc.stderr[-2000:]


def test_a_worker_killed_with_sigterm_is_reported_as_such():
    env = ShmVecEnv(testenvs.bare_env_fns(2), n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        os.kill(env._engine.workers.processes[1].pid, signal.SIGTERM)
        with pytest.raises(WorkerDiedError, match="Something sent it SIGTERM"):
            for _ in range(100):
                env.step(np.zeros(2, dtype=np.int64))
                time.sleep(0.01)
    finally:
        env.close()
