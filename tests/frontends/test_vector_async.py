"""ShmVectorEnv as a drop-in for Gymnasium's AsyncVectorEnv: its constructor's keywords, its
asynchronous pairs with their timeouts, its errors and its attributes.

The main test runs a typical AsyncVectorEnv script with only the class name changed, step for step
against AsyncVectorEnv itself and against SyncVectorEnv (the same script, synchronous), on the
same seeds.  Then: what a wait's ``timeout=`` leaves behind (compared with what AsyncVectorEnv
does), every misuse error, the keywords and the hints for arguments in another library's order.
"""

from __future__ import annotations

import functools
import gc
import inspect
import multiprocessing as mp
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from test_vector import assert_same_vec

import testenvs
from helpers import close_all

# Gymnasium before 1.2 lets AsyncVectorEnv take any number of actions (zip without strict=True).
GYM_BEFORE_1_2 = tuple(int(p) for p in gym.__version__.split(".")[:2]) < (1, 2)
from shmvec import (
    AlreadyPendingCallError,
    NoAsyncCallError,
    ShmEnvPool,
    ShmVectorEnv,
    SpaceError,
)

N_STEPS = 40


@pytest.fixture(scope="module", autouse=True)
def _multiprocessing_heap():
    """AsyncVectorEnv(shared_memory=True) allocates from multiprocessing's process-wide heap, whose
    arenas (a descriptor each) live as long as the process: one is made before the leak check's
    snapshots, so that the small buffers of these tests come from it (as tests/units/test_bench_cli.py)."""
    block = mp.get_context("fork").Array("B", 1 << 20, lock=False)
    del block
    yield


@pytest.fixture(autouse=True)
def _collect_async_vector_envs():
    """AsyncVectorEnv.close() joins its workers but leaves its error queue's pipe and its processes'
    sentinels to the garbage collector: collected before the leak check looks (ours are closed)."""
    yield
    gc.collect()


# ---------------------------------------------------------------------------------------------
# A typical AsyncVectorEnv script, with only the class name changed
# ---------------------------------------------------------------------------------------------

def typical_script(envs, seed: int, use_async: bool = True, n_steps: int = N_STEPS) -> list:
    """What a typical AsyncVectorEnv loop gets back, call by call: reset_async/reset_wait,
    step_async/step_wait(timeout=...), call_async/call_wait, get_attr/set_attr, a masked reset
    where autoreset is off.  ``use_async=False`` runs the same loop through reset/step/call (for
    SyncVectorEnv, which has no asynchronous pairs)."""
    out: list = []

    def reset(**kwargs):
        if use_async:
            envs.reset_async(**kwargs)
            return envs.reset_wait(timeout=30)
        return envs.reset(**kwargs)

    def step(actions):
        if use_async:
            envs.step_async(actions)
            return envs.step_wait(timeout=30)
        return envs.step(actions)

    def call(name, *args, **kwargs):
        if use_async:
            envs.call_async(name, *args, **kwargs)
            return envs.call_wait(timeout=30)
        return envs.call(name, *args, **kwargs)

    mode = envs.metadata["autoreset_mode"]
    out.append(("reset", reset(seed=seed)))
    envs.action_space.seed(seed)
    for t in range(n_steps):
        result = step(envs.action_space.sample())
        out.append((f"step {t}", result))
        _, _, terminated, truncated, _ = result
        if mode == AutoresetMode.DISABLED and (terminated | truncated).any():
            out.append((f"masked reset {t}", reset(options={"reset_mask": terminated | truncated})))
        if t % 10 == 4:
            out.append((f"call {t}", call("bump", 2, times=3)))
            out.append((f"describe {t}", call("describe")))
            out.append((f"get_attr {t}", envs.get_attr("counter")))
            envs.set_attr("scale", [0.5 + i + t for i in range(envs.num_envs)])
            out.append((f"get_attr scale {t}", envs.get_attr("scale")))
        if t == n_steps // 2:
            out.append(("reset in the middle", reset(seed=[seed + 10 + i for i in range(envs.num_envs)],
                                                     options={"offset": 1.5})))
    out.append(("np_random_seed", envs.np_random_seed))
    out.append(("np_random", tuple(g.bit_generator.state["state"]["state"] for g in envs.np_random)))
    return out


