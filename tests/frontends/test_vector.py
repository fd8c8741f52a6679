"""ShmVectorEnv (the Gymnasium VectorEnv) against Gymnasium's own SyncVectorEnv.

Everything is compared exactly, step for step, on the same seeds and actions, for each
autoreset mode: observations (every leaf, dtype included), rewards (float64), terminated,
truncated and infos (dict of arrays, ``_key`` masks, ``final_obs``/``final_info``).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from packaging.version import Version
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import vector as vw

import testenvs
from helpers import REPO_ROOT, assert_same, close_all, pythonpath, SB3
import shmvec
from shmvec import DescriptionError, ShmVecEnvError, ShmVectorEnv, make_env, make_vec
from shmvec._errors import AlreadyPendingCallError, ClosedVecEnvError

N_STEPS = 80
MODES = list(AutoresetMode)
ACT_FOR_OBS = {"box": "box", "image": "discrete", "discrete": "multidiscrete", "multibinary": "box",
               "dict": "discrete", "tuple": "multibinary", "nested": "discrete"}

FORK_CASES = [
    pytest.param("fork", mode, obs, ACT_FOR_OBS[obs], 5, 2, id=f"fork-{mode.value}-{obs}-5x2")
    for mode in MODES
    for obs in ("box", "discrete", "dict", "tuple", "image")
] + [
    pytest.param("fork", mode, "nested", "discrete", 7, 3, id=f"fork-{mode.value}-nested-7x3") for mode in MODES
]
SLOW_CASES = [
    pytest.param(method, mode, "dict", "discrete", 4, 2, id=f"{method}-{mode.value}-dict-4x2")
    for method in ("forkserver", "spawn")
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)
]


def assert_same_vec(a, b, path: str = "value") -> None:
    """``assert_same`` with exact dtypes, plus object arrays (``final_obs``) compared element by element."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_same_vec(a[key], b[key], f"{path}[{key!r}]")
        return
    if isinstance(a, tuple) and isinstance(b, tuple):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same_vec(x, y, f"{path}[{k}]")
        return
    if isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, f"{path}: {a!r} vs {b!r}"
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{k}]")
        return
    assert_same(a, b, path, strict_dtype=True)


class Coverage:
    def __init__(self) -> None:
        self.terminated = self.truncated = self.info_keys = self.final = self.masked_resets = 0


def run_lockstep(ref, env, n_steps: int = N_STEPS, seed: int = 7, spaces_env: bool = True) -> Coverage:
    """Steps both vector envs with the same seeds and actions; asserts every output is equal."""
    cov = Coverage()
    mode = env.metadata["autoreset_mode"]
    assert mode == ref.metadata["autoreset_mode"]
    assert env.num_envs == ref.num_envs
    for name in ("observation_space", "action_space", "single_observation_space", "single_action_space"):
        assert getattr(env, name) == getattr(ref, name), name
    assert_same_vec(env.reset(seed=seed), ref.reset(seed=seed), "first reset")
    ref.action_space.seed(seed)
    actions = [ref.action_space.sample() for _ in range(n_steps)]
    for t, act in enumerate(actions):
        if t == n_steps // 2:  # a reset in the middle: per-env seeds and options
            seeds = [seed + 100 + i if i % 2 else None for i in range(env.num_envs)]
            out, want = env.reset(seed=seeds, options={"offset": 1.5}), ref.reset(seed=seeds, options={"offset": 1.5})
            assert_same_vec(out, want, f"reset at step {t}")
            if spaces_env:  # the options reached the envs
                assert (want[1]["offset"] == 1.5).all()
        want = ref.step(act)
        out = env.step(act)
        assert_same_vec(out, want, f"step {t} ({mode.value})")
        _, _, term, trunc, infos = want
        cov.terminated += int(term.sum())
        cov.truncated += int(trunc.sum())
        cov.info_keys += len([k for k in infos if not k.startswith("_")])
        cov.final += int("final_obs" in infos)
        if mode == AutoresetMode.DISABLED and (term | trunc).any():
            mask = term | trunc
            # the mask argument is not modified; the others keep their observation
            out = env.reset(options={"reset_mask": mask.copy()})
            want = ref.reset(options={"reset_mask": mask.copy()})
            assert_same_vec(out, want, f"masked reset after step {t}")
            cov.masked_resets += 1
    return cov


