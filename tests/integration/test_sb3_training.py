"""Stable-Baselines3 trains on ShmVecEnv.  Not a timing test."""

from __future__ import annotations

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv

from helpers import close_all
from shmvec import ShmVecEnv

PPO_KWARGS = dict(seed=0, n_steps=64, batch_size=128, n_epochs=4, learning_rate=1e-3, verbose=0)


def _mean_episode_reward(model: PPO) -> float:
    return float(np.mean([ep["r"] for ep in model.ep_info_buffer]))


def test_ppo_learns_cartpole_on_shm_vec_env():
    # The default start method (forkserver where available), as a user would get it.
    env = make_vec_env("CartPole-v1", n_envs=8, vec_env_cls=ShmVecEnv, seed=0)
    eval_env = make_vec_env("CartPole-v1", n_envs=4, vec_env_cls=DummyVecEnv, seed=123)
    try:
        assert isinstance(env, ShmVecEnv)
        model = PPO("MlpPolicy", env, **PPO_KWARGS)
        untrained, _ = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=False)
        model.learn(512)  # one rollout: the episodes of the untrained policy
        early = _mean_episode_reward(model)
        model.learn(20_000, reset_num_timesteps=False)
        late = _mean_episode_reward(model)
        trained, _ = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=True)
        # Observed: untrained ~21, early ~19; after 20k steps late ~170, trained 150-460.
        assert untrained < 50 and early < 50
        assert late > 80, (early, late)
        assert trained > 100, (untrained, trained)
    finally:
        close_all(env, eval_env)


def test_ppo_on_shm_vec_env_matches_ppo_on_dummy_vec_env():
    """Same seeds, same rollouts: PPO ends with exactly the same episodes and parameters."""
    results = []
    for cls, kwargs in ((DummyVecEnv, None), (ShmVecEnv, {"start_method": "fork", "n_workers": 2})):
        env = make_vec_env("CartPole-v1", n_envs=8, vec_env_cls=cls, seed=0, vec_env_kwargs=kwargs)
        try:
            model = PPO("MlpPolicy", env, **PPO_KWARGS)
            model.learn(2048)
            episodes = [(ep["r"], ep["l"]) for ep in model.ep_info_buffer]
            params = [p.detach().clone() for p in model.policy.parameters()]
            results.append((episodes, params))
        finally:
            env.close()
    (episodes_ref, params_ref), (episodes, params) = results
    assert len(episodes_ref) > 20
    assert episodes == episodes_ref
    assert all(torch.equal(a, b) for a, b in zip(params, params_ref))
