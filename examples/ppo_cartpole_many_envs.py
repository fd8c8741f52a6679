"""PPO on CartPole-v1 with many envs: ShmVecEnv against DummyVecEnv, same seeds, same settings.

With the same seeds both collect exactly the same rollouts, so PPO learns exactly the same
policy; the script checks that and prints the wall-clock time of each run::

    python examples/ppo_cartpole_many_envs.py                 # 64 envs, 131072 steps
    python examples/ppo_cartpole_many_envs.py --n-envs 256 --steps 262144

PPO spends part of its time in its own updates, which no vec env speeds up; the stepping
share shrinks with a larger ``--n-epochs`` and grows with more envs and a smaller network.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv


def train(vec_env_cls, args: argparse.Namespace) -> tuple[float, PPO]:
    kwargs = {"n_workers": args.n_workers} if vec_env_cls is ShmVecEnv else None
    env = make_vec_env("CartPole-v1", n_envs=args.n_envs, seed=args.seed, vec_env_cls=vec_env_cls,
                       vec_env_kwargs=kwargs)
    try:
        model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.n_envs * args.n_steps // 4,
                    n_epochs=args.n_epochs, learning_rate=1e-3, seed=args.seed,
                    policy_kwargs={"net_arch": [64, 64]}, verbose=0)
        start = time.perf_counter()
        model.learn(args.steps)
        elapsed = time.perf_counter() - start
    finally:
        env.close()
    return elapsed, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=131_072, help="total timesteps of each run")
    parser.add_argument("--n-steps", type=int, default=32, help="PPO steps per env per rollout")
    parser.add_argument("--n-epochs", type=int, default=2)
    parser.add_argument("--n-workers", type=int, default=None, help="ShmVecEnv workers (default: one per core)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same arithmetic in both runs, and a core left for the workers

    results = {}
    for cls in (DummyVecEnv, ShmVecEnv):
        elapsed, model = train(cls, args)
        episodes = [ep["r"] for ep in model.ep_info_buffer]
        results[cls.__name__] = (elapsed, model, episodes)
        print(f"{cls.__name__:12s} {args.n_envs} envs, {model.num_timesteps} steps: {elapsed:7.2f} s "
              f"({model.num_timesteps / elapsed:9,.0f} steps/s); mean reward of the last "
              f"{len(episodes)} episodes {np.mean(episodes):6.1f}")

    (t_dummy, m_dummy, ep_dummy), (t_shm, m_shm, ep_shm) = results["DummyVecEnv"], results["ShmVecEnv"]
    same = ep_dummy == ep_shm and all(
        torch.equal(a, b) for a, b in zip(m_dummy.policy.parameters(), m_shm.policy.parameters()))
    print(f"same episodes and weights: {same}")
    print(f"ShmVecEnv took {t_shm / t_dummy:.2f}x the time of DummyVecEnv ({t_dummy / t_shm:.2f}x as fast)")
    eval_env = make_vec_env("CartPole-v1", n_envs=4, seed=1000)
    try:
        mean, std = evaluate_policy(m_shm, eval_env, n_eval_episodes=8, deterministic=True)
    finally:
        eval_env.close()
    print(f"the trained policy: {mean:.1f} +- {std:.1f} reward over 8 evaluation episodes")
    if not same:
        raise SystemExit("the two runs differ: please report this as a shmvec bug")


if __name__ == "__main__":
    main()