@pytest.mark.parametrize("method, mode, obs_kind, act_kind, n_envs, n_workers", FORK_CASES + SLOW_CASES)
def test_matches_sync_vector_env(method, mode, obs_kind, act_kind, n_envs, n_workers):
    fns = testenvs.spaces_env_fns(obs_kind, act_kind, n_envs)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    env = None
    try:
        env = ShmVectorEnv(fns, autoreset_mode=mode, n_workers=n_workers, start_method=method)
        assert env.n_workers == n_workers
        cov = run_lockstep(ref, env)
        assert cov.terminated > 0 and cov.truncated > 0 and cov.info_keys > 0
        assert (cov.final > 0) == (mode == AutoresetMode.SAME_STEP)
        assert (cov.masked_resets > 0) == (mode == AutoresetMode.DISABLED)
    finally:
        close_all(env, ref)


def test_autoreset_mode_as_string_and_metadata():
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    env = ShmVectorEnv(fns, autoreset_mode="SameStep", n_workers=1, start_method="fork")
    try:
        assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        assert env.metadata["render_fps"] == 4  # the env's own metadata is kept
        assert isinstance(env, gym.vector.VectorEnv)
    finally:
        env.close()
    with pytest.raises(ValueError):
        ShmVectorEnv(fns, autoreset_mode="EveryOtherStep")


def test_copy_false_still_steps_right():
    fns = testenvs.spaces_env_fns("tuple", "box", 4)
    ref = SyncVectorEnv(fns)
    env = ShmVectorEnv(fns, copy=False, n_workers=2, start_method="fork")
    try:
        run_lockstep(ref, env, n_steps=30)
    finally:
        close_all(env, ref)


def test_disabled_refuses_to_step_an_ended_env():
    fns = testenvs.spaces_env_fns("box", "discrete", 3, max_steps=2)
    env = ShmVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED, n_workers=2, start_method="fork")
    try:
        env.reset(seed=0)
        actions = np.zeros(3, dtype=np.int64)
        env.step(actions)
        _, _, term, trunc, _ = env.step(actions)
        assert trunc.all()
        with pytest.raises(ShmVecEnvError, match=r"envs \[0, 1, 2\] ended.*reset_mask"):
            env.step(actions)
        env.reset(options={"reset_mask": np.array([True, False, True])})
        with pytest.raises(ShmVecEnvError, match=r"envs \[1\] ended"):
            env.step(actions)
        env.reset(options={"reset_mask": np.array([False, True, False])})
        env.step(actions)  # the refusal left the vector env usable
    finally:
        env.close()


class CountingVectorEnv(ShmVectorEnv):
    """A subclass that changes step_async and step_wait: step() must go through them."""

    calls: list

    def step_async(self, actions):
        self.calls.append("step_async")
        super().step_async(actions)

    def step_wait(self, **kwargs):
        self.calls.append("step_wait")
        return super().step_wait(**kwargs)


def test_step_goes_through_a_replaced_step_async_or_step_wait():
    fns = testenvs.spaces_env_fns("box", "discrete", 3)
    ref = SyncVectorEnv(fns)
    sub = CountingVectorEnv(fns, n_workers=2, start_method="fork")
    plain = ShmVectorEnv(fns, n_workers=2, start_method="fork")
    try:
        sub.calls = []
        actions = np.array([0, 1, 1])
        want = (ref.reset(seed=3), ref.step(actions), ref.step(actions))
        assert_same_vec((sub.reset(seed=3), sub.step(actions), sub.step(actions)), want)
        assert sub.calls == ["step_async", "step_wait"] * 2
        seen = []
        plain.step_wait = lambda **kw: (seen.append("own"), ShmVectorEnv.step_wait(plain, **kw))[1]
        assert_same_vec((plain.reset(seed=3), plain.step(actions), plain.step(actions)), want)
        assert seen == ["own", "own"]
        del plain.step_wait
        plain.step_async(actions)  # in flight: step() refuses, in Gymnasium's words, and the step stays
        with pytest.raises(AlreadyPendingCallError, match="pending call to `step`"):
            plain.step(actions)
        plain.step_wait()
        plain.step(actions)
    finally:
        close_all(sub, plain, ref)


