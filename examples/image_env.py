"""PPO with a CNN on an image env through ShmVecEnv: an Atari game, or an 84x84 env of our own.

With ale-py and OpenCV installed (``pip install -c constraints.txt -e ".[atari]"``; ale-py >= 0.9 ships the
ROMs), it trains on Pong with SB3's usual Atari set-up: ``make_atari_env`` (AtariWrapper:
no-op reset, frame skip 4, 84x84 grayscale, episodic life, reward clipping) and a stack of 4
frames.  Without them, or with ``--env frames``, it trains on ``SquareEnv`` below, a
84x84 frame env that needs nothing but numpy::

    python examples/image_env.py                      # Pong if ale-py is there
    python examples/image_env.py --env frames --steps 2048

Frames are the case shared memory is made for: each step moves n_envs x 84 x 84 bytes per
frame from the workers to the learner without a pickle or a pipe.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import VecFrameStack

from shmvec import ShmVecEnv


class SquareEnv(gym.Env):
    """84x84 grayscale frames with a bright square; the agent earns +1 a step on the right half."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, render_mode: str | None = None) -> None:
        self.observation_space = spaces.Box(0, 255, shape=(84, 84, 1), dtype=np.uint8)
        self.action_space = spaces.Discrete(3)  # left, stay, right
        self.render_mode = render_mode
        self._x = self._y = 42

    def _frame(self) -> np.ndarray:
        frame = np.zeros((84, 84, 1), dtype=np.uint8)
        frame[self._y - 4:self._y + 4, self._x - 4:self._x + 4] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._x, self._y = (int(v) for v in self.np_random.integers(8, 76, size=2))
        return self._frame(), {}

    def step(self, action):
        self._x = int(np.clip(self._x + (int(action) - 1) * 4, 4, 80))
        return self._frame(), float(self._x >= 42), False, False, {}

    def render(self):
        return np.repeat(self._frame(), 3, axis=2)


def make_square_env() -> gym.Env:
    return gym.wrappers.TimeLimit(SquareEnv(), max_episode_steps=100)


def have_atari() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("ale_py", "cv2"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=["auto", "atari", "frames"], default="auto")
    parser.add_argument("--game", default="PongNoFrameskip-v4")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1024,
                        help="timesteps; a CNN forward pass is the costly part on a CPU-only machine")
    parser.add_argument("--n-steps", type=int, default=32)
    args = parser.parse_args()
    atari = args.env == "atari" or (args.env == "auto" and have_atari())
    if args.env == "atari" and not have_atari():
        raise SystemExit("--env atari needs ale-py and OpenCV: pip install 'shmvec[atari]'")

    start = time.perf_counter()
    if atari:
        # "ale_py:" makes gym.make import ale_py (which registers the games) in each worker.
        env = make_atari_env(f"ale_py:{args.game}", n_envs=args.n_envs, seed=0, vec_env_cls=ShmVecEnv)
        env = VecFrameStack(env, n_stack=4)
        name = f"{args.game} (AtariWrapper, 4 stacked frames)"
    else:
        env = make_vec_env(make_square_env, n_envs=args.n_envs, seed=0, vec_env_cls=ShmVecEnv)
        name = "SquareEnv (84x84 frames of our own; ale-py not used)"
    print(f"{name}: {args.n_envs} envs in {env.unwrapped.n_workers} workers, observations {env.observation_space.shape} {env.observation_space.dtype}, "
          f"built in {time.perf_counter() - start:.1f} s")
    try:
        model = PPO("CnnPolicy", env, n_steps=args.n_steps, batch_size=args.n_envs * args.n_steps // 4,
                    n_epochs=2, learning_rate=2.5e-4, seed=0, verbose=0)
        start = time.perf_counter()
        model.learn(args.steps)
        elapsed = time.perf_counter() - start
        episodes = [ep["r"] for ep in model.ep_info_buffer]
        print(f"PPO CnnPolicy: {model.num_timesteps} steps in {elapsed:.1f} s ({model.num_timesteps / elapsed:,.0f} "
              f"steps/s, learner updates included)")
        if episodes:
            print(f"{len(episodes)} episodes finished, mean reward {np.mean(episodes):.2f}")
        else:
            print("no episode finished yet (Pong episodes last thousands of steps); rewards so far come per point")
    finally:
        env.close()


if __name__ == "__main__":
    main()
