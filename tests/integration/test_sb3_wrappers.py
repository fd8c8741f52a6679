"""Stable-Baselines3's VecEnv wrappers on top of ShmVecEnv.

Each wrapper runs over a ShmVecEnv and over a DummyVecEnv built from the same
factories and seeds, and the two must agree step by step (observations, rewards,
dones, infos with their terminal observations, and the wrapper's own state).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecCheckNan,
    VecEnv,
    VecExtractDictObs,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    VecVideoRecorder,
)

import sb3envs
from helpers import assert_same, close_all
from shmvec import ShmVecEnv

IGNORE = frozenset({"t"})  # Monitor's wall-clock time


def _cartpole(index: int = 0) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=15 + index)


def _pendulum(index: int = 0) -> gym.Env:
    return gym.make("Pendulum-v1", max_episode_steps=12 + index)


def _both(fns: list[Callable[[], gym.Env]], n_workers: int = 2) -> tuple[VecEnv, VecEnv]:
    return DummyVecEnv(fns), ShmVecEnv(fns, n_workers=n_workers, start_method="fork")


def _run_side_by_side(ref: VecEnv, env: VecEnv, steps: int, seed: int = 0,
                      check: Callable[[VecEnv, VecEnv], None] | None = None) -> int:
    """Seeds, resets and steps both with the same random actions; returns how many episodes ended."""
    ref.seed(seed)
    env.seed(seed)
    assert_same(env.reset(), ref.reset(), "reset")
    space = ref.action_space
    space.seed(seed)
    ends = 0
    for t in range(steps):
        actions = np.stack([space.sample() for _ in range(ref.num_envs)])
        out = env.step(actions)
        out_ref = ref.step(actions)
        assert_same(out, out_ref, f"step {t}", ignore=IGNORE)
        if check is not None:
            check(env, ref)
        ends += int(out[2].sum())
    return ends


def _fns(factory: Callable[..., gym.Env], n: int, **kwargs: Any) -> list:
    return [functools.partial(factory, i, **kwargs) for i in range(n)]


@pytest.mark.parametrize("factory", [_cartpole, _pendulum], ids=["cartpole", "pendulum"])
def test_vec_normalize_matches_dummy_vec_env(factory):
    base_ref, base = _both(_fns(factory, 5))
    ref = VecNormalize(base_ref, gamma=0.9)
    env = VecNormalize(base, gamma=0.9)

    def same_statistics(a: VecNormalize, b: VecNormalize) -> None:
        for name in ("mean", "var", "count"):
            assert np.array_equal(getattr(a.obs_rms, name), getattr(b.obs_rms, name)), f"obs_rms.{name}"
            assert np.array_equal(getattr(a.ret_rms, name), getattr(b.ret_rms, name)), f"ret_rms.{name}"
        assert_same(a.get_original_obs(), b.get_original_obs())
        assert_same(a.get_original_reward(), b.get_original_reward())

    try:
        ends = _run_side_by_side(ref, env, 40, check=same_statistics)
        assert ends > 5
    finally:
        close_all(env, ref)


def test_vec_normalize_statistics_save_and_load(tmp_path):
    env = VecNormalize(ShmVecEnv(_fns(_cartpole, 4), n_workers=2, start_method="fork"))
    fresh = None
    try:
        env.seed(0)
        env.reset()
        for _ in range(30):
            env.step(np.zeros(4, dtype=np.int64))
        env.save(tmp_path / "vecnormalize.pkl")
        fresh = VecNormalize.load(tmp_path / "vecnormalize.pkl",
                                  ShmVecEnv(_fns(_cartpole, 4), n_workers=1, start_method="fork"))
        assert isinstance(fresh.venv, ShmVecEnv)
        for name in ("mean", "var", "count"):
            assert np.array_equal(getattr(fresh.obs_rms, name), getattr(env.obs_rms, name))
            assert np.array_equal(getattr(fresh.ret_rms, name), getattr(env.ret_rms, name))
        fresh.training = False
        raw = np.array([[0.1, -0.2, 0.03, 0.4]] * 4, dtype=np.float32)
        np.testing.assert_array_equal(fresh.normalize_obs(raw), env.normalize_obs(raw))
        obs = fresh.reset()  # the loaded wrapper steps its new ShmVecEnv
        assert obs.shape == (4, 4) and np.abs(obs).max() <= fresh.clip_obs
        before = fresh.obs_rms.count
        fresh.step(np.zeros(4, dtype=np.int64))
        assert fresh.obs_rms.count == before  # training=False: statistics frozen
    finally:
        close_all(env, fresh)


def test_ppo_with_vec_normalize_over_shm_vec_env_matches_dummy_vec_env(one_torch_thread):
    params = []
    for cls in (DummyVecEnv, ShmVecEnv):
        venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=4, seed=0, vec_env_cls=cls,
                                         vec_env_kwargs={"start_method": "fork"} if cls is ShmVecEnv else None))
        try:
            model = PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=2, seed=0,
                        policy_kwargs={"net_arch": [16]})
            model.learn(128)
            params.append([p.detach().clone() for p in model.policy.parameters()] + [
                torch.as_tensor(venv.obs_rms.mean), torch.as_tensor(venv.ret_rms.var)])
        finally:
            venv.close()
    assert all(torch.equal(a, b) for a, b in zip(*params))


@pytest.mark.parametrize("channels_order", [None, "last"])
def test_vec_frame_stack_matches_dummy_vec_env(channels_order):
    fns = [functools.partial(sb3envs.make_frame_env, 1, 6 + i) for i in range(3)]
    base_ref, base = _both(fns)
    ref = VecFrameStack(base_ref, n_stack=4, channels_order=channels_order)
    env = VecFrameStack(base, n_stack=4, channels_order=channels_order)
    try:
        assert env.observation_space == ref.observation_space
        assert env.observation_space.shape == (84, 84, 4)
        ends = _run_side_by_side(ref, env, 20)
        assert ends >= 3  # the stacked terminal observations were compared too
    finally:
        close_all(env, ref)


def test_vec_frame_stack_on_vector_observations():
    base_ref, base = _both(_fns(_cartpole, 4))
    ref, env = VecFrameStack(base_ref, n_stack=3), VecFrameStack(base, n_stack=3)
    try:
        assert env.observation_space.shape == (12,)
        assert _run_side_by_side(ref, env, 25) > 3
    finally:
        close_all(env, ref)


def test_vec_transpose_image_matches_dummy_vec_env():
    fns = [functools.partial(sb3envs.make_frame_env, 3, 5 + i) for i in range(3)]
    base_ref, base = _both(fns)
    ref, env = VecTransposeImage(base_ref), VecTransposeImage(base)
    try:
        assert env.observation_space.shape == (3, 84, 84)
        assert _run_side_by_side(ref, env, 15) >= 3
    finally:
        close_all(env, ref)


def test_ppo_cnn_policy_wraps_shm_vec_env_in_vec_transpose_image():
    fns = [functools.partial(sb3envs.make_frame_env, 1, 20) for _ in range(2)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    try:
        model = PPO("CnnPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0,
                    policy_kwargs={"features_extractor_kwargs": {"features_dim": 32}})
        assert isinstance(model.get_env(), VecTransposeImage)
        assert model.get_env().venv is env
        model.learn(64)
        assert model.num_timesteps == 64
    finally:
        env.close()


def test_vec_monitor_matches_dummy_vec_env():
    base_ref, base = _both(_fns(_cartpole, 4))
    ref, env = VecMonitor(base_ref), VecMonitor(base)
    try:
        episodes: list = []

        def collect(e: VecEnv, r: VecEnv) -> None:
            episodes.append(e.episode_count)
            assert e.episode_count == r.episode_count

        assert _run_side_by_side(ref, env, 40, check=collect) > 5
        assert episodes[-1] > 5
    finally:
        close_all(env, ref)


def test_vec_check_nan_raises_on_a_nan_observation_from_a_worker():
    env = VecCheckNan(ShmVecEnv([functools.partial(sb3envs.make_nan_env, 3)] * 2, n_workers=2,
                                start_method="fork"), raise_exception=True)
    try:
        env.reset()
        for _ in range(2):
            env.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match="found nan in observations"):
            env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()


def test_vec_check_nan_raises_on_nan_actions_before_they_reach_the_workers():
    env = VecCheckNan(ShmVecEnv(_fns(_pendulum, 2), n_workers=1, start_method="fork"), raise_exception=True)
    try:
        env.reset()
        with pytest.raises(ValueError, match="found nan in actions"):
            env.step(np.array([[np.nan], [0.0]], dtype=np.float32))
        env.step(np.zeros((2, 1), dtype=np.float32))  # still usable: nothing was sent
    finally:
        env.close()


def test_vec_extract_dict_obs_matches_dummy_vec_env():
    fns = [functools.partial(sb3envs.make_point_goal_env, 8 + i) for i in range(3)]
    base_ref, base = _both(fns)
    ref, env = VecExtractDictObs(base_ref, "observation"), VecExtractDictObs(base, "observation")
    try:
        assert env.observation_space == spaces_box(4)
        assert _run_side_by_side(ref, env, 20) >= 3
    finally:
        close_all(env, ref)


def spaces_box(n: int) -> gym.spaces.Box:
    return gym.spaces.Box(-1.0, 1.0, shape=(n,), dtype=np.float32)


def _render_fns(n: int) -> list:
    return [functools.partial(sb3envs.make_point_goal_env, 30, "rgb_array") for _ in range(n)]


def test_render_and_get_images_match_dummy_vec_env():
    """What VecVideoRecorder records: VecEnv.render() tiles the workers' get_images()."""
    ref, env = _both(_render_fns(3))
    try:
        assert env.render_mode == "rgb_array"
        ref.seed(4)
        env.seed(4)
        env.reset()
        ref.reset()
        for _ in range(3):
            assert_same(env.get_images(), ref.get_images())
            frame = env.render()
            assert_same(frame, ref.render())
            assert frame.shape == (64, 64, 3)  # 3 frames of 32x32 tiled on a 2x2 grid
            actions = np.full((3, 2), 0.5, dtype=np.float32)
            env.step(actions)
            ref.step(actions)
    finally:
        close_all(env, ref)


def test_vec_video_recorder_writes_a_video(tmp_path):
    pytest.importorskip("moviepy", reason="VecVideoRecorder needs moviepy (pip install 'shmvec[video]')")
    base = ShmVecEnv(_render_fns(2), n_workers=2, start_method="fork")
    env = VecVideoRecorder(base, str(tmp_path), record_video_trigger=lambda step: step == 0, video_length=12,
                           name_prefix="shm")
    try:
        env.reset()
        for _ in range(15):
            env.step(np.zeros((2, 2), dtype=np.float32))
    finally:
        env.close()
    videos = list(tmp_path.glob("shm-step-0-to-step-12.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0
