"""A custom env registered with ``gymnasium.register``, built from a factory in ``spawn`` workers.

Under ``spawn`` (the only start method on macOS and Windows, and the safe one when the parent
process runs threads, e.g. CUDA or a data loader) every worker is a fresh interpreter: it
knows only what it imports.  Two things make a custom env work there:

1. The env class and the factory live at module level, importable by the worker.  Here they
   are in this script: multiprocessing runs the script's module-level code again in each
   worker (as ``__mp_main__``), which is why everything that starts processes sits under
   ``if __name__ == "__main__":`` at the bottom.
2. The registration happens where the worker will see it.  ``register_grid_walk()`` is
   idempotent and the factory calls it before ``gymnasium.make``, so the id resolves
   whether or not the worker re-ran this module (a factory imported from a package of your
   own works the same way; so does an ``entry_point="my_package.envs:GridWalkEnv"`` string).

``shmvec.make_env(ENV_ID, size=8)`` is the shorter way (see the README): it resolves the
registration in the parent and sends the entry point, kwargs and wrappers to the workers as
plain data, so the workers need no registration of their own.  This script shows what it
saves you.

    python examples/custom_registered_env_spawn.py --steps 8192
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from shmvec import ShmVecEnv

ENV_ID = "GridWalk-v0"


class GridWalkEnv(gym.Env):
    """Walk on a line of ``size`` cells to the goal at the right end: -0.01 a step, +1 at the goal."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.observation_space = spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)  # left, right
        self._pos = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._pos / (self.size - 1), 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos = int(self.np_random.integers(0, self.size - 1))
        return self._obs(), {"pid": os.getpid()}

    def step(self, action):
        self._pos = int(np.clip(self._pos + (1 if int(action) == 1 else -1), 0, self.size - 1))
        at_goal = self._pos == self.size - 1
        return self._obs(), 1.0 if at_goal else -0.01, at_goal, False, {}


def register_grid_walk() -> None:
    """Registers GridWalk-v0 once per process (gymnasium warns when an id is registered twice)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point=GridWalkEnv, max_episode_steps=60)


def make_grid_walk(size: int) -> gym.Env:
    """The factory each worker calls: registers (if needed), then builds through gymnasium.make."""
    register_grid_walk()
    return Monitor(gym.make(ENV_ID, size=size))


register_grid_walk()  # for gymnasium.make in this process, too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8192)
    parser.add_argument("--size", type=int, default=8)
    args = parser.parse_args()

    start = time.perf_counter()
    env_fns = [functools.partial(make_grid_walk, args.size)] * args.n_envs
    env = ShmVecEnv(env_fns, start_method="spawn")
    try:
        env.seed(0)
        env.reset()
        pids = sorted({info["pid"] for info in env.reset_infos})
        print(f"{args.n_envs} x {env.get_attr('spec')[0].id} (size {env.get_attr('size')[0]}) in {env.n_workers} "
              f"spawned workers (pids {pids}, this process {os.getpid()}), started in "
              f"{time.perf_counter() - start:.1f} s")
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=256, n_epochs=4, learning_rate=3e-3, seed=0, verbose=0)
        before, _ = evaluate_policy(model, env, n_eval_episodes=2 * args.n_envs, deterministic=True)
        start = time.perf_counter()
        model.learn(args.steps)
        elapsed = time.perf_counter() - start
        after, _ = evaluate_policy(model, env, n_eval_episodes=2 * args.n_envs, deterministic=True)
        print(f"PPO, {model.num_timesteps} steps in {elapsed:.1f} s: mean episode reward {before:.2f} before, "
              f"{after:.2f} after (the best possible is about {1 - 0.01 * (args.size / 2 - 1):.2f})")
    finally:
        env.close()


if __name__ == "__main__":
    main()
