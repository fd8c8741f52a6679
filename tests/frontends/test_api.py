"""The SB3 VecEnv API of ShmVecEnv, its errors, and what happens when envs or workers fail."""

from __future__ import annotations

import functools
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

import testenvs
from helpers import SHMVEC_ROOT, TESTS_DIR, assert_same
from shmvec import (
    AlreadyPendingCallError,
    BrokenVecEnvError,
    ClosedVecEnvError,
    NoAsyncCallError,
    ObservationError,
    RemoteEnvError,
    ShmVecEnv,
    SpaceError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from shmvec._errors import RemoteTraceback


@pytest.fixture
def build():
    """``build(env_fns, **kwargs)`` makes a ShmVecEnv (fork by default) that is closed after the test."""
    made: list[ShmVecEnv] = []

    def _build(env_fns, **kwargs) -> ShmVecEnv:
        kwargs.setdefault("start_method", "fork")
        env = ShmVecEnv(env_fns, **kwargs)
        made.append(env)
        return env

    yield _build
    for env in made:
        env.close()


def _discrete_actions(n: int, value: int = 1) -> np.ndarray:
    return np.full(n, value, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Basic attributes
# ---------------------------------------------------------------------------------------------

def test_basic_attributes(build):
    env = build(testenvs.bare_env_fns(5), n_workers=2)
    assert isinstance(env, VecEnv)
    assert env.num_envs == 5
    assert env.n_workers == 2
    assert env.observation_space == testenvs.make_obs_space("box")
    assert env.action_space == testenvs.make_act_space("discrete")
    assert env.render_mode is None
    assert env.metadata == testenvs.SpacesEnv.metadata
    assert env.reset_infos == [{} for _ in range(5)]
    obs = env.reset()
    assert isinstance(obs, np.ndarray) and obs.shape == (5, 5) and obs.dtype == np.float32
    assert all(env.observation_space.contains(o) for o in obs)
    assert [info["tag"] for info in env.reset_infos] == list(range(5))


def test_step_async_step_wait_and_step(build):
    env = build(testenvs.bare_env_fns(4), n_workers=2)
    env.reset()
    env.step_async(_discrete_actions(4))
    obs, rewards, dones, infos = env.step_wait()
    assert obs.shape == (4, 5) and rewards.shape == (4,) and rewards.dtype == np.float32
    assert dones.shape == (4,) and dones.dtype == np.bool_
    assert len(infos) == 4 and all(isinstance(i, dict) and "TimeLimit.truncated" in i for i in infos)
    obs2, *_ = env.step(_discrete_actions(4, 2))
    assert obs2.shape == (4, 5)
    # Actions of shape (n, 1) for a Discrete space are accepted, as SB3's policies produce them.
    env.step(_discrete_actions(4).reshape(4, 1))


# ---------------------------------------------------------------------------------------------
# get_attr / set_attr / env_method / has_attr / env_is_wrapped
# ---------------------------------------------------------------------------------------------

def test_get_attr_with_indices(build):
    env = build(testenvs.bare_env_fns(7), n_workers=3)
    assert env.get_attr("tag") == list(range(7))
    assert env.get_attr("tag", None) == list(range(7))
    assert env.get_attr("tag", 4) == [4]
    assert env.get_attr("tag", [6, 0, 3]) == [6, 0, 3]  # order kept, across workers
    assert env.get_attr("tag", range(2, 5)) == [2, 3, 4]
    assert env.get_attr("obs_kind", [1]) == ["box"]
    with pytest.raises(IndexError):
        env.get_attr("tag", [7])


def test_set_attr_reaches_the_envs_like_dummy_vec_env(build):
    fns = testenvs.bare_env_fns(5)
    env = build(fns, n_workers=2)
    ref = DummyVecEnv(fns)
    try:
        for venv in (env, ref):
            venv.set_attr("scale", 3.0, indices=[1, 4])
            venv.set_attr("scale", -1.0, indices=2)
        assert env.get_attr("scale") == [1.0, 3.0, -1.0, 1.0, 3.0]
        env.set_attr("note", "hello")
        ref.set_attr("note", "hello")
        assert env.get_attr("note") == ["hello"] * 5
        for venv in (env, ref):
            venv.seed(3)
        assert_same(env.reset(), ref.reset())
        for k in range(20):
            actions = _discrete_actions(5, k % 3)
            out, expected = env.step(actions), ref.step(actions)
            assert_same(out, expected, f"step {k}")
    finally:
        ref.close()


def test_env_method_with_args_kwargs_and_indices(build):
    env = build(testenvs.bare_env_fns(6), n_workers=2)
    assert env.env_method("bump") == [1] * 6
    assert env.env_method("bump", 2, times=3, indices=[0, 5]) == [7, 7]
    assert env.env_method("bump", 1, indices=3) == [2]
    assert env.get_attr("counter") == [7, 1, 1, 2, 1, 7]
    assert env.env_method("describe", indices=[4, 2]) == ["box/discrete#4", "box/discrete#2"]


def test_has_attr(build):
    env = build(testenvs.spaces_env_fns("box", "discrete", 4), n_workers=2)
    assert env.has_attr("bump")
    assert env.has_attr("tag")  # reached through the TimeLimit wrapper
    assert env.has_attr("render_mode")
    assert not env.has_attr("no_such_attribute")


def test_env_is_wrapped(build):
    env = build(testenvs.spaces_env_fns("box", "discrete", 4), n_workers=2)
    assert env.env_is_wrapped(TimeLimit) == [True] * 4
    assert env.env_is_wrapped(Monitor) == [False] * 4
    assert env.env_is_wrapped(TimeLimit, indices=[3, 1]) == [True, True]
    monitored = make_vec_env(testenvs.make_bare_env, n_envs=3, vec_env_cls=ShmVecEnv,
                             vec_env_kwargs={"start_method": "fork", "n_workers": 2})
    try:
        assert monitored.env_is_wrapped(Monitor) == [True] * 3
        assert monitored.env_is_wrapped(Monitor, indices=1) == [True]
        assert monitored.env_is_wrapped(TimeLimit) == [False] * 3
    finally:
        monitored.close()


def test_missing_attribute_raises_attribute_error_and_env_stays_usable(build):
    env = build(testenvs.bare_env_fns(3), n_workers=2)
    env.reset()
    with pytest.raises(AttributeError) as info:
        env.get_attr("no_such_attribute", indices=[2])
    assert any("env 2" in note for note in info.value.__notes__)
    env.step(_discrete_actions(3))
    assert env.get_attr("tag") == [0, 1, 2]


def test_env_method_raising_keeps_the_vec_env_usable(build):
    env = build(testenvs.bare_env_fns(4), n_workers=2)
    env.reset()
    with pytest.raises(KeyError) as info:
        env.env_method("fail", "custom message", indices=[1, 3])
    exc = info.value
    assert "custom message" in str(exc)
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "def fail" in exc.__cause__.tb or "in fail" in exc.__cause__.tb
    notes = "\n".join(exc.__notes__)
    assert "env 1" in notes and "env_method" in notes
    # still usable: every command works afterwards
    env.step(_discrete_actions(4))
    assert env.env_method("bump") == [1, 1, 1, 1]
    env.reset()
    env.step(_discrete_actions(4))


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

def test_get_images_and_render_rgb_array(build):
    fns = [functools.partial(testenvs.make_render_env, i) for i in range(4)]
    env = build(fns, n_workers=2)
    ref = DummyVecEnv(fns)
    try:
        assert env.render_mode == "rgb_array"
        assert env.metadata == ref.metadata
        env.reset()
        ref.reset()
        env.step(_discrete_actions(4))
        ref.step(_discrete_actions(4))
        images = env.get_images()
        assert len(images) == 4
        for k, image in enumerate(images):
            assert image.shape == (4, 6, 3) and image.dtype == np.uint8
            assert (image == k * 10 + 1).all()
        assert_same(images, ref.get_images())
        big = env.render()
        assert big is not None and big.ndim == 3 and big.shape[2] == 3
        assert np.array_equal(big, ref.render())
        assert np.array_equal(env.render(mode="rgb_array"), big)
    finally:
        ref.close()


def test_get_images_without_rgb_array_warns(build):
    env = build(testenvs.bare_env_fns(2), n_workers=1)
    with pytest.warns(UserWarning):
        assert env.get_images() == [None, None]
    with pytest.warns(UserWarning):
        assert env.render() is None


# ---------------------------------------------------------------------------------------------
# copy=True / copy=False
# ---------------------------------------------------------------------------------------------

def test_copy_true_returns_arrays_of_their_own(build):
    env = build(testenvs.bare_env_fns(3), n_workers=2, copy=True)
    obs0 = env.reset()
    kept = obs0.copy()
    obs1, rew1, _, _ = env.step(_discrete_actions(3))
    kept_rew = rew1.copy()
    obs2, _, _, _ = env.step(_discrete_actions(3))
    assert not np.shares_memory(obs0, obs1) and not np.shares_memory(obs1, obs2)
    assert np.array_equal(obs0, kept)
    assert np.array_equal(rew1, kept_rew)
    assert not np.array_equal(obs1, obs2)


def test_copy_false_returns_views_that_the_next_step_overwrites(build):
    env = build(testenvs.spaces_env_fns("dict", "discrete", 3, term_prob=1.0), n_workers=2, copy=False)
    obs0 = env.reset()
    kept = {key: value.copy() for key, value in obs0.items()}
    obs1, rew1, dones, infos = env.step(_discrete_actions(3))
    kept_rew = rew1.copy()
    kept_terminal = [{k: v.copy() for k, v in info["terminal_observation"].items()} for info in infos]
    assert dones.all()  # term_prob=1: every step ends an episode
    for key in obs0:
        assert np.shares_memory(obs0[key], obs1[key])
        assert np.array_equal(obs0[key], obs1[key])  # the old result now shows the new values
    assert not np.array_equal(kept["pos"], obs1["pos"])
    obs2, _, _, infos2 = env.step(_discrete_actions(3))
    assert np.array_equal(obs1["pos"], obs2["pos"])
    # rewards and terminal observations are copies even with copy=False
    assert np.array_equal(rew1, kept_rew)
    for info, kept_info in zip(infos, kept_terminal):
        assert_same(info["terminal_observation"], kept_info)
    kept_obs = obs2["pos"].copy()
    env.close()
    # views the caller kept stay readable after close (the mapping lives as long as they do)
    assert np.array_equal(obs2["pos"], kept_obs)
    del obs0, obs1, obs2
    gc.collect()


# ---------------------------------------------------------------------------------------------
# Misuse
# ---------------------------------------------------------------------------------------------

def test_step_wait_without_step_async(build):
    env = build(testenvs.bare_env_fns(2), n_workers=2)
    env.reset()
    with pytest.raises(NoAsyncCallError):
        env.step_wait()
    env.step(_discrete_actions(2))  # still usable


def test_step_async_twice_and_other_calls_while_pending(build):
    env = build(testenvs.bare_env_fns(3), n_workers=2)
    env.reset()
    env.step_async(_discrete_actions(3))
    with pytest.raises(AlreadyPendingCallError):
        env.step_async(_discrete_actions(3))
    with pytest.raises(AlreadyPendingCallError):
        env.get_attr("tag")
    obs, *_ = env.step_wait()  # the first step completes normally
    assert obs.shape == (3, 5)
    with pytest.raises(NoAsyncCallError):
        env.step_wait()
    env.step(_discrete_actions(3))
    env.step_async(_discrete_actions(3))
    env.seed(7)
    obs = env.reset()  # finishes the step in flight, drops it, then resets
    assert not env.waiting
    with pytest.raises(NoAsyncCallError):
        env.step_wait()
    env.seed(7)
    np.testing.assert_array_equal(env.reset(), obs)
    env.step(_discrete_actions(3))


def test_calls_after_close_raise_and_close_is_idempotent():
    fns = [functools.partial(testenvs.make_render_env, i) for i in range(3)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    env.reset()
    env.close()
    env.close()
    assert env.closed
    calls = [
        lambda: env.reset(),
        lambda: env.step(_discrete_actions(3)),
        lambda: env.step_async(_discrete_actions(3)),
        lambda: env.step_wait(),
        lambda: env.get_attr("tag"),
        lambda: env.set_attr("tag", 1),
        lambda: env.env_method("bump"),
        lambda: env.env_is_wrapped(TimeLimit),
        lambda: env.has_attr("tag"),
        lambda: env.get_images(),
        lambda: env.render(),
    ]
    for call in calls:
        with pytest.raises(ClosedVecEnvError):
            call()
    env.close()


def test_close_with_a_step_in_flight():
    env = ShmVecEnv(testenvs.bare_env_fns(3), n_workers=2, start_method="fork")
    env.reset()
    env.step_async(_discrete_actions(3))
    env.close()
    with pytest.raises(ClosedVecEnvError):
        env.step_wait()


def test_garbage_collection_of_an_unclosed_env_releases_everything():
    env = ShmVecEnv(testenvs.bare_env_fns(3), n_workers=2, start_method="fork")
    env.reset()
    env.step(_discrete_actions(3))
    del env
    gc.collect()  # the leak check of conftest verifies that workers, fds and memory are gone


@pytest.mark.parametrize("kind", ["ShmVecEnv", "ShmVectorEnv", "ShmEnvPool", "ShmVecEnvPool"])
def test_copy_deepcopy_and_pickle_are_refused_and_the_env_goes_on(kind):
    """A shallow copy shared the workers and blocks, and dropping it closed the original (which
    then failed with "Words used after release()"); deepcopy and pickle failed on
    multiprocessing's AuthenticationString.  Each now raises a TypeError that says what to do."""
    import copy
    import pickle

    import shmvec

    fns = testenvs.bare_env_fns(3)
    env = getattr(shmvec, kind)(fns, n_workers=2, start_method="fork")
    try:
        rebuild = "describe" if kind == "ShmVecEnv" else "same env factories"
        for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match=rf"a {kind} cannot be copied or pickled(.|\n)*{rebuild}"):
                attempt(env)
        gc.collect()
        if kind == "ShmVecEnv":
            env.reset()
            env.step(_discrete_actions(3))
        elif kind == "ShmVectorEnv":
            env.reset(seed=0)
            env.step(_discrete_actions(3))
        elif kind == "ShmEnvPool":
            env.async_reset()
            env.recv()
        else:
            env.reset()
            env.step(_discrete_actions(3))
    finally:
        env.close()


@pytest.mark.parametrize("kind", ["ShmVecEnv", "ShmVectorEnv", "ShmEnvPool", "ShmVecEnvPool", "ShmMultiAgentVecEnv",
                                  "ShmParallelEnv"])
def test_every_face_says_what_its_defaults_became(kind):
    """decided(): the workers, their spin, torch's threads, the placement, each with why, as plain
    data (JSON), from every face, whatever its factories; ClosedVecEnvError once closed."""
    import json

    import shmvec
    from edgeenvs_agents import two_agents_fns

    fns = two_agents_fns(2) if kind in ("ShmMultiAgentVecEnv", "ShmParallelEnv") else testenvs.bare_env_fns(3)
    env = getattr(shmvec, kind)(fns, n_workers=2, start_method="fork", parent_threads=1)
    try:
        decided = json.loads(json.dumps(env.decided()))
        assert set(decided) == {"n_workers", "spin_us", "parent_threads", "placement"}
        assert decided["n_workers"]["value"] == 2 and "given" in decided["n_workers"]["why"]
        assert decided["parent_threads"]["option"] == 1 and "why" in decided["placement"]
    finally:
        env.close()
    with pytest.raises(ClosedVecEnvError, match=f"this {kind} is closed"):
        env.decided()


def test_sb3_wrappers_around_a_shmvecenv_still_pickle_without_it():
    """VecNormalize.save pickles the wrapper and leaves the vec env out, as for SubprocVecEnv."""
    import pickle

    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(ShmVecEnv(testenvs.bare_env_fns(3), n_workers=2, start_method="fork"))
    try:
        env.reset()
        env.step(_discrete_actions(3))
        loaded = pickle.loads(pickle.dumps(env))
        assert loaded.obs_rms.count == env.obs_rms.count
    finally:
        env.close()


@pytest.mark.parametrize("bad", [
    np.zeros(4, dtype=np.int64),  # one action too many
    np.zeros(2, dtype=np.int64),  # one too few
    np.zeros((3, 2), dtype=np.int64),
])
def test_wrong_action_shape_raises_value_error(build, bad):
    env = build(testenvs.bare_env_fns(3), n_workers=2)
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(bad)
    assert not env.waiting
    env.step(_discrete_actions(3))  # still usable


def test_wrong_action_dtype_raises_value_error(build):
    env = build(testenvs.bare_env_fns(3), n_workers=2)
    env.reset()
    with pytest.raises(ValueError, match="dtype"):
        env.step(np.array([0.5, 1.0, 2.0]))  # floats for a Discrete space
    env.step(_discrete_actions(3))


def test_box_actions_and_wrong_box_shape(build):
    env = build(testenvs.bare_env_fns(3, act_kind="box"), n_workers=2)
    env.reset()
    env.step(np.zeros((3, 2), dtype=np.float32))
    env.step(np.zeros((3, 2), dtype=np.float64))  # float64 casts to the float32 buffer
    with pytest.raises(ValueError):
        env.step(np.zeros((3, 3), dtype=np.float32))


def test_int64_pixels_for_a_uint8_space_are_taken_when_they_fit(build):
    """DummyVecEnv casts them (wrapping 300 to 44 without a word); shmvec takes them when every value
    fits, equal to DummyVecEnv's, and names the env otherwise."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = [testenvs.make_wide_int_pixels_env] * 3
    ref = DummyVecEnv(fns)
    env = build(fns, n_workers=2)
    try:
        assert_same(env.reset(), ref.reset(), strict_dtype=True)
        for t in range(10):
            out, out_ref = env.step(np.array([0, 1, 0])), ref.step(np.array([0, 1, 0]))
            assert_same(out[:3], out_ref[:3], f"step {t}", strict_dtype=True)
            assert_same(out[3], out_ref[3], f"step {t} infos")  # terminal_observation: the space's dtype
    finally:
        ref.close()
    bad = build([functools.partial(testenvs.make_wide_int_pixels_env, wrap_at=2)] * 2, n_workers=1)
    bad.reset()
    bad.step(np.array([0, 0]))
    with pytest.raises(ObservationError, match=r"(?s)dtype int64.*env 0"):
        bad.step(np.array([0, 0]))


def test_transposed_box_actions_are_refused_not_reshaped(build):
    """(act_dim, n_envs) has the right size, but a reshape would hand each env a mix of several
    envs' actions; a leading dimension of n_envs keeps each row intact and is reshaped."""
    env = build(testenvs.bare_env_fns(3, act_kind="box"), n_workers=2)  # Box (2,) actions, 3 envs
    env.reset()
    rows = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    with pytest.raises(ValueError, match="one row per env, first"):
        env.step(rows.T.copy())  # (2, 3)
    assert not env.waiting
    env.step(rows.reshape(3, 1, 2))  # rows intact: accepted
    np.testing.assert_array_equal(env._engine.views.act[()], rows)


def test_box_action_rows_are_reshaped_only_across_dimensions_of_size_one():
    """Each env's (3, 2) matrix for a (2, 3) space has the right size, but a reshape scrambles it."""
    from shmvec._actions import rows_reshaped

    mats = np.arange(12).reshape(2, 3, 2)
    assert rows_reshaped(mats, 2, (2, 3)) is None
    assert rows_reshaped(mats.transpose(0, 2, 1).reshape(2, 1, 2, 3), 2, (2, 3)).shape == (2, 2, 3)
    assert rows_reshaped(np.arange(2), 2, (1,)).shape == (2, 1)
    assert rows_reshaped(np.arange(2).reshape(2, 1), 2, ()).shape == (2,)
    assert rows_reshaped(np.arange(6).reshape(2, 3), 1, (2, 3)).shape == (1, 2, 3)  # one env, unbatched
    assert rows_reshaped(np.arange(6).reshape(3, 2), 1, (2, 3)) is None


# ---------------------------------------------------------------------------------------------
# Construction errors
# ---------------------------------------------------------------------------------------------

def test_env_instance_instead_of_factory_raises_type_error():
    env_instance = testenvs.make_bare_env()
    with pytest.raises(TypeError, match=r"env_fns\[1\]"):
        ShmVecEnv([testenvs.make_bare_env, env_instance], start_method="fork")
    with pytest.raises(TypeError, match=r"env_fns\[0\]"):
        ShmVecEnv([42], start_method="fork")
    env_instance.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"n_workers": 0}, "n_workers"),
    ({"n_workers": 4}, "n_workers"),
    ({"start_method": "teleport"}, "start_method"),
    ({"timeout": 0}, "timeout"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShmVecEnv(testenvs.bare_env_fns(3), **kwargs)
    with pytest.raises(ValueError):
        ShmVecEnv([])


@pytest.mark.parametrize("spin_us, match", [
    ("fast", "spin_us must be"),
    ((1.0, 2.0, 3.0), "spin_us must be"),
    ((1.0, "x"), "worker's spin"),
    ((float("nan"), 1.0), "parent's spin"),
    (True, "parent's spin"),
])
def test_bad_spin_raises_type_error_before_any_worker_starts(spin_us, match):
    with pytest.raises(TypeError, match=match):
        ShmVecEnv(testenvs.bare_env_fns(2), n_workers=1, spin_us=spin_us)


def test_spin_accepts_a_list_or_numpy_numbers():
    """A pair read from JSON or YAML (a list) and numpy numbers work as the tuple does."""
    for spin_us in ([0, 10], (np.float64(0.0), np.int64(10))):
        env = ShmVecEnv(testenvs.bare_env_fns(2), n_workers=1, start_method="fork", spin_us=spin_us)
        try:
            assert env._engine.options.parent_spin_s == 0.0 and env._engine.options.worker_spin_s == pytest.approx(10e-6)
            env.reset()
            env.step(np.zeros(2, dtype=np.int64) if isinstance(env.action_space, gym.spaces.Discrete)
                     else np.stack([env.action_space.sample() for _ in range(2)]))
        finally:
            env.close()


def test_unpicklable_factory_raises_type_error_naming_the_index():
    lock = threading.Lock()

    def make_with_lock():
        with lock:
            return testenvs.make_bare_env()

    fns = [testenvs.make_bare_env, testenvs.make_bare_env, make_with_lock]
    with pytest.raises(TypeError, match=r"env_fns\[2\]") as info:
        ShmVecEnv(fns, n_workers=2, start_method="fork")
    assert "pickle" in str(info.value)

    sock = socket.socket()
    try:
        def make_with_socket():
            sock.getsockname()
            return testenvs.make_bare_env()

        with pytest.raises(TypeError, match=r"env_fns\[0\]"):
            ShmVecEnv([make_with_socket, testenvs.make_bare_env], n_workers=1, start_method="fork")
    finally:
        sock.close()


def test_closures_and_lambdas_are_fine(build):
    scale = 2.5
    env = build([lambda: testenvs.make_bare_env(index=7), lambda: testenvs.SpacesEnv(tag=scale)],
                n_workers=2, start_method="spawn")
    assert env.get_attr("tag") == [7, 2.5]


def test_a_text_space_runs_and_something_that_is_no_space_raises_space_error():
    """Text has no fixed size: its values travel pickled (tests/frontends/test_spaces.py has the rest)."""
    for n_workers in (1, 2):
        env = ShmVecEnv([testenvs.make_text_env] * 2, n_workers=n_workers, start_method="fork")
        try:
            obs = env.reset()
            assert obs.dtype == np.dtype("<U5") and obs.tolist() == ["hello", "hello"]
        finally:
            env.close()
    with pytest.raises(SpaceError, match="not a gymnasium.spaces.Space"):
        ShmVecEnv([testenvs.make_not_a_space_env] * 2, n_workers=2, start_method="fork")


@pytest.mark.parametrize("n_workers", [1, 2])
def test_different_spaces_raise_space_error(n_workers):
    fns = [functools.partial(testenvs.make_bare_env, "box"), functools.partial(testenvs.make_bare_env, "dict")]
    with pytest.raises(SpaceError, match="observation_space"):
        ShmVecEnv(fns, n_workers=n_workers, start_method="fork")
    fns = [functools.partial(testenvs.make_bare_env, "box", "discrete"),
           functools.partial(testenvs.make_bare_env, "box", "box")]
    with pytest.raises(SpaceError, match="action_space"):
        ShmVecEnv(fns, n_workers=n_workers, start_method="fork")


def test_factory_errors_at_construction():
    with pytest.raises(testenvs.EnvBoom) as info:
        ShmVecEnv([testenvs.make_bare_env, testenvs.failing_factory], n_workers=2, start_method="fork")
    assert any("env construction" in note for note in info.value.__notes__)
    with pytest.raises(TypeError, match="gymnasium.Env"):
        ShmVecEnv([testenvs.not_an_env_factory], start_method="fork")
    env = testenvs.make_bare_env()
    try:
        with pytest.raises(ValueError, match="same env instance"):
            ShmVecEnv([lambda: env, lambda: env], n_workers=1, start_method="fork")
    finally:
        env.close()
    with pytest.raises(WorkerDiedError, match="exit code 5"):
        ShmVecEnv([testenvs.make_bare_env, testenvs.dying_factory], n_workers=2, start_method="fork")


# ---------------------------------------------------------------------------------------------
# Failures of envs and workers
# ---------------------------------------------------------------------------------------------

def _raising_fns(n: int, bad: int, **kwargs):
    return [functools.partial(testenvs.make_raising_env, 3 if i == bad else 10**6, **kwargs) for i in range(n)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_env_raising_in_step_reraises_original_type_then_broken(method):
    env = ShmVecEnv(_raising_fns(3, bad=2), n_workers=2, start_method=method)
    try:
        env.reset()
        env.step(_discrete_actions(3))
        env.step(_discrete_actions(3))
        with pytest.raises(testenvs.EnvBoom, match="boom after 3 steps") as info:
            env.step(_discrete_actions(3))
        exc = info.value
        assert type(exc) is testenvs.EnvBoom
        assert isinstance(exc.__cause__, RemoteTraceback)
        tb = exc.__cause__.tb
        assert "Traceback" in tb and "_raise" in tb and "testenvs.py" in tb and "EnvBoom" in tb
        assert "worker" in str(exc.__cause__)
        notes = "\n".join(exc.__notes__)
        assert "env 2" in notes and "step" in notes and "worker 1" in notes
        for call in (lambda: env.step(_discrete_actions(3)), env.reset, lambda: env.get_attr("fail_at"),
                     lambda: env.env_method("reset")):
            with pytest.raises(BrokenVecEnvError):
                call()
    finally:
        env.close()
    env.close()


def test_env_raising_in_reset():
    env = ShmVecEnv(_raising_fns(3, bad=0, in_reset=True), n_workers=2, start_method="fork")
    try:
        with pytest.raises(testenvs.EnvBoom) as info:
            env.reset()
        assert any("env 0" in note and "reset" in note for note in info.value.__notes__)
        with pytest.raises(BrokenVecEnvError):
            env.reset()
    finally:
        env.close()


def test_exception_that_cannot_be_unpickled_arrives_as_remote_env_error():
    env = ShmVecEnv(_raising_fns(2, bad=1, exc="awkward"), n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(_discrete_actions(2))
        env.step(_discrete_actions(2))
        with pytest.raises(RemoteEnvError) as info:
            env.step(_discrete_actions(2))
        assert "AwkwardError" in info.value.type_name
        assert "awkward failure 7" in info.value.message
        assert isinstance(info.value.__cause__, RemoteTraceback)
    finally:
        env.close()


def _assert_died(exc: WorkerDiedError, worker: int, what: str) -> None:
    assert exc.worker == worker
    assert what in str(exc)
    assert f"worker {worker}" in str(exc)


@pytest.mark.parametrize("next_call", ["step", "reset", "get_attr", "set_attr_after_exit", "step_after_exit"])
def test_worker_killed_between_calls(next_call):
    env = ShmVecEnv(testenvs.bare_env_fns(4), n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(_discrete_actions(4))
        victim = env._engine.workers.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        if next_call.endswith("_after_exit"):  # else the call races with the kill
            while psutil.Process(victim.pid).status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.001)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            if next_call.startswith("step"):
                env.step(_discrete_actions(4))
            elif next_call == "reset":
                env.reset()
            elif next_call == "get_attr":
                env.get_attr("tag")
            else:
                env.set_attr("tag", 5)
        assert time.monotonic() - start < 5.0
        _assert_died(info.value, 1, "SIGKILL")
        assert info.value.exitcode == -signal.SIGKILL
        assert list(info.value.env_indices) == [2, 3]
        with pytest.raises(BrokenVecEnvError):
            env.step(_discrete_actions(4))
    finally:
        env.close()


def test_worker_killed_during_step_wait():
    fns = [functools.partial(testenvs.make_sleepy_env, 2.0)] * 2
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step_async(_discrete_actions(2))
        time.sleep(0.1)
        os.kill(env._engine.workers.processes[0].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            env.step_wait()
        assert time.monotonic() - start < 5.0
        _assert_died(info.value, 0, "SIGKILL")
        start = time.monotonic()
    finally:
        env.close()  # worker 1 is still in its env's step: close waits for it (boundedly)
    assert time.monotonic() - start < 15.0


@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.parametrize("how, what", [("kill", "SIGKILL"), ("exit", "exit code 3")])
def test_env_ending_its_own_process(method, how, what):
    fns = [functools.partial(testenvs.make_suicide_env, 10**6), functools.partial(testenvs.make_suicide_env, 10**6),
           functools.partial(testenvs.make_suicide_env, 2, how)]
    env = ShmVecEnv(fns, n_workers=2, start_method=method)
    try:
        env.reset()
        env.step(_discrete_actions(3))
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            env.step(_discrete_actions(3))
        assert time.monotonic() - start < 5.0
        _assert_died(info.value, 1, what)
        with pytest.raises(BrokenVecEnvError):
            env.reset()
    finally:
        env.close()


def test_hanging_env_raises_worker_timeout_error_and_close_terminates_it():
    fns = [functools.partial(testenvs.make_sleepy_env, 60.0)] * 2
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", timeout=1.0)
    try:
        env.reset()
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError):
            env.step(_discrete_actions(2))
        assert time.monotonic() - start < 10.0
        with pytest.raises(BrokenVecEnvError):
            env.step(_discrete_actions(2))
        start = time.monotonic()
    finally:
        env.close()
    assert time.monotonic() - start < 10.0


@pytest.mark.parametrize("where", ["step", "reset"])
def test_wrong_observation_shape_raises_observation_error(where):
    fns = [functools.partial(testenvs.make_bad_obs_env, where == "reset")] * 2
    env = ShmVecEnv(fns, n_workers=1, start_method="fork")
    try:
        with pytest.raises(ObservationError, match=r"\(4,\)") as info:
            env.reset()
            env.step(_discrete_actions(2))
        assert isinstance(info.value, ValueError)
        assert any(f"env 0" in note and where in note for note in info.value.__notes__)
    finally:
        env.close()


def test_wrong_observation_dtype_raises_observation_error():
    env = ShmVecEnv([functools.partial(testenvs.make_bad_obs_env, False, True)], start_method="fork")
    try:
        env.reset()
        with pytest.raises(ObservationError, match="dtype"):
            env.step(_discrete_actions(1))
    finally:
        env.close()


def test_close_reraises_an_env_close_error_after_releasing_everything():
    fns = [functools.partial(testenvs.make_close_fail_env, i) for i in range(3)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    env.reset()
    with pytest.raises(testenvs.EnvBoom, match="close failed"):
        env.close()
    env.close()  # idempotent; the leak check verifies nothing is left


def test_reset_options_larger_than_the_mailbox_arrive(build):
    env = build(testenvs.bare_env_fns(2), n_workers=1, mailbox_bytes=256)
    env.set_options({"offset": 2.0, "blob": "x" * 1000})  # through the pipe (ARG_IN_PIPE)
    env.reset()
    assert [info["offset"] for info in env.reset_infos] == [2.0, 2.0]
    env.set_options({"offset": 1.0})  # back through the mailbox
    env.reset()
    assert [info["offset"] for info in env.reset_infos] == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------
# Integration
# ---------------------------------------------------------------------------------------------

def test_make_vec_env_with_spawn_and_two_workers():
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=ShmVecEnv,
                       vec_env_kwargs={"start_method": "spawn", "n_workers": 2})
    try:
        assert isinstance(env, ShmVecEnv) and env.n_workers == 2 and env.start_method == "spawn"
        assert env.env_is_wrapped(Monitor) == [True] * 4
        obs = env.reset()
        assert obs.shape == (4, 4)
        for _ in range(50):
            obs, rewards, dones, infos = env.step(np.ones(4, dtype=np.int64))
        assert obs.shape == (4, 4) and rewards.shape == (4,)
    finally:
        env.close()


def test_default_start_method_and_workers(build):
    env = build(testenvs.bare_env_fns(3), start_method=None)
    assert env.start_method in ("forkserver", "spawn")
    assert 1 <= env.n_workers <= min(3, len(os.sched_getaffinity(0)))
    env.reset()
    env.step(_discrete_actions(3))


@pytest.mark.parametrize("copy", [True, False])
def test_nested_dict_observation_round_trips(build, copy):
    fns = testenvs.spaces_env_fns("nested", "box", 4)
    env = build(fns, n_workers=2, copy=copy)
    space = env.observation_space
    assert space == testenvs.make_obs_space("nested")

    def check(obs):
        assert set(obs) == {"inner", "pair", "flag"} and set(obs["inner"]) == {"vec", "choice"}
        assert isinstance(obs["pair"], tuple) and len(obs["pair"]) == 2
        assert obs["inner"]["vec"].shape == (4, 2) and obs["inner"]["vec"].dtype == np.float32
        assert obs["inner"]["choice"].shape == (4,) and obs["inner"]["choice"].dtype == np.int64
        assert obs["pair"][0].shape == (4, 2) and obs["pair"][1].shape == (4, 2, 2)
        assert obs["pair"][1].dtype == np.uint8 and obs["flag"].shape == (4, 3)
        for k in range(4):
            single = {
                "inner": {"vec": obs["inner"]["vec"][k], "choice": obs["inner"]["choice"][k]},
                "pair": (obs["pair"][0][k], obs["pair"][1][k]),
                "flag": obs["flag"][k],
            }
            assert space.contains(single), single

    check(env.reset())
    env.action_space.seed(0)
    for _ in range(30):
        obs, _, dones, infos = env.step(np.stack([env.action_space.sample() for _ in range(4)]))
        check(obs)
        for k in np.flatnonzero(dones):
            assert space.contains(infos[k]["terminal_observation"])


def test_many_envs_on_few_workers(build):
    fns = testenvs.spaces_env_fns("box", "discrete", 64)
    env = build(fns, n_workers=2)
    ref = DummyVecEnv(fns)
    try:
        assert [len(s) for s in env.slices] == [32, 32]
        assert env.get_attr("tag") == list(range(64))
        assert env.get_attr("tag", [63, 31, 32, 0]) == [63, 31, 32, 0]
        env.seed(11)
        ref.seed(11)
        assert_same(env.reset(), ref.reset())
        rng = np.random.default_rng(0)
        for k in range(60):
            actions = rng.integers(0, 3, size=64)
            assert_same(env.step(actions), ref.step(actions), f"step {k}")
            assert_same(env.reset_infos, ref.reset_infos, f"step {k} reset_infos")
    finally:
        ref.close()


def test_many_constructions_in_a_row_do_not_hang():
    """Regression: a worker that read its command counter after reporting ready could miss the first command."""
    for _ in range(40):
        env = ShmVecEnv(testenvs.bare_env_fns(3), n_workers=2, start_method="fork", timeout=10.0)
        try:
            assert env.get_attr("tag") == [0, 1, 2]
            env.reset()
        finally:
            env.close()


def test_uneven_slices_map_indices_to_the_right_worker(build):
    env = build(testenvs.bare_env_fns(7), n_workers=3)
    assert [list(s) for s in env.slices] == [[0, 1, 2], [3, 4], [5, 6]]
    for i in range(7):
        assert env.get_attr("tag", i) == [i]
    assert env.env_method("describe", indices=[6, 3, 2]) == ["box/discrete#6", "box/discrete#3", "box/discrete#2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset()


def test_gym_make_factory(build):
    env = build([lambda: gym.make("CartPole-v1")] * 3, n_workers=2)
    obs = env.reset()
    assert obs.shape == (3, 4)
    assert env.env_is_wrapped(TimeLimit) == [True] * 3


def test_dict_and_tuple_action_spaces_reach_each_env(build):
    env = build([functools.partial(testenvs.make_echo_env, "dict")] * 3, n_workers=2)
    env.reset()
    actions = {"move": np.array([0, 1, 2]), "force": np.arange(6, dtype=np.float32).reshape(3, 2)}
    _, _, _, infos = env.step(actions)
    for k, info in enumerate(infos):
        received = info["action"]
        assert received["move"] == k
        assert np.array_equal(received["force"], [2 * k, 2 * k + 1])
        assert received["force"].dtype == np.float32
    with pytest.raises(ValueError, match=r"\['force'\]"):
        env.step({"move": np.array([0, 1, 2]), "force": np.zeros((3, 3), dtype=np.float32)})

    tup = build([functools.partial(testenvs.make_echo_env, "tuple")] * 2, n_workers=1)
    tup.reset()
    _, _, _, infos = tup.step((np.array([[1, 0], [0, 1]], dtype=np.int8), np.array([3, 2])))
    assert np.array_equal(infos[0]["action"][0], [1, 0]) and infos[0]["action"][1] == 3
    assert np.array_equal(infos[1]["action"][0], [0, 1]) and infos[1]["action"][1] == 2


def test_float64_observations_in_a_float32_space_are_cast(build):
    """The shared buffers hold the space's dtype: observations, terminal ones included, arrive cast.

    (DummyVecEnv casts the observations too, but hands out the env's raw terminal observation.)
    """
    fns = [functools.partial(testenvs.make_echo_env, "tuple")] * 2
    env = build(fns, n_workers=2)
    ref = DummyVecEnv(fns)
    try:
        assert_same(env.reset(), ref.reset(), strict_dtype=True)
        actions = (np.zeros((2, 2), dtype=np.int8), np.zeros(2, dtype=np.int64))
        for _ in range(3):
            out, expected = env.step(actions), ref.step(actions)
        assert out[2].all() and expected[2].all()  # the third step ends every episode
        assert_same(out[0], expected[0], strict_dtype=True)
        for info, ref_info in zip(out[3], expected[3]):
            terminal = info["terminal_observation"]
            assert terminal.dtype == np.float32
            assert ref_info["terminal_observation"].dtype == np.float64
            assert np.array_equal(terminal, ref_info["terminal_observation"].astype(np.float32))
    finally:
        ref.close()


class _Interrupted(Exception):
    pass


@pytest.fixture
def alarm():
    """``alarm(seconds)``: a SIGALRM whose handler raises _Interrupted (as Ctrl-C raises KeyboardInterrupt)."""
    old = signal.getsignal(signal.SIGALRM)

    def handler(signum, frame):
        raise _Interrupted()

    signal.signal(signal.SIGALRM, handler)
    try:
        yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.timeout(60, method="thread")  # pytest-timeout's own method uses SIGALRM
@pytest.mark.parametrize("interrupted", ["step", "reset", "env_method"])
def test_interrupted_call_leaves_the_vec_env_in_flight_or_broken_never_stale(alarm, interrupted):
    """A signal handler raising while the workers still run a command (Ctrl-C) must not let the
    next command read the interrupted one's results.  A step stays in flight (step_wait() collects
    it); a reset or a rare command breaks the vec env."""
    # The alarm must go off after the command was posted and before the workers answer: 0.5 s
    # into a 2 s command (a 0.1 s alarm could fire before a stalled parent had posted anything,
    # and then nothing was interrupted and the vec env was not broken).
    fns = [functools.partial(testenvs.make_sleepy_env, 2.0)] * 2
    if interrupted == "reset":
        fns = [functools.partial(testenvs.make_sleepy_env, 2.0, 2.0)] * 2
    elif interrupted == "env_method":
        fns = testenvs.bare_env_fns(2)
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    try:
        env.reset()
        alarm(0.5)
        with pytest.raises(_Interrupted):
            if interrupted == "step":
                env.step(_discrete_actions(2))
            elif interrupted == "reset":
                env.reset()
            else:
                env.env_method("nap", 2.0)
        if interrupted == "step":
            assert env.waiting and env._engine.status.failure is None
            with pytest.raises(AlreadyPendingCallError, match="interrupted by Ctrl-C"):
                env.step(_discrete_actions(2))
            with pytest.raises(AlreadyPendingCallError, match="step_wait"):
                env.get_attr("tag")
            obs, rewards, dones, infos = env.step_wait()
            assert obs.shape[0] == 2 and not env.waiting
            with pytest.raises(NoAsyncCallError):
                env.step_wait()
        else:
            with pytest.raises(BrokenVecEnvError, match="_Interrupted"):
                if interrupted == "env_method":
                    env.get_attr("tag")
                else:
                    env.step(_discrete_actions(2))
        start = time.monotonic()
    finally:
        env.close()
    assert time.monotonic() - start < 10.0


@pytest.mark.timeout(60, method="thread")  # pytest-timeout's own method uses SIGALRM
def test_close_from_a_signal_handler_during_a_step_raises_closed_not_a_bare_value_error():
    """The step's wait went on polling processes that close() had closed: ``ValueError: process
    object is closed``."""
    env = ShmVecEnv([functools.partial(testenvs.make_sleepy_env, 1.0)] * 2, n_workers=2, start_method="fork")
    old = signal.getsignal(signal.SIGALRM)
    signal.signal(signal.SIGALRM, lambda signum, frame: env.close())
    try:
        env.reset()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(ClosedVecEnvError, match="closed during step"):
            env.step(_discrete_actions(2))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        env.close()


def test_unpicklable_env_method_result_raises_and_env_stays_usable(build):
    env = build(testenvs.bare_env_fns(3), n_workers=2)
    env.reset()
    with pytest.raises(TypeError, match="pickle"):
        env.env_method("make_lock", indices=[2])
    assert env.get_attr("tag") == [0, 1, 2]
    env.step(_discrete_actions(3))


def test_unpicklable_info_raises_naming_the_env():
    fns = [functools.partial(testenvs.make_lock_info_env, i, 2 if i == 1 else 10**6) for i in range(3)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(_discrete_actions(3))
        with pytest.raises(TypeError, match="pickle") as info:
            env.step(_discrete_actions(3))
        assert any("env 1" in note and "step" in note for note in info.value.__notes__)
        with pytest.raises(BrokenVecEnvError):
            env.step(_discrete_actions(3))
    finally:
        env.close()


_ORPHAN_SCRIPT = """
import os, sys, time
sys.path[:0] = [{tests!r}, {root!r}]  # the shmvec under test, wherever it is installed
import testenvs
from shmvec import ShmVecEnv

if __name__ == "__main__":
    env = ShmVecEnv(testenvs.bare_env_fns(3), n_workers=2, start_method={method!r})
    env.reset()
    print(" ".join(str(p.pid) for p in env._engine.workers.processes), flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_exit_when_the_parent_dies(tmp_path, method):
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_SCRIPT.format(tests=TESTS_DIR, root=SHMVEC_ROOT, method=method))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # a killed parent's pymp-* folder
    try:
        line = parent.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        workers = [psutil.Process(pid) for pid in pids]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10.0

        def gone(proc):
            try:
                return proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        while not all(gone(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(gone(w) for w in workers), "workers outlived their parent"
        # the segment was unlinked as soon as the workers attached
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{parent.pid}_")]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


def test_repeated_and_negative_indices_behave_like_dummy_vec_env(build):
    fns = testenvs.bare_env_fns(5)
    env = build(fns, n_workers=2)
    ref = DummyVecEnv(fns)
    try:
        for venv in (env, ref):
            venv.reset()
        indices = [0, 4, 0, 1, -1, -5]
        assert env.env_method("bump", indices=indices) == ref.env_method("bump", indices=indices) == [1, 1, 2, 1, 2, 3]
        assert env.get_attr("tag", -2) == ref.get_attr("tag", -2) == [3]
        assert env.get_attr("counter") == ref.get_attr("counter") == [3, 1, 0, 0, 2]
        with pytest.raises(IndexError):
            env.get_attr("tag", -6)
        # A non-integer index raises before any env is called, as in DummyVecEnv (not after the
        # workers holding the other indices have run the method).
        for venv in (env, ref):
            with pytest.raises(TypeError):
                venv.env_method("bump", indices=[0, 1.0, 3])
        assert env.get_attr("counter") == ref.get_attr("counter") == [3, 1, 0, 0, 2]
        assert env.get_attr("tag", [np.int64(1), True]) == ref.get_attr("tag", [np.int64(1), True]) == [1, 1]
    finally:
        ref.close()
