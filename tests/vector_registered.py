"""Registers an env when imported (``make_vec("vector_registered:ShmvecRegistered-v0")``)."""

import gymnasium as gym

if "ShmvecRegistered-v0" not in gym.registry:
    gym.register("ShmvecRegistered-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                 max_episode_steps=50)