def _seeded_rollout(env, n_steps: int = 40) -> list:
    out = [env.reset(seed=5)]
    rng = np.random.default_rng(1)
    for _ in range(n_steps):
        out.append(env.step(rng.integers(0, 2, size=env.num_envs)))
    return out


def test_describe_rebuilds_the_same_vector_env_and_says_what_was_decided():
    """describe() is plain data (a JSON round trip) with the face's own options and what the
    defaults became; from_description and shmvec.rebuild build a ShmVectorEnv stepping as the first."""
    env = ShmVectorEnv([make_env("CartPole-v1")] * 3, autoreset_mode="SameStep", n_workers=2, start_method="fork")
    try:
        description = json.loads(json.dumps(env.describe()))
        want = _seeded_rollout(env)
    finally:
        env.close()
    assert description["vec_env"] == "shmvec.ShmVectorEnv" and description["n_envs"] == 3
    options = description["options"]
    assert options["autoreset_mode"] == "SameStep" and options["observation_mode"] == "same"
    assert options["n_workers"] == 2 and options["start_method"] == "fork" and options["max_concurrency"] is None
    assert description["decided"]["n_workers"]["value"] == 2 and "why" in description["decided"]["placement"]
    assert description["seed"] is None and description["reset_options"] is None
    for rebuilt in (ShmVectorEnv.from_description(description, start_method="spawn"), shmvec.rebuild(description)):
        try:
            assert type(rebuilt) is ShmVectorEnv and rebuilt.autoreset_mode == AutoresetMode.SAME_STEP
            assert rebuilt.n_workers == 2
            assert_same_vec(tuple(_seeded_rollout(rebuilt)), tuple(want))
        finally:
            rebuilt.close()


def test_describe_names_what_is_not_plain_data_and_rebuild_names_the_class_to_use():
    env = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=1, start_method="fork")
    try:
        with pytest.raises(DescriptionError, match=r"env_fns\[0\] cannot be described.*decided\(\) still says"):
            env.describe()
        decided = json.loads(json.dumps(env.decided()))  # a CleanRL loop's closures: what was decided, still
        assert decided["n_workers"]["value"] == 1 and "why" in decided["placement"]
        assert decided["parent_threads"]["option"] == "auto"
    finally:
        env.close()
    with pytest.raises(ClosedVecEnvError):
        env.describe()
    with pytest.raises(ClosedVecEnvError):
        env.decided()
    single = gym.make("CartPole-v1").observation_space
    env = ShmVectorEnv([make_env("CartPole-v1")] * 2, n_workers=1, start_method="fork",
                       observation_mode=(gym.vector.utils.batch_space(single, 2), single))
    try:
        with pytest.raises(DescriptionError, match="observation_mode is a pair of spaces"):
            env.describe()
    finally:
        env.close()
    with pytest.raises(DescriptionError, match=r"made by shmvec.ShmVecEnv.describe\(\), not by shmvec.ShmVectorEnv"):
        ShmVectorEnv.from_description({"shmvec_description": 1, "n_envs": 0, "env_fns": []})
    with pytest.raises(DescriptionError, match=r"shmvec.ray.RayShmVecEnv.from_description\(description\)"):
        shmvec.rebuild({"shmvec_description": 1, "vec_env": "shmvec.ray.RayShmVecEnv", "n_envs": 0, "env_fns": []})


@pytest.mark.parametrize("mask, exc", [
    ([True, False], TypeError),                      # not an array
    (np.array([True, False, True]), ValueError),     # wrong shape
    (np.array([1, 0]), TypeError),                   # wrong dtype
    (np.array([False, False]), ValueError),          # nothing to reset
])
def test_reset_mask_validation(mask, exc):
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    env = ShmVectorEnv(fns, n_workers=1, start_method="fork")
    try:
        with pytest.raises(exc):
            env.reset(options={"reset_mask": mask})
        with pytest.raises(ValueError, match="num_envs=2"):
            env.reset(seed=[1, 2, 3])
        env.reset(seed=1)  # still usable
    finally:
        env.close()