def assert_same_run(got: list, want: list, what: str) -> None:
    assert [k for k, _ in got] == [k for k, _ in want], what
    for (key, a), (_, b) in zip(got, want):
        assert_same_vec(a, b, f"{what}: {key}")


SCRIPT_CASES = [
    pytest.param("fork", AutoresetMode.NEXT_STEP, "box", "discrete", id="fork-NextStep-box"),
    pytest.param("fork", AutoresetMode.SAME_STEP, "dict", "box", id="fork-SameStep-dict"),
    pytest.param("fork", AutoresetMode.DISABLED, "tuple", "multidiscrete", id="fork-Disabled-tuple"),
    pytest.param("spawn", AutoresetMode.SAME_STEP, "box", "discrete", id="spawn-SameStep-box"),
]


@pytest.mark.parametrize("context, mode, obs_kind, act_kind", SCRIPT_CASES)
def test_a_typical_async_vector_env_script_runs_unchanged(context, mode, obs_kind, act_kind):
    """The same script, the same keywords, only the class changed: ShmVectorEnv gives what
    AsyncVectorEnv gives, and what SyncVectorEnv gives to the synchronous script."""
    fns = testenvs.spaces_env_fns(obs_kind, act_kind, 4, term_prob=0.1)
    kwargs = dict(shared_memory=True, copy=True, context=context, daemon=True, autoreset_mode=mode)
    envs = ref = sync = None
    try:
        envs = ShmVectorEnv(fns, **kwargs)
        ref = AsyncVectorEnv(fns, **kwargs)
        sync = SyncVectorEnv(fns, autoreset_mode=mode)
        for name in ("num_envs", "metadata", "render_mode", "observation_space", "action_space",
                     "single_observation_space", "single_action_space", "autoreset_mode", "copy", "shared_memory",
                     "context", "daemon", "observation_mode"):
            assert getattr(envs, name) == getattr(ref, name), name
        got = typical_script(envs, seed=11)
        assert_same_run(got, typical_script(ref, seed=11), "against AsyncVectorEnv")
        assert_same_run(got, typical_script(sync, seed=11, use_async=False), "against SyncVectorEnv")
        ended = sum(int(((out[2] | out[3]).sum())) for key, out in got if key.startswith("step"))
        assert ended > 0  # the episodes' ends (and the autoreset) were exercised
    finally:
        close_all(envs, ref, sync)


def test_synchronous_calls_equal_their_async_pairs():
    fns = testenvs.spaces_env_fns("dict", "discrete", 5, term_prob=0.2)
    a = ShmVectorEnv(fns, n_workers=2, context="fork", autoreset_mode="SameStep")
    b = ShmVectorEnv(fns, n_workers=3, context="fork", autoreset_mode="SameStep")
    try:
        assert_same_run(typical_script(a, seed=3), typical_script(b, seed=3, use_async=False), "pairs vs calls")
    finally:
        close_all(a, b)


def test_the_public_surface_of_async_vector_env_is_there():
    """Every public method of AsyncVectorEnv, with every one of its parameters; every constructor
    argument; every attribute, but those that hold AsyncVectorEnv's own machinery."""
    not_carried = {"env_fns", "observations", "parent_pipes", "processes", "error_queue"}  # docs/gymnasium.md
    for name, member in vars(AsyncVectorEnv).items():
        if name.startswith("_") or not callable(member):
            continue
        ours = getattr(ShmVectorEnv, name)
        theirs = set(inspect.signature(member).parameters)
        assert theirs <= set(inspect.signature(ours).parameters), name
    assert set(inspect.signature(AsyncVectorEnv.__init__).parameters) <= set(
        inspect.signature(ShmVectorEnv.__init__).parameters)
    assert set(inspect.signature(AsyncVectorEnv.close_extras).parameters) <= set(
        inspect.signature(ShmVectorEnv.close_extras).parameters)
    envs = ShmVectorEnv(testenvs.spaces_env_fns("box", "discrete", 2), context="fork", n_workers=1)
    try:
        for name in set(AsyncVectorEnv.__annotations__) - not_carried:
            assert hasattr(envs, name), name
        assert envs.unwrapped is envs
        assert repr(envs) == "ShmVectorEnv(num_envs=2)"
        assert envs.worker is None and envs.daemon and envs.shared_memory and envs.context == "fork"
    finally:
        envs.close()


# ---------------------------------------------------------------------------------------------
# A wait's timeout
# ---------------------------------------------------------------------------------------------

