"""A CleanRL-style PPO (single file, discrete actions) on shmvec's Gymnasium ``ShmVectorEnv``.

The loop follows CleanRL's ``ppo.py``; the only change a CleanRL user makes is the env
construction (``shmvec.make_vec`` where CleanRL builds a ``gym.vector.SyncVectorEnv``).
It uses Gymnasium's default NEXT_STEP autoreset: the step after an episode ends only resets
that env (its action is ignored), so that transition is masked out of the loss, and a
truncated episode is bootstrapped from the value of its last observation.

    python examples/cleanrl_ppo.py --total-timesteps 60000       # mean return ~250 here (from ~20)
    python examples/cleanrl_ppo.py --total-timesteps 2048 --num-steps 64   # a smoke run
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

import shmvec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    p.add_argument("--n-workers", type=int, default=None, help="shmvec worker processes (default: cores)")
    p.add_argument("--start-method", default=None)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    return p.parse_args(argv)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def advantages_and_returns(args: argparse.Namespace, rewards: torch.Tensor, values: torch.Tensor,
                           next_values: torch.Tensor, terminated: torch.Tensor, ended: torch.Tensor,
                           valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over one rollout ((num_steps, num_envs) each); a reset transition (valid 0) follows every
    end and is cut off."""
    with torch.no_grad():
        advantages = torch.zeros_like(rewards)
        lastgaelam = torch.zeros(rewards.shape[1])
        for t in reversed(range(rewards.shape[0])):
            delta = rewards[t] + args.gamma * next_values[t] * (1.0 - terminated[t]) - values[t]
            lastgaelam = delta + args.gamma * args.gae_lambda * (1.0 - ended[t]) * lastgaelam
            lastgaelam = lastgaelam * valid[t]
            advantages[t] = lastgaelam
    return advantages, advantages + values


def update(args: argparse.Namespace, agent: Agent, optimizer: torch.optim.Optimizer, b_obs: torch.Tensor,
           actions: torch.Tensor, logprobs: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor,
           valid: torch.Tensor) -> torch.Tensor:
    """PPO's update epochs over one rollout (the reset transitions weigh 0); returns the last loss."""
    b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
    b_advantages, b_returns, b_valid = advantages.reshape(-1), returns.reshape(-1), valid.reshape(-1)
    batch_size = b_valid.shape[0]
    minibatch_size = batch_size // args.num_minibatches
    b_inds = np.arange(batch_size)
    for _ in range(args.update_epochs):
        np.random.shuffle(b_inds)
        for lo in range(0, batch_size, minibatch_size):
            mb = b_inds[lo:lo + minibatch_size]
            w = b_valid[mb]
            n = w.sum().clamp(min=1.0)
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
            ratio = (newlogprob - b_logprobs[mb]).exp()
            mb_adv = b_advantages[mb]
            mean = (mb_adv * w).sum() / n
            std = (((mb_adv - mean) ** 2 * w).sum() / n).sqrt()
            mb_adv = (mb_adv - mean) / (std + 1e-8)
            pg_loss = (torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)) * w).sum() / n
            v_loss = 0.5 * (((newvalue.view(-1) - b_returns[mb]) ** 2) * w).sum() / n
            entropy_loss = (entropy * w).sum() / n
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    return loss


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    batch_size = args.num_envs * args.num_steps
    num_iterations = max(1, args.total_timesteps // batch_size)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    envs = shmvec.make_vec(
        args.env_id, num_envs=args.num_envs,
        vector_kwargs={"n_workers": args.n_workers, "start_method": args.start_method},
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    try:
        assert isinstance(envs.single_action_space, gym.spaces.Discrete), "this PPO handles discrete actions"
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        agent = Agent(obs_dim, int(envs.single_action_space.n))
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

        obs = torch.zeros((args.num_steps, args.num_envs, obs_dim))
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
        logprobs = torch.zeros((args.num_steps, args.num_envs))
        rewards = torch.zeros((args.num_steps, args.num_envs))
        terminated = torch.zeros((args.num_steps, args.num_envs))
        ended = torch.zeros((args.num_steps, args.num_envs))   # terminated or truncated
        valid = torch.zeros((args.num_steps, args.num_envs))   # 0: a NEXT_STEP reset transition
        values = torch.zeros((args.num_steps, args.num_envs))
        next_values = torch.zeros((args.num_steps, args.num_envs))

        next_obs_np, _ = envs.reset(seed=args.seed)
        next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
        prev_ended = torch.zeros(args.num_envs)
        returns_seen: list[float] = []
        start = time.perf_counter()
        global_step = 0
        stats: dict[str, float] = {}
        for iteration in range(1, num_iterations + 1):
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                valid[step] = 1.0 - prev_ended
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob
                next_obs_np, reward, term, trunc, infos = envs.step(action.numpy())
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
                rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
                terminated[step] = torch.as_tensor(term, dtype=torch.float32)
                prev_ended = torch.as_tensor(term | trunc, dtype=torch.float32)
                ended[step] = prev_ended
                with torch.no_grad():  # V(s_{t+1}); with NEXT_STEP it is the episode's last obs when it ended
                    next_values[step] = agent.get_value(next_obs).flatten()
                if "episode" in infos:
                    returns_seen.extend(infos["episode"]["r"][infos["_episode"]].tolist())

            advantages, returns = advantages_and_returns(args, rewards, values, next_values, terminated, ended, valid)
            loss = update(args, agent, optimizer, obs.reshape((-1, obs_dim)), actions, logprobs, advantages, returns,
                          valid)

            recent = returns_seen[-20:]
            stats = {
                "global_step": global_step,
                "episodes": len(returns_seen),
                "mean_return": float(np.mean(recent)) if recent else float("nan"),
                "sps": global_step / (time.perf_counter() - start),
                "loss": float(loss),
            }
            print(f"iteration {iteration}/{num_iterations} step={global_step} episodes={stats['episodes']} "
                  f"mean_return(last 20)={stats['mean_return']:.1f} loss={stats['loss']:.3f} sps={stats['sps']:.0f}",
                  flush=True)
    finally:
        envs.close()
    return stats


if __name__ == "__main__":
    main()
