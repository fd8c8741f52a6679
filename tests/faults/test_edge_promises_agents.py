"""Promises of the multi-agent faces at their edges, and the words of shmvec's messages (issue 36).

- An agent outside ``possible_agents``, reported anywhere (observations, rewards, terminations,
  truncations, infos, ``agents``) at a reset, a step or the worker's autoreset, raises
  ``UnknownAgentError`` at once, naming the agent, the env, the call and ``possible_agents``, on
  both multi-agent faces and under every start method; never a silent step, nor a bare
  ``KeyError`` a step later.  The fault fuzz's event for these faces draws them at random.
- ``ShmParallelEnv`` checks its actions as every face does (shmvec._actions): no float truncated,
  no array broadcast, out-of-range and NaN actions refused naming the agent and the envs.
- One env is "env 1", never "envs 1..1", in every message that names a worker's envs; an
  interrupted ``ShmParallelEnv.step`` names what that class offers; the errors docs/failures.md
  names are importable from ``shmvec``.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import warnings

import faultenvs
import numpy as np
import pytest
import testenvs
from edgeenvs_agents import AGENTS, WHERE, intruder_fns, two_agents_fns

from shmvec import (
    AlreadyPendingCallError,
    BrokenVecEnvError,
    InvalidActionError,
    InvalidActionWarning,
    ShmMultiAgentVecEnv,
    ShmParallelEnv,
    ShmVecEnv,
    WorkerDiedError,
    WorkerTimeoutError,
)
from shmvec._errors import RemoteTraceback

FACES = ["ShmMultiAgentVecEnv", "ShmParallelEnv"]
N_ENVS = 4


def _build(face: str, fns: list, method: str = "fork", **options):
    cls = ShmMultiAgentVecEnv if face == "ShmMultiAgentVecEnv" else ShmParallelEnv
    return cls(fns, n_workers=2, start_method=method, timeout=60.0, **options)


def _step(env, face: str):
    if face == "ShmMultiAgentVecEnv":
        return env.step(np.zeros(env.num_envs, dtype=np.int64))
    return env.step({a: np.zeros(env.num_envs, dtype=np.int64) for a in AGENTS})


# ---- 5. an agent outside possible_agents ----------------------------------------------------------------
def _assert_names_the_intruder(exc: BaseException, call: str, command: str, env: int = 1) -> None:
    from shmvec import UnknownAgentError

    assert isinstance(exc, UnknownAgentError) and isinstance(exc, ValueError), repr(exc)
    assert (exc.agent, exc.env_index, exc.call, exc.possible_agents) == ("intruder", env, call, AGENTS)
    message = str(exc)
    assert "'intruder'" in message and f"env {env} " in message and f"of its {call}()" in message, message
    assert f"possible_agents {AGENTS}" in message, message
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert f"raised by env {env} (worker" in notes and f"during {command};" in notes, notes
    assert isinstance(exc.__cause__, RemoteTraceback) and "UnknownAgentError" in exc.__cause__.tb


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("where", WHERE)
def test_an_agent_outside_possible_agents_in_a_step_raises_at_that_step(face, where):
    env = _build(face, intruder_fns(N_ENVS, bad=1, where=where, when="step", at=2))
    try:
        env.reset()
        _step(env, face)  # step 1: every agent is one of possible_agents
        with pytest.raises(ValueError) as info:
            _step(env, face)  # step 2: env 1 reports "intruder"
        _assert_names_the_intruder(info.value, "step", "step")
        with pytest.raises(BrokenVecEnvError):
            _step(env, face)  # an env error: the vec env is broken, as for any env error
    finally:
        env.close()


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("where", ["observations", "infos", "agents"])
@pytest.mark.parametrize("when", ["reset", "autoreset"])
def test_an_agent_outside_possible_agents_in_a_reset_raises_at_that_reset(face, where, when):
    """At the front-end's reset, and at the reset the worker makes as an episode ends (in a step)."""
    env = _build(face, intruder_fns(N_ENVS, bad=1, where=where, when=when, at=2))
    try:
        if when == "reset":
            with pytest.raises(ValueError) as info:
                env.reset()
            _assert_names_the_intruder(info.value, "reset", "reset")
        else:
            env.reset()
            _step(env, face)
            with pytest.raises(ValueError) as info:
                _step(env, face)  # every env's episode ends at step 2, and env 1's new one has the intruder
            _assert_names_the_intruder(info.value, "reset", "step")
    finally:
        env.close()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("face, where", [("ShmMultiAgentVecEnv", "rewards"), ("ShmParallelEnv", "infos"),
                                         ("ShmParallelEnv", "agents")])