def _napping_fns(seconds: float, n: int = 2, reset_seconds: float = 0.0) -> list:
    return [functools.partial(testenvs.make_napping_spaces_env, seconds, i, reset_seconds) for i in range(n)]


def test_step_wait_past_its_timeout_leaves_the_step_for_the_next_step_wait():
    """As AsyncVectorEnv: ``multiprocessing.TimeoutError`` with its message.  Unlike it, the step
    stays in flight and the next step_wait() returns it: AsyncVectorEnv forgets it (step_wait()
    then raises NoAsyncCallError, and its next step reads the late step's results)."""
    fns = _napping_fns(0.4)
    envs = ShmVectorEnv(fns, context="fork", n_workers=2, timeout=30.0)  # the vec env's own timeout: not this
    sync = SyncVectorEnv(fns)
    ref = AsyncVectorEnv(fns, context="fork")
    try:
        for e in (envs, sync, ref):
            e.reset(seed=5)
        act = np.array([1, 2])
        for e in (envs, ref):
            e.step_async(act)
            since = time.monotonic()
            with pytest.raises(mp.TimeoutError, match=r"The call to `step_wait` has timed out after 0.05 second\(s\)"):
                e.step_wait(timeout=0.05)
            assert time.monotonic() - since < 0.35  # it did not wait for the step
        with pytest.raises(gym.error.NoAsyncCallError):  # AsyncVectorEnv: the step is forgotten
            ref.step_wait()
        assert envs._engine.status.failure is None
        with pytest.raises(AlreadyPendingCallError, match="step_wait") as info:
            envs.step_async(act)
        assert info.value.name == "step"
        with pytest.raises(AlreadyPendingCallError):
            envs.get_attr("tag")
        with pytest.raises(mp.TimeoutError):  # again: still in flight
            envs.step_wait(timeout=0.01)
        assert_same_vec(envs.step_wait(), sync.step(act), "the step that timed out")
        envs.step_async(act)
        assert_same_vec(envs.step_wait(timeout=20), sync.step(act), "a step within its timeout")
        envs.step_async(act)
        with pytest.raises(mp.TimeoutError):
            envs.step_wait(timeout=0)
        assert_same_vec(envs.reset(seed=6), sync.reset(seed=6), "reset() drops a step that timed out")
        assert_same_vec(envs.step(act), sync.step(act), "the step after")
    finally:
        close_all(envs, sync, ref)


def test_reset_wait_and_call_wait_past_their_timeout_leave_them_in_flight():
    fns = _napping_fns(0.0, reset_seconds=0.4)
    envs = ShmVectorEnv(fns, context="fork", n_workers=2)
    sync = SyncVectorEnv(fns)
    try:
        envs.reset_async(seed=[1, 2], options={"offset": 0.5})
        with pytest.raises(mp.TimeoutError, match=r"The call to `reset_wait` has timed out after 0.05 second\(s\)"):
            envs.reset_wait(timeout=0.05)
        with pytest.raises(AlreadyPendingCallError, match="reset_wait") as info:
            envs.step_async(np.zeros(2, dtype=np.int64))
        assert info.value.name == "reset"
        with pytest.raises(AlreadyPendingCallError):
            envs.reset(seed=0)  # as AsyncVectorEnv: a reset in flight is not dropped
        assert_same_vec(envs.reset_wait(), sync.reset(seed=[1, 2], options={"offset": 0.5}), "the reset")
        envs.call_async("nap", 0.4)
        with pytest.raises(mp.TimeoutError, match=r"The call to `call_wait` has timed out after 0.05 second\(s\)"):
            envs.call_wait(timeout=0.05)
        with pytest.raises(AlreadyPendingCallError, match="call_wait") as info:
            envs.set_attr("scale", 2.0)
        assert info.value.name == "call"
        assert envs.call_wait(timeout=20) == sync.call("nap", 0.0) == (0, 1)
        act = np.ones(2, dtype=np.int64)
        assert_same_vec(envs.step(act), sync.step(act), "the step after")
    finally:
        close_all(envs, sync)