def test_call_get_attr_set_attr_render_match_sync():
    fns = [functools.partial(testenvs.make_render_env, i) for i in range(5)]
    ref = SyncVectorEnv(fns)
    env = ShmVectorEnv(fns, n_workers=2, start_method="fork")
    try:
        assert env.render_mode == ref.render_mode == "rgb_array"
        env.reset(seed=1)
        ref.reset(seed=1)
        assert env.call("describe") == ref.call("describe")
        assert env.call("bump", 2, times=3) == ref.call("bump", 2, times=3) == (6,) * 5
        assert env.get_attr("tag") == ref.get_attr("tag") == (0, 1, 2, 3, 4)
        assert env.call("tag") == (0, 1, 2, 3, 4)  # not callable: returned as is
        env.set_attr("scale", [0.5, 1.0, 2.0, 3.0, 4.0])
        ref.set_attr("scale", [0.5, 1.0, 2.0, 3.0, 4.0])
        assert env.get_attr("scale") == (0.5, 1.0, 2.0, 3.0, 4.0)
        env.set_attr("counter", 9)
        assert env.get_attr("counter") == (9,) * 5
        with pytest.raises(ValueError, match="length equal"):
            env.set_attr("scale", [1.0, 2.0])
        act = np.ones(5, dtype=np.int64)
        assert_same_vec(env.step(act), ref.step(act), "step after set_attr")
        frames = env.render()
        assert isinstance(frames, tuple)
        assert_same(frames, ref.render(), "frames")
        assert env.np_random_seed == ref.np_random_seed
        with pytest.raises(KeyError, match="env_method failure"):
            env.call("fail")
        assert env.get_attr("tag") == (0, 1, 2, 3, 4)  # an env's error in call() leaves it usable
    finally:
        close_all(env, ref)


def test_set_attr_sends_each_worker_only_its_own_envs_values():
    fns = [functools.partial(testenvs.make_render_env, i) for i in range(4)]
    env = ShmVectorEnv(fns, n_workers=2, start_method="fork")
    try:
        sent = []
        engine = env._engine
        send = engine.channel.send_bytes
        engine.channel.send_bytes = lambda w, data, command: (sent.append(len(data)), send(w, data, command))
        values = [bytes([i]) * 300_000 for i in range(4)]
        env.set_attr("blob", values)
        assert len(sent) == 2 and max(sent) < 700_000, sent  # two values each, not all four
        del engine.channel.send_bytes
        assert [b[:1] for b in env.get_attr("blob")] == [bytes([i]) for i in range(4)]
        assert all(len(b) == 300_000 for b in env.get_attr("blob"))
    finally:
        env.close()


def test_env_error_and_closed_use():
    env = ShmVectorEnv([functools.partial(testenvs.make_raising_env, 2)] * 2, n_workers=2, start_method="fork")
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(testenvs.EnvBoom):
            env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()
    env.close()  # idempotent
    assert env.closed
    with pytest.raises(ClosedVecEnvError):
        env.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(ClosedVecEnvError):
        env.reset()


def test_bad_actions_are_refused():
    env = ShmVectorEnv(testenvs.spaces_env_fns("box", "box", 3), n_workers=1, start_method="fork")
    try:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="shape"):
            env.step(np.zeros((3, 5), dtype=np.float32))
    finally:
        env.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_make_vec_matches_gymnasium_make_vec(method):
    ref = gym.make_vec("CartPole-v1", num_envs=6, vectorization_mode="sync",
                       wrappers=[gym.wrappers.TimeAwareObservation], max_episode_steps=40)
    env = make_vec("CartPole-v1", num_envs=6, vector_kwargs={"n_workers": 2, "start_method": method},
                   wrappers=[gym.wrappers.TimeAwareObservation], max_episode_steps=40)
    try:
        assert isinstance(env, ShmVectorEnv)
        assert env.spec.id == "CartPole-v1" and env.spec.kwargs["num_envs"] == 6
        assert env.single_observation_space.shape == (5,)  # the wrapper ran in the workers
        cov = run_lockstep(ref, env, n_steps=120, spaces_env=False)
        assert cov.truncated > 0 and cov.terminated > 0
        assert "ShmVectorEnv(CartPole-v1, num_envs=6)" in repr(env)
    finally:
        close_all(env, ref)
    env = ShmVectorEnv.from_id("CartPole-v1", num_envs=2, vector_kwargs={"n_workers": 1, "start_method": "fork"})
    try:
        assert env.reset(seed=0)[0].shape == (2, 4)
    finally:
        env.close()