def test_an_agent_outside_possible_agents_is_named_under_every_start_method(method, face, where):
    env = _build(face, intruder_fns(2, bad=1, where=where, when="step", at=1), method=method)
    try:
        env.reset()
        with pytest.raises(ValueError) as info:
            _step(env, face)
        _assert_names_the_intruder(info.value, "step", "step")
    finally:
        env.close()


def test_an_agent_outside_possible_agents_is_named_with_restarts_too():
    """on_failure="restart": the env's error restarts its worker as any env error does; the rebuilt
    env intrudes again at its own step 1, and past max_restarts the error is the vec env's."""
    from shmvec import TooManyRestartsError, WorkerRestartWarning

    env = ShmParallelEnv(intruder_fns(2, bad=1, where="terminations", when="step", at=1), n_workers=2,
                         start_method="fork", timeout=60.0, on_failure="restart", max_restarts=1)
    try:
        env.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            *_, infos = _step(env, "ShmParallelEnv")  # env 1 raised: its worker is restarted
            assert infos["agent_0"]["_shmvec_restarted"].tolist() == [False, True]
            assert "UnknownAgentError" in infos["agent_0"]["shmvec_restarted"][1]
            with pytest.raises(TooManyRestartsError) as info:
                for _ in range(3):
                    _step(env, "ShmParallelEnv")  # the rebuilt env intrudes again at its own step 1
        message = str(info.value)
        assert "UnknownAgentError" in message and "'intruder'" in message and str(AGENTS) in message, message
        restarted = [str(w.message) for w in caught if issubclass(w.category, WorkerRestartWarning)]
        assert restarted and "UnknownAgentError" in restarted[0] and "'intruder'" in restarted[0]
    finally:
        env.close()


FUZZ_FIRST_SEED = int(os.environ.get("SHMVEC_FAULT_FUZZ_SEED", "100"))
FUZZ_CASES = int(os.environ.get("SHMVEC_AGENT_FUZZ_CONFIGS", "8"))


def _draw_intruder(seed: int) -> dict:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 5])
    when = rng.choice(["step", "step", "reset", "autoreset"])
    return {
        "face": rng.choice(FACES), "n": n, "n_workers": rng.randint(1, min(n, 3)),
        "method": rng.choice(["fork", "fork", "forkserver", "spawn"]), "bad": rng.randrange(n), "when": when,
        "where": rng.choice(WHERE if when == "step" else ("observations", "infos", "agents")),
        "at": rng.randint(1, 3),
    }


@pytest.mark.parametrize("seed", range(FUZZ_FIRST_SEED, FUZZ_FIRST_SEED + FUZZ_CASES))
def test_fuzzed_agents_outside_possible_agents_are_named_where_they_appear(seed):
    """The fault fuzz's event for the multi-agent faces: a random face, envs, workers, start method,
    env, report and moment; the error comes at that reset or step, never before, naming it all.
    Longer runs: ``SHMVEC_AGENT_FUZZ_CONFIGS=100`` (and ``SHMVEC_FAULT_FUZZ_SEED``)."""
    case = _draw_intruder(seed)
    face = case["face"]
    fns = intruder_fns(case["n"], bad=case["bad"], where=case["where"], when=case["when"], at=case["at"])
    cls = ShmMultiAgentVecEnv if face == "ShmMultiAgentVecEnv" else ShmParallelEnv
    env = cls(fns, n_workers=case["n_workers"], start_method=case["method"], timeout=60.0)
    try:
        if case["when"] == "reset":
            with pytest.raises(ValueError) as info:
                env.reset()
            call, command = "reset", "reset"
        else:
            env.reset()
            for _ in range(case["at"] - 1):
                _step(env, face)  # nothing unknown yet: no error
            with pytest.raises(ValueError) as info:
                _step(env, face)
            call, command = ("step" if case["when"] == "step" else "reset"), "step"
        _assert_names_the_intruder(info.value, call, command, env=case["bad"])
    finally:
        env.close()


# ---- 6. ShmParallelEnv's actions, checked as every face's ----------------------------------------------
def _parallel(actions: str = "discrete", **options) -> ShmParallelEnv:
    return ShmParallelEnv(two_agents_fns(N_ENVS, actions=actions), n_workers=2, start_method="fork",
                          timeout=60.0, **options)