@pytest.mark.parametrize("pending", ["step", "reset", "call"])
@pytest.mark.parametrize("how", ["close", "terminate", "with"])
def test_close_with_a_call_in_flight_leaves_nothing_behind(pending, how):
    envs = ShmVectorEnv(_napping_fns(0.3, reset_seconds=0.3), context="fork", n_workers=2)
    with envs:
        envs.reset(seed=0)
        if pending == "step":
            envs.step_async(np.zeros(2, dtype=np.int64))
        elif pending == "reset":
            envs.reset_async(seed=1)
        else:
            envs.call_async("nap", 0.3)
        if how == "close":
            envs.close(timeout=10)
        elif how == "terminate":
            since = time.monotonic()
            envs.close(terminate=True)
            assert time.monotonic() - since < 2.0
    assert envs.closed
    envs.close()  # idempotent


def test_an_env_that_raises_during_a_timed_wait_raises_there():
    envs = ShmVectorEnv([functools.partial(testenvs.make_raising_env, 2)] * 2, context="fork", n_workers=2)
    try:
        envs.reset(seed=0)
        envs.step_async(np.zeros(2, dtype=np.int64))
        envs.step_wait(timeout=10)
        envs.step_async(np.zeros(2, dtype=np.int64))
        with pytest.raises(testenvs.EnvBoom):
            envs.step_wait(timeout=10)
    finally:
        envs.close()


# ---------------------------------------------------------------------------------------------
# Misuse: Gymnasium's errors, where AsyncVectorEnv raises them
# ---------------------------------------------------------------------------------------------

def _misuse(envs) -> list:
    """Each misuse, and the type and ``name`` of the error it raised (None: it did not raise)."""
    act = np.zeros(envs.num_envs, dtype=np.int64)
    out = []

    def attempt(what, call):
        try:
            call()
            out.append((what, None, None))
        except (gym.error.AlreadyPendingCallError, gym.error.NoAsyncCallError) as exc:
            out.append((what, [c for c in (gym.error.AlreadyPendingCallError, gym.error.NoAsyncCallError)
                               if isinstance(exc, c)][0].__name__, exc.name))

    envs.reset(seed=0)
    attempt("step_wait without step_async", envs.step_wait)
    attempt("reset_wait without reset_async", envs.reset_wait)
    attempt("call_wait without call_async", envs.call_wait)
    envs.step_async(act)
    attempt("step_async twice", lambda: envs.step_async(act))
    attempt("call_async while stepping", lambda: envs.call_async("describe"))
    attempt("reset_wait while stepping", envs.reset_wait)
    attempt("call while stepping", lambda: envs.call("describe"))
    attempt("set_attr while stepping", lambda: envs.set_attr("scale", 1.0))
    envs.step_wait()
    envs.reset_async(seed=1)
    attempt("reset_async twice", lambda: envs.reset_async(seed=1))
    attempt("step_async while resetting", lambda: envs.step_async(act))
    attempt("step_wait while resetting", envs.step_wait)
    attempt("call_async while resetting", lambda: envs.call_async("describe"))
    envs.reset_wait()
    envs.call_async("describe")
    attempt("call_async twice", lambda: envs.call_async("describe"))
    attempt("reset_async while calling", lambda: envs.reset_async(seed=1))
    attempt("step_async while calling", lambda: envs.step_async(act))
    attempt("get_attr while calling", lambda: envs.get_attr("tag"))
    attempt("step_wait while calling", envs.step_wait)
    envs.call_wait()
    return out


def test_misuse_raises_gymnasiums_errors_as_async_vector_env_does():
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    envs, ref = ShmVectorEnv(fns, context="fork", n_workers=2), AsyncVectorEnv(fns, context="fork")
    try:
        got = _misuse(envs)
        assert got == _misuse(ref)
        assert all(kind is not None for _, kind, _ in got)
        act = np.ones(2, dtype=np.int64)
        envs.step(act)  # still usable
    finally:
        close_all(envs, ref)


def test_every_call_after_close_raises_closed_environment_error():
    envs = ShmVectorEnv(testenvs.spaces_env_fns("box", "discrete", 2), context="fork", n_workers=1)
    envs.close()
    act = np.zeros(2, dtype=np.int64)
    for call in (envs.reset, envs.reset_async, envs.reset_wait, lambda: envs.step(act), lambda: envs.step_async(act),
                 envs.step_wait, lambda: envs.call("describe"), lambda: envs.call_async("describe"), envs.call_wait,
                 lambda: envs.get_attr("tag"), lambda: envs.set_attr("scale", 1.0), envs.render):
        with pytest.raises(gym.error.ClosedEnvironmentError, match="this ShmVectorEnv is closed"):
            call()