def test_make_vec_takes_gymnasiums_arguments_its_own_spec_and_module_ids():
    """As gymnasium.make_vec: the third argument is vectorization_mode, a vector env's spec makes
    it again (its num_envs and vector_kwargs are not env kwargs), "module:Env-v0" imports module."""
    kwargs = {"n_workers": 1, "start_method": "fork"}
    env = make_vec("CartPole-v1", 3, None, kwargs, max_episode_steps=20)
    again = None
    try:
        again = make_vec(env.spec)  # the workers got CartPole(num_envs=3, vectorization_mode=...) before
        assert again.num_envs == 3 and again.spec.kwargs["max_episode_steps"] == 20
        assert_same(again.reset(seed=0), env.reset(seed=0))
    finally:
        close_all(env, again)
    with pytest.raises(ValueError, match="gymnasium.make_vec"):
        make_vec("CartPole-v1", 2, "sync")  # "async" is taken (CleanRL's one-line swap)
    with pytest.raises(gym.error.Error, match="Invalid id type"):
        make_vec(3)
    # a module that registers its env when imported, named in the id (its env is not registered here yet)
    env = make_vec("vector_registered:ShmvecRegistered-v0", 2, vector_kwargs=kwargs)
    try:
        assert env.reset(seed=0)[0].shape == (2, 4)
    finally:
        env.close()


def test_make_vec_describes_itself_and_rebuilds_stepping_the_same():
    """make_vec's envs are one factory of plain data: describe() writes it (wrappers as import
    strings), from_description steps as the original; a lambda wrapper is named as what cannot be."""
    env = make_vec("CartPole-v1", 3, vector_kwargs={"n_workers": 2, "start_method": "fork"},
                   wrappers=[gym.wrappers.TimeAwareObservation], max_episode_steps=30)
    try:
        description = json.loads(json.dumps(env.describe()))
        want = _seeded_rollout(env, 60)
    finally:
        env.close()
    factory = description["env_fns"][0]["factory"]
    assert factory["spec"]["id"] == "CartPole-v1" and factory["kwargs"] == {"max_episode_steps": 30}
    assert "TimeAwareObservation" in json.dumps(factory["wrappers"])
    assert description["decided"]["n_workers"]["value"] == 2
    rebuilt = ShmVectorEnv.from_description(description, start_method="spawn")
    try:
        assert rebuilt.single_observation_space.shape == (5,)
        assert_same_vec(tuple(_seeded_rollout(rebuilt, 60)), tuple(want))
    finally:
        rebuilt.close()
    env = make_vec("CartPole-v1", 2, vector_kwargs={"n_workers": 1, "start_method": "fork"},
                   wrappers=[lambda e: gym.wrappers.TimeAwareObservation(e)])
    try:
        assert env.reset(seed=0)[0].shape == (2, 5)  # the lambda travels with cloudpickle and runs
        with pytest.raises(DescriptionError, match=r"env_fns\[0\] cannot be described.*lambda"):
            env.describe()
    finally:
        env.close()


def _wrapped(venv):
    venv = vw.RecordEpisodeStatistics(venv)
    venv = vw.NormalizeObservation(venv)
    venv = vw.NormalizeReward(venv, gamma=0.9)
    venv = vw.ClipReward(venv, min_reward=-1.0, max_reward=1.0)
    venv = vw.TransformObservation(venv, lambda obs: obs * 2.0, venv.observation_space)
    return vw.DictInfoToList(venv)


@pytest.mark.skipif(Version(gym.__version__) < Version("1.2.2"),
                    reason="gymnasium < 1.2.2: DictInfoToList over RecordEpisodeStatistics raises KeyError '_r' "
                           "at the first episode end, on SyncVectorEnv too")