def _ok(value=0) -> np.ndarray:
    return np.full(N_ENVS, value, dtype=np.int64)


@pytest.mark.parametrize("bad, match", [
    (np.array([1.7, 2.2, 0.5, 3.9]), r"actions\['agent_1'\] have dtype float64, which does not cast safely to int64.*"
                                     r"got \[1\.7, 2\.2, 0\.5, 3\.9\]"),
    ([1.7, 2.2, 0.5, 3.9], r"actions\['agent_1'\] have dtype float64, which does not cast safely"),
    (np.array([0.0, 1.0, np.nan, 1.0]), r"actions\['agent_1'\] have dtype float64, which does not cast safely"),
    (np.array([2]), r"actions\['agent_1'\] have shape \(1,\); expected \(4,\)"),
    (2, r"actions\['agent_1'\] have shape \(\); expected \(4,\)"),
    ([0, 1, 2], r"actions\['agent_1'\] have shape \(3,\); expected \(4,\).*a list of 3 per-env actions for 4 envs"),
    (np.zeros(8, dtype=np.int64), r"actions\['agent_1'\] have shape \(8,\); expected \(4,\)"),
    (np.zeros((4, 2), dtype=np.int64), r"actions\['agent_1'\] have shape \(4, 2\); expected \(4,\)"),
], ids=["floats", "float-list", "float-nan", "one-element", "scalar", "too-few", "too-many", "two-per-env"])
def test_parallel_env_refuses_a_batch_that_is_not_one_exact_action_per_env(bad, match):
    env = _parallel()
    try:
        env.reset()
        with pytest.raises(ValueError, match=match):
            env.step({"agent_0": _ok(), "agent_1": bad})
        assert env.get_attr("t") == (0,) * N_ENVS  # nothing was sent
        env.step({"agent_0": _ok(1), "agent_1": np.array([1.0, 2.0, 0.0, 1.0])})  # whole floats: exact
        assert [a["agent_1"] for a in env.get_attr("last_actions")] == [1, 2, 0, 1]
        assert env.get_attr("t") == (1,) * N_ENVS
    finally:
        env.close()


def test_parallel_env_names_the_agent_and_the_envs_of_invalid_actions():
    env = _parallel()
    try:
        env.reset()
        with pytest.raises(InvalidActionError, match=r"actions\['agent_1'\] of envs \[1, 3\] are out of range for "
                                                     r"Discrete\(3\): got \[\[5\], \[-1\]\]") as info:
            env.step({"agent_0": _ok(), "agent_1": np.array([0, 5, 1, -1])})
        assert info.value.env_indices == [1, 3]
        with pytest.raises(InvalidActionError, match=r"actions\['agent_0'\] of envs \[0\]"):
            env.step({"agent_0": np.array([3, 0, 0, 0]), "agent_1": _ok()})
        assert env.get_attr("t") == (0,) * N_ENVS  # nothing was sent
    finally:
        env.close()
    env = _parallel("box")
    try:
        env.reset()
        good = np.zeros((N_ENVS, 2), dtype=np.float32)
        nan = good.copy()
        nan[2, 1] = np.nan
        with pytest.raises(InvalidActionError, match=r"actions\['agent_1'\] of envs \[2\] contain NaN"):
            env.step({"agent_0": good, "agent_1": nan})
        with pytest.raises(ValueError, match=r"actions\['agent_0'\] have shape \(2,\); expected \(4, 2\)"):
            env.step({"agent_0": np.array([0.5, -0.5], dtype=np.float32), "agent_1": good})  # one row, not broadcast
        with pytest.raises(ValueError, match=r"actions\['agent_0'\] have shape \(2, 4\); expected \(4, 2\)"):
            env.step({"agent_0": np.zeros((2, N_ENVS)), "agent_1": good})  # transposed
        assert env.get_attr("t") == (0,) * N_ENVS
        rows = np.arange(N_ENVS * 2, dtype=np.float64).reshape(N_ENVS, 2) / 10  # float64 into float32: taken
        env.step({"agent_0": rows, "agent_1": good})
        np.testing.assert_allclose([a["agent_0"] for a in env.get_attr("last_actions")], rows, rtol=1e-6)
    finally:
        env.close()