@pytest.mark.filterwarnings("ignore:.*(Worker-|Traceback|Raising the last exception):UserWarning")
def test_call_refuses_the_methods_with_vector_counterparts_as_async_vector_env():
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    envs, ref = ShmVectorEnv(fns, context="fork", n_workers=1), AsyncVectorEnv(fns, context="fork")
    try:
        with pytest.raises(ValueError, match="Trying to call function `reset` with `call`"):
            ref.call("reset")  # (raised in its workers, which it then shuts down)
        for name in ("reset", "step", "close"):
            with pytest.raises(ValueError, match=f"Trying to call function `{name}` with `call`, use `{name}`"):
                envs.call(name)
        with pytest.raises(ValueError, match="use `step` directly"):
            envs.call_async("step")
        assert envs.call("describe") == ("box/discrete#0", "box/discrete#1")  # refused before anything was sent
    finally:
        close_all(envs, ref)


def test_reset_drops_a_step_in_flight_where_async_vector_env_refuses():
    """A documented difference: reset() and reset_async() finish and drop a step in flight (the
    way out after a Ctrl-C); AsyncVectorEnv raises AlreadyPendingCallError."""
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    envs, sync = ShmVectorEnv(fns, context="fork", n_workers=2), SyncVectorEnv(fns)
    try:
        act = np.ones(2, dtype=np.int64)
        envs.reset(seed=1)
        envs.step_async(act)
        envs.reset_async(seed=4)
        assert_same_vec(envs.reset_wait(), sync.reset(seed=4), "reset_async after step_async")
        envs.step_async(act)
        assert_same_vec(envs.reset(seed=5), sync.reset(seed=5), "reset after step_async")
        assert_same_vec(envs.step(act), sync.step(act), "the step after")
    finally:
        close_all(envs, sync)


@pytest.mark.parametrize("actions", [np.zeros(3, dtype=np.int64), [0], np.zeros(1, dtype=np.int64)],
                         ids=["too many", "a list of one", "too few"])
def test_a_wrong_number_of_actions_raises_value_error_as_async_vector_env(actions):
    """The same type as AsyncVectorEnv's (zip's ValueError, raised there once the workers had
    their actions: its next step returns this one's results); here before anything is sent."""
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    envs, ref, sync = ShmVectorEnv(fns, context="fork", n_workers=2), AsyncVectorEnv(fns, context="fork"), None
    try:
        ref.reset(seed=0)
        if not GYM_BEFORE_1_2:  # Gymnasium 1.1's AsyncVectorEnv takes any count (and then hangs on too few)
            with pytest.raises(ValueError):
                ref.step_async(actions)
        ref.close()
        sync = SyncVectorEnv(fns)
        assert_same_vec(envs.reset(seed=0), sync.reset(seed=0), "reset")
        with pytest.raises(ValueError, match=r"actions have shape \(\d,\); expected \(2,\)"):
            envs.step_async(actions)
        with pytest.raises(ValueError):
            envs.step(actions)
        act = np.ones(2, dtype=np.int64)
        assert_same_vec(envs.step(act), sync.step(act), "nothing was left in flight")
    finally:
        close_all(envs, ref, sync)


# ---------------------------------------------------------------------------------------------
# The constructor's keywords
# ---------------------------------------------------------------------------------------------