def test_gymnasium_vector_wrappers_on_top():
    """Gymnasium's vector wrappers, stacked, behave identically on ShmVectorEnv and SyncVectorEnv."""
    fns = testenvs.spaces_env_fns("box", "box", 6)
    ref = _wrapped(SyncVectorEnv(fns))
    env = _wrapped(ShmVectorEnv(fns, n_workers=2, start_method="fork"))
    try:
        obs_e, infos_e = env.reset(seed=3)
        obs_r, infos_r = ref.reset(seed=3)
        assert np.allclose(obs_e, obs_r) and obs_e.dtype == obs_r.dtype
        ref.action_space.seed(3)
        episodes = 0
        for t in range(150):
            act = ref.action_space.sample()
            out, want = env.step(act), ref.step(act)
            for k in range(4):  # running statistics: equal up to float rounding
                np.testing.assert_allclose(out[k], want[k], rtol=1e-6, err_msg=f"step {t} item {k}")
            assert len(out[4]) == 6 and isinstance(out[4], list)
            for i, (a, b) in enumerate(zip(out[4], want[4])):
                assert set(a) == set(b), f"step {t} env {i}"
                if "episode" in b:
                    episodes += 1
                    assert a["episode"]["r"] == pytest.approx(b["episode"]["r"])
                    assert a["episode"]["l"] == b["episode"]["l"]
        assert episodes > 5
        assert env.unwrapped.__class__ is ShmVectorEnv
    finally:
        close_all(env, ref)


_NO_SB3_SCRIPT = """
import sys
import numpy as np
import gymnasium as gym
from shmvec import ShmEnvPool, ShmVectorEnv, make_vec

if __name__ == "__main__":
    envs = make_vec("CartPole-v1", num_envs=4, vector_kwargs={"n_workers": 2})
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    print(envs.render_mode, envs.metadata["render_modes"] if "render_modes" in envs.metadata else None)
    envs.close()
    pool = ShmEnvPool([lambda: gym.make("CartPole-v1")] * 4, batch_size=2, n_workers=2)
    obs, infos = pool.reset(seed=0)
    pool.send(np.zeros(2, dtype=np.int64), infos["env_id"])
    pool.recv()
    pool.close()
    print(sorted(m for m in ("torch", "stable_baselines3") if m in sys.modules))
"""