def test_parallel_env_warns_once_naming_the_agent_with_invalid_actions_warn():
    env = _parallel(invalid_actions="warn")
    try:
        env.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.step({"agent_0": _ok(), "agent_1": np.array([0, 5, 1, 0])})
        warned = [w for w in caught if issubclass(w.category, InvalidActionWarning)]
        assert len(warned) == 1, [str(w.message) for w in warned]
        assert "actions['agent_1'] of envs [1] are out of range" in str(warned[0].message)
        assert [a["agent_1"] for a in env.get_attr("last_actions")] == [0, 5, 1, 0]  # sent as they are
    finally:
        env.close()


@pytest.mark.parametrize("bad", ["floats", "one-element"])
def test_every_face_refuses_the_same_bad_batch_with_the_same_error(bad):
    """ShmVecEnv, ShmMultiAgentVecEnv and ShmParallelEnv: one check (shmvec._actions), one error type."""
    import gymnasium as gym

    value = np.array([1.7, 2.2, 0.5, 3.9]) if bad == "floats" else np.array([2])
    envs = [ShmVecEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2, start_method="fork", timeout=60.0),
            ShmMultiAgentVecEnv(two_agents_fns(2), n_workers=2, start_method="fork", timeout=60.0),
            _parallel()]
    try:
        for env in envs:
            env.reset()
        calls = [lambda: envs[0].step(value), lambda: envs[1].step(value),
                 lambda: envs[2].step({"agent_0": _ok(), "agent_1": value})]
        for env, call in zip(envs, calls):
            with pytest.raises(ValueError) as info:
                call()
            if bad == "floats":
                assert "have dtype float64, which does not cast safely to int64" in str(info.value), type(env)
        assert envs[2].get_attr("t") == (0,) * N_ENVS
    finally:
        for env in envs:
            env.close()


# ---- 11. messages and names ------------------------------------------------------------------------------
def _one_env_per_worker(**crash) -> list:
    """Two CrashEnvs, one per worker; env 1 crashes as ``crash`` says."""
    return [functools.partial(faultenvs.make_crash_env, i, **(crash if i == 1 else {})) for i in range(2)]


def _acts() -> np.ndarray:
    return np.zeros(2, dtype=np.int64)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_of_one_env_that_dies_is_named_with_env_not_a_range(method):
    env = ShmVecEnv(_one_env_per_worker(at=2, how="kill"), n_workers=2, start_method=method, timeout=60.0)
    try:
        env.reset()
        env.step(_acts())
        with pytest.raises(WorkerDiedError) as info:
            env.step(_acts())
        assert "worker 1 (env 1) died during step with signal SIGKILL (9), in env 1." in str(info.value)
        assert "envs 1..1" not in str(info.value)
    finally:
        env.close()


def test_a_worker_of_one_env_that_hangs_is_named_with_env_not_a_range():
    env = ShmVecEnv(_one_env_per_worker(at=2, how="hang"), n_workers=2, start_method="fork", timeout=1.0)
    try:
        env.reset()
        env.step(_acts())
        with pytest.raises(WorkerTimeoutError) as info:
            env.step(_acts())
        assert "workers [1] (env 1; worker 1, in env 1) did not answer within 1 s" in str(info.value)
    finally:
        env.close()
    env = ShmVecEnv(_one_env_per_worker(at=1, how="hang", where="attr"), n_workers=2, start_method="fork",
                    timeout=1.0)
    try:
        env.reset()
        with pytest.raises(WorkerTimeoutError) as info:
            env.get_attr("explode")
        assert "worker 1 (env 1, in env 1) did not answer within 1 s." in str(info.value)
    finally:
        env.close()


def test_a_worker_of_one_env_that_dies_in_close_is_named_with_env_not_a_range():
    env = ShmVecEnv(_one_env_per_worker(at=1, how="exit", where="close"), n_workers=2, start_method="fork",
                    timeout=60.0)
    env.reset()
    with pytest.raises(WorkerDiedError) as info:
        env.close()
    assert "worker 1 (env 1) died during close with exit code 3" in str(info.value)