def test_async_vector_envs_keywords_are_taken():
    fns = testenvs.spaces_env_fns("box", "discrete", 3)
    envs = ShmVectorEnv(fns, shared_memory=False, copy=False, context="fork", daemon=False, worker=None,
                        observation_mode="same", autoreset_mode="SameStep", max_concurrency=1)
    try:
        assert envs.shared_memory is True and envs.daemon is True  # always so: see the docstring
        assert envs.context == "fork" and envs.copy is False and envs.n_workers == 1
        assert envs.autoreset_mode is AutoresetMode.SAME_STEP and envs.max_concurrency == 1
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 5)
    finally:
        envs.close()
    envs = ShmVectorEnv(fns, context="fork", start_method="fork", max_concurrency=2, n_workers=2)
    envs.close()


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(worker=lambda *a: None), ValueError, "custom worker.*shared memory"),
    (dict(context="spawn", start_method="fork"), ValueError, "disagree"),
    (dict(observation_mode="other"), ValueError, "Invalid `observation_mode`"),
    (dict(observation_mode=gym.spaces.Box(-1, 1, (5,))), ValueError, r"\(batched space, single space\)"),
    (dict(observation_mode=("a", "b")), TypeError, "Expected both elements of observation_mode to be Spaces"),
    (dict(max_concurrency=0), ValueError, "must be a positive"),
    (dict(max_concurrency=1.5), ValueError, "must be an integer"),
    (dict(max_concurrency=1, n_workers=2), ValueError, "max_concurrency=1"),
    (dict(max_concurrency=1, envs_per_worker=1), ValueError, "max_concurrency=1"),
    (dict(n_wrokers=2), TypeError, r"ShmVectorEnv.__init__\(\) got an unexpected keyword argument 'n_wrokers'; "
                                   "did you mean 'n_workers'"),
    (dict(num_workers=2), TypeError, r"^ShmVectorEnv.__init__\(\) got an unexpected keyword argument 'num_workers'"),
    (dict(public_name="x"), TypeError, r"ShmVectorEnv.__init__\(\) got an unexpected keyword argument"),
    (dict(on_failure="restart"), ValueError, "ShmVecEnv"),
])
def test_keywords_refused_in_the_users_words_before_any_worker_starts(kwargs, exc, match):
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    with pytest.raises(exc, match=match):
        ShmVectorEnv(fns, **kwargs)


def test_the_pool_names_itself_for_an_unknown_keyword():
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    with pytest.raises(TypeError, match=r"ShmEnvPool.__init__\(\) got an unexpected keyword argument 'batchsize'; "
                                        "did you mean 'batch_size'"):
        ShmEnvPool(fns, batchsize=1)
    with pytest.raises(TypeError, match=r"ShmEnvPool.__init__\(\) got an unexpected keyword argument 'copy'"):
        ShmEnvPool(fns, copy=False)
    with pytest.raises(TypeError, match=r"ShmEnvPool\(\[make_spaces_env\] \* 4\)"):
        ShmEnvPool(4, testenvs.make_spaces_env)


# ---------------------------------------------------------------------------------------------
# observation_mode
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, n_workers", [("dict", 1), ("dict", 3), ("box", 2)])
def test_observation_mode_different_matches_async_and_sync_vector_env(kind, n_workers):
    """Envs whose observation spaces differ in bounds: Gymnasium's batch_differing_spaces, and the
    same observations, step for step."""
    fns = [functools.partial(testenvs.make_bounds_env, i, kind) for i in range(3)]
    envs = ShmVectorEnv(fns, context="fork", n_workers=n_workers, observation_mode="different")
    ref = AsyncVectorEnv(fns, context="fork", observation_mode="different")
    sync = SyncVectorEnv(fns, observation_mode="different")
    try:
        for other in (ref, sync):
            assert envs.observation_space == other.observation_space
            assert envs.single_observation_space == other.single_observation_space
        assert_same_vec(envs.reset(seed=2), ref.reset(seed=2), "reset")
        sync.reset(seed=2)
        for t in range(25):
            act = np.full(3, t % 3, dtype=np.int64)
            out = envs.step(act)
            assert_same_vec(out, ref.step(act), f"step {t}")
            assert_same_vec(out, sync.step(act), f"step {t} (sync)")
    finally:
        close_all(envs, ref, sync)


@pytest.mark.parametrize("n_workers", [1, 3])
def test_observation_spaces_that_differ_are_refused_saying_what_would_do(n_workers):
    fns = [functools.partial(testenvs.make_bounds_env, i) for i in range(3)]
    with pytest.raises(SpaceError, match="observation_mode='different'") as info:
        ShmVectorEnv(fns, context="fork", n_workers=n_workers)
    assert isinstance(info.value, RuntimeError)  # as AsyncVectorEnv's error
    fns = [functools.partial(testenvs.make_bounds_env, i, "shape") for i in range(3)]
    with pytest.raises(SpaceError, match=r"observation_mode='different': env 1 .* shape, dtype or structure"):
        ShmVectorEnv(fns, context="fork", n_workers=n_workers, observation_mode="different")
    with pytest.raises((RuntimeError, ValueError, AssertionError)):  # AsyncVectorEnv refuses them too (batch_differing_spaces; Gymnasium 1.1 asserts)
        AsyncVectorEnv(fns, context="fork", observation_mode="different")
    gc.collect()  # (had it started workers, its __del__ stops them)