def test_gymnasium_face_and_pool_import_neither_sb3_nor_torch(tmp_path):
    """Their engine (shmvec._engine) does not import SB3: a Gymnasium user's
    process does not pay for importing SB3 and torch (about 1.2 s and 200 MB)."""
    script = tmp_path / "gym_only.py"
    script.write_text(_NO_SB3_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=pythonpath()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_gymnasium_face_finds_render_mode_and_indices_as_sb3_does(render_mode):
    """The engine, without SB3, finds the envs' render mode and expands indices as SB3's VecEnv does."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = [functools.partial(testenvs.make_spaces_env, "box", "discrete", i, render_mode=render_mode)
           for i in range(3)]
    ref = DummyVecEnv(fns)
    env = ShmVectorEnv(fns, n_workers=2, start_method="fork")
    try:
        assert env.render_mode == ref.render_mode
        for indices in (None, 2, [0, 2], range(1, 3)):
            assert list(env._engine.indices(indices)) == list(ref._get_indices(indices))
    finally:
        env.close()
        ref.close()


@pytest.mark.timeout(170)
@SB3
def test_cleanrl_ppo_example_runs():
    """examples/cleanrl_ppo.py trains on ShmVectorEnv for a few iterations (a real subprocess)."""
    root = Path(REPO_ROOT)
    script = root / "examples" / "cleanrl_ppo.py"
    env = dict(os.environ, PYTHONPATH=pythonpath())
    proc = subprocess.run(
        [sys.executable, str(script), "--total-timesteps", "2048", "--num-envs", "8", "--num-steps", "64",
         "--n-workers", "2", "--update-epochs", "2", "--seed", "1"],
        capture_output=True, text=True, timeout=160, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("iteration")]
    assert len(lines) == 4, proc.stdout  # 2048 / (8 * 64) iterations
    assert "episodes=" in lines[-1]
    assert int(lines[-1].split("episodes=")[1].split()[0]) > 0


def test_bad_seeds_are_refused_before_anything_is_sent_and_numpy_ints_are_taken():
    """A seed each env's reset would refuse broke the vector env (raised in a worker); numpy ints
    (a list of them, as np.arange gives) are taken as ints."""
    env = ShmVectorEnv(testenvs.spaces_env_fns("box", "discrete", 2), n_workers=2, start_method="fork")
    try:
        want = env.reset(seed=[3, 4])
        assert_same(env.reset(seed=list(np.arange(3, 5))), want)
        assert_same(env.reset(seed=np.int64(3)), want)
        for bad in (-1, [0, -2], [0, 1.5], [True, 0], ["0", 1]):
            with pytest.raises(gym.error.Error, match="Seed must be"):
                env.reset(seed=bad)
        assert_same(env.reset(seed=[3, 4]), want)  # still usable
    finally:
        env.close()


def test_misuse_errors_are_gymnasiums_too_and_name_the_class_in_hand():
    """``except gymnasium.error.ClosedEnvironmentError`` (AsyncVectorEnv's) catches ours too."""
    env = ShmVectorEnv(testenvs.spaces_env_fns("box", "discrete", 2), n_workers=1, start_method="fork")
    env.reset(seed=0)
    env.close()
    with pytest.raises(gym.error.ClosedEnvironmentError, match="this ShmVectorEnv is closed"):
        env.step(np.zeros(2, dtype=np.int64))
    from shmvec import AlreadyPendingCallError, NoAsyncCallError

    assert issubclass(AlreadyPendingCallError, gym.error.AlreadyPendingCallError)
    assert issubclass(NoAsyncCallError, gym.error.NoAsyncCallError)


def _types(value):
    """The types (and shapes) of a nested value's leaves."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_types(v) for v in value)
    return type(value).__name__, getattr(value, "shape", None), str(getattr(value, "dtype", ""))


@pytest.mark.parametrize("kind", ["box", "int_box", "dict", "tuple"])
def test_final_obs_of_scalar_leaves_has_the_references_types(kind):
    """One env's value of a scalar Box leaf comes back as Box.sample() gives it: a 0-d array for a
    float dtype (was a numpy scalar), a numpy scalar for an integer or bool one; a Discrete's a
    numpy int (as SyncVectorEnv's final_obs); SB3's terminal_observation as DummyVecEnv's."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv

    fns = [functools.partial(testenvs.make_scalar_leaves_env, kind)] * 3
    pairs = [(SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP),
              ShmVectorEnv(fns, n_workers=2, start_method="fork", autoreset_mode=AutoresetMode.SAME_STEP)),
             (DummyVecEnv(fns), ShmVecEnv(fns, n_workers=2, start_method="fork"))]
    try:
        (ref, env), (ref3, env3) = pairs
        ref.reset(seed=5), env.reset(seed=5)
        ref3.seed(5), env3.seed(5)
        ref3.reset(), env3.reset()
        for _ in range(2):
            a = np.zeros(3, dtype=np.int64)
            *_, info_ref = ref.step(a)
            *_, info = env.step(a)
            *_, infos_ref = ref3.step(a)
            *_, infos = env3.step(a)
        for i in range(3):
            assert _types(info["final_obs"][i]) == _types(info_ref["final_obs"][i])
            assert_same(info["final_obs"][i], info_ref["final_obs"][i])
            terminal, terminal_ref = infos[i]["terminal_observation"], infos_ref[i]["terminal_observation"]
            assert _types(terminal) == _types(terminal_ref)
            assert_same(terminal, terminal_ref)
    finally:
        close_all(*[e for pair in pairs for e in pair])


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("obs_kind", ["image", "nested"])
def test_matches_sync_vector_env_with_zero_copy(mode, obs_kind):
    """zero_copy=True (observations handed out from lease blocks): still SyncVectorEnv's, step for
    step, masked resets (the envs not reset keep their observation) included."""
    fns = testenvs.spaces_env_fns(obs_kind, ACT_FOR_OBS[obs_kind], 5)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    env = None
    try:
        env = ShmVectorEnv(fns, autoreset_mode=mode, n_workers=2, start_method="fork", zero_copy=True)
        assert env._engine.leases is not None
        cov = run_lockstep(ref, env)
        assert (cov.masked_resets > 0) == (mode == AutoresetMode.DISABLED)
        assert env._engine.leases.grown >= 2  # the observations came from lease blocks
    finally:
        close_all(env, ref)
