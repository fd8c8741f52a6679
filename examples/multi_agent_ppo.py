"""PPO on a PettingZoo env through ShmMultiAgentVecEnv: one policy shared by every agent.

MPE's ``simple_spread_v3`` (from mpe2): 3 agents learn to cover 3 landmarks without colliding.
Each agent is one SB3 row (``num_envs = n_envs x 3``), so ``PPO("MlpPolicy", venv)`` trains
one policy on every agent's experience (parameter sharing). The script prints the mean episode
reward per agent of the policy before and after training::

    python examples/multi_agent_ppo.py                    # 8 envs (24 rows), 300,000 agent steps
    python examples/multi_agent_ppo.py --steps 50000      # a shorter run

Needs ``pip install -c constraints.txt -e ".[multiagent]" mpe2``.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch
from mpe2 import simple_spread_v3
from stable_baselines3 import PPO

from shmvec import ShmMultiAgentVecEnv


def mean_episode_reward(model: PPO, venv: ShmMultiAgentVecEnv, episodes: int) -> float:
    """Mean return per agent over ``episodes`` episodes of every env, the policy acting deterministically."""
    venv.seed(12345)  # the same starting positions before and after training
    obs = venv.reset()
    returns = np.zeros(venv.num_envs)
    finished: list[float] = []
    while len(finished) < episodes * venv.num_envs:
        actions, _ = model.predict(obs, deterministic=True)
        obs, rewards, dones, _ = venv.step(actions)
        returns += rewards
        finished += returns[dones].tolist()
        returns[dones] = 0.0
    return float(np.mean(finished))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=8, help="simple_spread envs (3 rows each)")
    parser.add_argument("--steps", type=int, default=300_000, help="agent steps (rows x vec steps) of training")
    parser.add_argument("--n-steps", type=int, default=128, help="PPO steps per row per rollout")
    parser.add_argument("--n-workers", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--eval-episodes", type=int, default=4, help="episodes per env of each evaluation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    # A picklable factory (no lambda), so that it works under every start method.
    make = functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=25, continuous_actions=False)
    venv = ShmMultiAgentVecEnv([make] * args.n_envs, n_workers=args.n_workers)
    try:
        print(f"{args.n_envs} x simple_spread_v3 (agents {', '.join(venv.possible_agents)}): "
              f"{venv.num_envs} rows, observation {venv.observation_space.shape}, action {venv.action_space}")
        model = PPO("MlpPolicy", venv, n_steps=args.n_steps, batch_size=venv.num_envs * args.n_steps // 4,
                    n_epochs=5, learning_rate=1e-3, gamma=0.95, ent_coef=0.01, seed=args.seed, verbose=0)
        before = mean_episode_reward(model, venv, args.eval_episodes)
        print(f"before training: mean episode reward per agent {before:.2f}")
        start = time.perf_counter()
        model.learn(args.steps)
        elapsed = time.perf_counter() - start
        after = mean_episode_reward(model, venv, args.eval_episodes)
        print(f"after {model.num_timesteps} agent steps ({elapsed:.1f} s): mean episode reward per agent {after:.2f}")
        print(f"improvement: {after - before:+.2f}")
    finally:
        venv.close()


if __name__ == "__main__":
    main()
