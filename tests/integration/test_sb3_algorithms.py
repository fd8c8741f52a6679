"""Stable-Baselines3's algorithms, evaluation, callbacks and save/load through ShmVecEnv.

Short plumbing runs, not learning tests: each algorithm trains a few hundred steps on a
ShmVecEnv and on a DummyVecEnv built from the same factories and seeds, and must end with
exactly the same weights (same seeds give the same rollouts, so the same updates; torch
runs on one thread, deterministic algorithms).  A difference anywhere in what the vec env
returns (an observation, a reward, a done flag, a terminal observation, a TimeLimit flag)
changes the weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import A2C, DQN, PPO, SAC, TD3, HerReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv

import sb3envs
from helpers import close_all
from shmvec import ShmVecEnv



def _net() -> dict:
    """Small networks; a new dict each time (SAC and TD3 write into policy_kwargs)."""
    return {"net_arch": [32, 32]}


@pytest.fixture(autouse=True)
def deterministic_torch():
    """One torch thread and deterministic kernels: equal inputs give bit-equal updates."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


def _vec(env_id, n_envs, cls, seed=0, **kwargs):
    return make_vec_env(env_id, n_envs=n_envs, seed=seed, vec_env_cls=cls,
                        vec_env_kwargs={"start_method": "fork", "n_workers": min(2, n_envs)} if cls is ShmVecEnv
                        else None, **kwargs)


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


def _assert_same_params(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"parameter {k} differs"


def _episodes(model) -> list[tuple[float, int]]:
    return [(ep["r"], ep["l"]) for ep in model.ep_info_buffer]


# Each case: algorithm, env id, n_envs, constructor kwargs, timesteps.
ON_POLICY = dict(n_steps=16, seed=0)
OFF_POLICY = dict(learning_starts=64, batch_size=32, train_freq=4, gradient_steps=1, seed=0)
CASES = {
    "ppo-cartpole": (PPO, "CartPole-v1", 4, dict(ON_POLICY, batch_size=32, n_epochs=2), 256),
    "ppo-pendulum": (PPO, "Pendulum-v1", 4, dict(ON_POLICY, batch_size=32, n_epochs=2), 256),
    "a2c-cartpole": (A2C, "CartPole-v1", 4, dict(ON_POLICY, n_steps=8), 256),
    "a2c-pendulum": (A2C, "Pendulum-v1", 4, dict(ON_POLICY, n_steps=8), 256),
    "dqn-cartpole": (DQN, "CartPole-v1", 2, dict(OFF_POLICY, target_update_interval=50, buffer_size=1000), 300),
    "sac-pendulum": (SAC, "Pendulum-v1", 2, dict(OFF_POLICY, buffer_size=1000), 300),
    "td3-pendulum": (TD3, "Pendulum-v1", 2, dict(OFF_POLICY, buffer_size=1000), 300),
}


@pytest.mark.parametrize("case", list(CASES))
def test_algorithm_trains_as_on_dummy_vec_env(case):
    algo, env_id, n_envs, kwargs, steps = CASES[case]
    results = []
    for cls in (DummyVecEnv, ShmVecEnv):
        env = _vec(env_id, n_envs, cls)
        try:
            model = algo("MlpPolicy", env, policy_kwargs=_net(), **kwargs)
            model.learn(steps)
            assert model.num_timesteps >= steps
            results.append((_params(model), _episodes(model)))
        finally:
            env.close()
    (params_ref, eps_ref), (params, eps) = results
    if env_id == "CartPole-v1":
        assert len(eps_ref) > 3  # episodes ended (terminal observations were used)
    assert eps == eps_ref
    _assert_same_params(params, params_ref)


def test_her_with_a_goal_env_trains_as_on_dummy_vec_env():
    """HerReplayBuffer relabels goals with env_method("compute_reward", ..., indices=[0])."""
    results = []
    for cls in (DummyVecEnv, ShmVecEnv):
        env = _vec(sb3envs.make_point_goal_env, 2, cls)
        try:
            assert env.has_attr("compute_reward")
            model = SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer,
                        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
                        learning_starts=60, batch_size=32, buffer_size=2000, seed=0,
                        policy_kwargs=_net())
            model.learn(200)
            # The relabelled rewards came from the workers' compute_reward.
            achieved = np.zeros((3, 2), dtype=np.float32)
            desired = np.array([[0, 0], [1, 1], [0.1, 0]], dtype=np.float32)
            rewards = env.env_method("compute_reward", achieved, desired, [{}] * 3, indices=[0])[0]
            assert rewards.tolist() == [0.0, -1.0, 0.0]
            results.append((_params(model), _episodes(model)))
        finally:
            env.close()
    (params_ref, eps_ref), (params, eps) = results
    assert len(eps_ref) >= 10
    assert eps == eps_ref
    _assert_same_params(params, params_ref)