@pytest.mark.parametrize("n_envs, named", [(2, "worker 0 (env 0)"), (4, "worker 0 (envs 0..1)")])
def test_a_result_that_does_not_load_names_one_env_as_env(n_envs, named):
    env = ShmVecEnv([testenvs.make_unloadable_info_env] * n_envs, n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step(np.zeros(n_envs, dtype=np.int64))
        with pytest.raises(Exception, match="only the worker can rebuild this") as info:
            env.step(np.zeros(n_envs, dtype=np.int64))
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert f"the step result of {named} was written there" in notes, notes
    finally:
        env.close()
    env = ShmVecEnv([functools.partial(testenvs.make_pipe_env, i) for i in range(2)], n_workers=2,
                    start_method="fork", timeout=30.0)
    try:
        env.reset()
        with pytest.raises(LookupError) as info:
            env.env_method("unloadable", indices=[1])
        assert "the answer of worker 1 (env 1) to env_method" in "\n".join(info.value.__notes__)
    finally:
        env.close()


def test_env_indices_are_named_by_one_helper():
    from shmvec._errors import envs_named

    assert envs_named([1]) == "env 1" and envs_named(range(3, 4)) == "env 3"
    assert envs_named(range(0, 4)) == "envs 0..3" and envs_named([0, 1, 2, 5]) == "envs 0..2, 5"
    assert envs_named([4, 6]) == "envs 4, 6" and envs_named([]) == "no env"


def _interrupt_a_step(env: ShmParallelEnv) -> None:
    """Steps ``env`` (whose steps nap 1 s) and lands a KeyboardInterrupt in the parent's wait, as Ctrl-C does."""
    def on_alarm(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            env.step({a: np.zeros(env.num_envs, dtype=np.int64) for a in AGENTS})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_an_interrupted_parallel_env_step_names_what_the_class_offers(method):
    env = ShmParallelEnv(two_agents_fns(2, nap_s=1.0), n_workers=2, start_method=method, timeout=60.0)
    try:
        env.reset()
        _interrupt_a_step(env)
        calls = {
            "step": lambda: env.step({a: np.zeros(2, dtype=np.int64) for a in AGENTS}),
            "render": env.render, "state": env.state, "call": lambda: env.call("t"),
            "get_attr": lambda: env.get_attr("t"), "set_attr": lambda: env.set_attr("nap_s", 0.0),
        }
        for what, call in calls.items():
            with pytest.raises(AlreadyPendingCallError) as info:
                call()
            message = str(info.value)
            assert message.startswith(f"{what}() while a step is in flight"), message
            assert "reset()" in message and "step_wait" not in message and "step_async" not in message, message
        env.reset()  # finishes the interrupted step and drops it
        assert env.get_attr("t") == (0, 0)
        env.set_attr("nap_s", 0.0)
        obs, *_ = env.step({a: np.zeros(2, dtype=np.int64) for a in AGENTS})
        assert obs["agent_1"][:, 1].tolist() == [1.0, 1.0]
    finally:
        env.close()


def test_the_errors_docs_failures_names_are_importable_from_shmvec():
    import shmvec
    from shmvec import ConcurrentCallError, ForkedVecEnvError, UnknownAgentError  # noqa: F401

    from shmvec import _errors

    for name in ("ConcurrentCallError", "ForkedVecEnvError", "UnknownAgentError"):
        assert name in shmvec.__all__ and getattr(shmvec, name) is getattr(_errors, name)
        assert issubclass(getattr(shmvec, name), shmvec.ShmVecEnvError)


def test_a_step_collected_in_another_thread_raises_shmvecs_concurrent_call_error():
    import shmvec

    env = ShmMultiAgentVecEnv(two_agents_fns(2), n_workers=2, start_method="fork", timeout=60.0)
    try:
        env.reset()
        env.step_async(np.zeros(4, dtype=np.int64))
        got: list = []

        def collect() -> None:
            try:
                env.step_wait()
            except BaseException as exc:
                got.append(exc)

        t = threading.Thread(target=collect)
        t.start()
        t.join(30)
        assert got and isinstance(got[0], shmvec.ConcurrentCallError), got
        env.step_wait()
    finally:
        env.close()


@pytest.mark.parametrize("face", FACES)
def test_a_forked_child_gets_shmvecs_forked_vec_env_error(face):
    import shmvec

    env = _build(face, two_agents_fns(2))
    try:
        env.reset()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                code = 1
                try:
                    _step(env, face)
                except shmvec.ForkedVecEnvError:
                    code = 0
                except BaseException:
                    code = 2
                env.close()
                os.write(write, bytes([code]))
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        got = os.read(read, 1)
        os.close(read)
        assert got == b"\x00", got
        _step(env, face)  # the parent's vec env goes on
    finally:
        env.close()
