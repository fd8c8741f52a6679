"""An Atari game (ale-py ships its ROMs) with SB3's Atari wrappers through ShmVecEnv.

``gym.make("ale_py:PongNoFrameskip-v4")`` imports ale_py (which registers the ALE
envs) in whichever process builds the env, so the id works in spawned and
forkserver workers as well.  Skipped when ale-py or OpenCV (AtariWrapper's frame
resizing) is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecTransposeImage

from helpers import assert_same, close_all
from shmvec import ShmVecEnv

pytest.importorskip("ale_py", reason="needs ale-py (pip install 'shmvec[test]')")
pytest.importorskip("cv2", reason="AtariWrapper resizes frames with OpenCV (pip install opencv-python-headless)")

GAME = "ale_py:PongNoFrameskip-v4"


def _atari(cls, n_envs: int, **kwargs):
    venv = make_atari_env(GAME, n_envs=n_envs, seed=0, vec_env_cls=cls,
                          vec_env_kwargs=kwargs or None)
    return VecFrameStack(venv, n_stack=4)


def test_atari_with_atari_wrapper_matches_dummy_vec_env():
    ref = _atari(DummyVecEnv, 3)
    env = _atari(ShmVecEnv, 3, n_workers=2, start_method="fork")
    try:
        assert env.observation_space.shape == (84, 84, 4)
        assert env.observation_space.dtype == np.uint8
        assert_same(env.reset(), ref.reset())
        rng = np.random.default_rng(0)
        for t in range(40):
            actions = rng.integers(0, env.action_space.n, size=3)
            assert_same(env.step(actions), ref.step(actions), f"step {t}", ignore=frozenset({"t"}))
    finally:
        close_all(env, ref)


def test_ppo_cnn_trains_on_atari_through_shm_vec_env():
    env = _atari(ShmVecEnv, 2, n_workers=2, start_method="fork")
    try:
        model = PPO("CnnPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, verbose=0)
        assert isinstance(model.get_env(), VecTransposeImage)
        model.learn(32)  # one rollout of 2 x 16 steps, one update
        assert model.num_timesteps == 32
        obs = model.get_env().reset()
        assert obs.shape == (2, 4, 84, 84)
        actions, _ = model.predict(obs)
        assert actions.shape == (2,)
    finally:
        env.close()