class _RolloutRecorder(BaseCallback):
    """Keeps a copy of every PPO rollout and of the weights after every update."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[tuple[np.ndarray, ...]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf = self.model.rollout_buffer
        self.rollouts.append((buf.observations.copy(), buf.actions.copy(), buf.rewards.copy(),
                              buf.episode_starts.copy(), buf.values.copy(), buf.log_probs.copy()))


def test_ppo_learning_curve_is_the_same_rollout_by_rollout():
    """The learning check: the same rollouts (observations, actions, rewards, values) each
    update, and the same weights at the end, with 16 envs over 2 workers."""
    recorded = []
    for cls in (DummyVecEnv, ShmVecEnv):
        env = _vec("CartPole-v1", 16, cls)
        try:
            model = PPO("MlpPolicy", env, n_steps=32, batch_size=128, n_epochs=3, seed=0, policy_kwargs=_net())
            recorder = _RolloutRecorder()
            model.learn(16 * 32 * 4, callback=recorder)
            recorded.append((recorder.rollouts, _params(model), _episodes(model)))
        finally:
            env.close()
    (rollouts_ref, params_ref, eps_ref), (rollouts, params, eps) = recorded
    assert len(rollouts_ref) == len(rollouts) == 4
    for k, (mine, ref) in enumerate(zip(rollouts, rollouts_ref)):
        for name, x, y in zip(("observations", "actions", "rewards", "episode_starts", "values", "log_probs"),
                              mine, ref):
            assert np.array_equal(x, y), f"rollout {k}: {name} differ"
    assert len(eps_ref) > 50
    assert eps == eps_ref
    _assert_same_params(params, params_ref)


@pytest.mark.parametrize("n_eval_envs", [1, 3])
def test_evaluate_policy_on_shm_vec_env_matches_dummy_vec_env(n_eval_envs):
    train = _vec("CartPole-v1", 2, DummyVecEnv)
    evals = [_vec("CartPole-v1", n_eval_envs, cls, seed=7) for cls in (DummyVecEnv, ShmVecEnv)]
    try:
        model = PPO("MlpPolicy", train, n_steps=16, batch_size=32, seed=0, policy_kwargs=_net())
        results = [evaluate_policy(model, env, n_eval_episodes=6, deterministic=True, return_episode_rewards=True)
                   for env in evals]
        assert results[1] == results[0]
        rewards, lengths = results[1]
        assert len(rewards) == 6 and all(n > 0 for n in lengths)
        # Not deterministic either: the same seeds still give the same episodes.
        mean_std = [evaluate_policy(model, env, n_eval_episodes=4) for env in evals]
        assert all(np.isfinite(m) for m, _ in mean_std)
    finally:
        close_all(train, *evals)


def test_eval_callback_with_a_shm_vec_env_eval_env(tmp_path):
    train = _vec("CartPole-v1", 4, ShmVecEnv)
    eval_env = _vec("CartPole-v1", 2, ShmVecEnv, seed=11)
    try:
        callback = EvalCallback(eval_env, n_eval_episodes=4, eval_freq=32, log_path=str(tmp_path),
                                best_model_save_path=str(tmp_path), deterministic=True, verbose=0)
        model = PPO("MlpPolicy", train, n_steps=32, batch_size=64, n_epochs=1, seed=0, policy_kwargs=_net())
        model.learn(4 * 32 * 3, callback=callback)
        assert callback.evaluations_timesteps == [128, 256, 384]
        assert np.asarray(callback.evaluations_results).shape == (3, 4)
        assert np.isfinite(callback.best_mean_reward)
        assert (tmp_path / "best_model.zip").exists()
        assert (tmp_path / "evaluations.npz").exists()
        best = PPO.load(tmp_path / "best_model.zip")
        rewards, _ = evaluate_policy(best, eval_env, n_eval_episodes=2, return_episode_rewards=True)
        assert len(rewards) == 2
    finally:
        close_all(train, eval_env)


@pytest.mark.parametrize("algo", [PPO, SAC], ids=["ppo", "sac"])
def test_save_load_and_set_env(tmp_path, algo):
    env_id = "CartPole-v1" if algo is PPO else "Pendulum-v1"
    kwargs = dict(n_steps=16, batch_size=32) if algo is PPO else dict(learning_starts=32, batch_size=32,
                                                                     buffer_size=500)
    env = _vec(env_id, 2, ShmVecEnv)
    other = _vec(env_id, 2, ShmVecEnv, seed=5)
    try:
        model = algo("MlpPolicy", env, seed=0, policy_kwargs=_net(), **kwargs)
        model.learn(64)
        model.save(tmp_path / "model")
        obs = other.reset()
        expected, _ = model.predict(obs, deterministic=True)

        loaded = algo.load(tmp_path / "model", env=other)
        assert loaded.get_env() is other
        actions, _ = loaded.predict(obs, deterministic=True)
        np.testing.assert_array_equal(actions, expected)
        loaded.learn(64, reset_num_timesteps=False)
        assert loaded.num_timesteps >= 128

        model.set_env(other)
        assert model.get_env() is other
        model.learn(64)
    finally:
        close_all(env, other)


def test_make_vec_env_with_a_callable_and_env_kwargs_under_spawn():
    """make_vec_env's own factories (closures over env_kwargs and Monitor) cross to spawned workers."""
    env = make_vec_env(sb3envs.make_frame_env, n_envs=2, seed=0, env_kwargs={"channels": 1, "max_steps": 5},
                       vec_env_cls=ShmVecEnv, vec_env_kwargs={"start_method": "spawn", "n_workers": 1})
    try:
        assert env.observation_space.shape == (84, 84, 1)
        env.reset()
        for t in range(5):
            _, _, dones, infos = env.step(np.zeros(2, dtype=np.int64))
            assert dones.all() == (t == 4)
        assert all(info["episode"]["l"] == 5 for info in infos)
    finally:
        env.close()