def test_observation_mode_as_a_pair_of_spaces_is_taken_as_async_vector_env_takes_it():
    fns = [functools.partial(testenvs.make_bounds_env, i, "box") for i in range(2)]
    single = gym.spaces.Box(-5.0, 5.0, shape=(4,), dtype=np.float64)
    batched = gym.vector.utils.batch_space(single, 2)
    envs = ShmVectorEnv(fns, context="fork", n_workers=2, observation_mode=(batched, single))
    sync = SyncVectorEnv(fns, observation_mode=(batched, single))
    try:
        assert envs.observation_space is batched and envs.single_observation_space is single
        assert_same_vec(envs.reset(seed=0), sync.reset(seed=0), "reset")
        assert_same_vec(envs.step(np.ones(2, dtype=np.int64)), sync.step(np.ones(2, dtype=np.int64)), "step")
    finally:
        close_all(envs, sync)
    single = gym.spaces.Box(-5.0, 5.0, shape=(4,), dtype=np.float32)  # another dtype than the envs'
    with pytest.raises(SpaceError, match="differs from that space"):
        ShmVectorEnv(fns, context="fork", observation_mode=(gym.vector.utils.batch_space(single, 2), single))


# ---------------------------------------------------------------------------------------------
# env_fns in another library's shape: hints that say what to write
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, match", [
    ((6, testenvs.make_cartpole), r"not \(num_envs, factory\) as TorchRL's ParallelEnv.*"
                                  r"ShmVectorEnv\(\[make_cartpole\] \* 6\)"),
    ((6, lambda: None), r"ShmVectorEnv\(\[make_env\] \* 6\)"),
    ((6,), r"not a number \(6\).*ShmVectorEnv\(\[make_env\] \* 6\).*make_vec\(env_id, num_envs=6\)"),
    ((testenvs.make_cartpole,), r"got one function: ShmVectorEnv\(\[make_env\] \* n_envs\)"),
    (("CartPole-v1",), r"shmvec.make_vec\('CartPole-v1', num_envs=n\)"),
    ((testenvs.FakeParallelEnv(),), "PettingZoo env"),
])
def test_env_fns_in_another_shape_get_a_hint(args, match):
    with pytest.raises(TypeError, match=match):
        ShmVectorEnv(*args)


def test_a_vector_env_or_an_env_instead_of_factories_gets_a_hint():
    vec = SyncVectorEnv([testenvs.make_cartpole])
    env = testenvs.make_cartpole()
    try:
        with pytest.raises(TypeError, match="got a vector env .*SyncVectorEnv.* builds its own envs"):
            ShmVectorEnv(vec)
        with pytest.raises(TypeError, match="got an env instance"):
            ShmVectorEnv(env)
    finally:
        close_all(vec, env)


@pytest.mark.parametrize("factory, match", [
    (testenvs.make_vector_env_instead, r"returned a vector env \(SyncVectorEnv of 1 envs\): ShmVectorEnv vectorizes single envs itself"),
    (testenvs.make_fake_pettingzoo_env, r"returned a PettingZoo multi-agent env \(FakeParallelEnv\): ShmVectorEnv runs single-agent"),
])
def test_a_factory_that_returns_no_env_gets_the_hint_that_fits(factory, match):
    with pytest.raises(TypeError, match=match):
        ShmVectorEnv([factory] * 2, context="fork", n_workers=1)


def test_a_bool_where_autoreset_mode_goes_is_taken_for_async_vector_envs_order():
    with pytest.raises(TypeError, match="second argument is autoreset_mode.*by keyword"):
        ShmVectorEnv(testenvs.spaces_env_fns("box", "discrete", 2), True)


def test_n_workers_is_the_concurrency_of_the_steps():
    """max_concurrency=k: at most k envs step at once (each worker steps its envs one by one)."""
    fns = _napping_fns(0.2, n=4)
    envs = ShmVectorEnv(fns, context="fork", max_concurrency=2)
    try:
        assert envs.n_workers == 2
        envs.reset(seed=0)
        since = time.monotonic()
        envs.step(np.zeros(4, dtype=np.int64))
        assert time.monotonic() - since >= 0.4  # two envs after one another in each worker
    finally:
        envs.close()
