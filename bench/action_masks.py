"""Steps/s of a MaskablePPO-style loop (action masks, then a step) per vec env backend.

Answers: what does reading ``env_method("action_masks")`` every step cost, and how much of
it does ShmVecEnv's shared-memory mask buffer save?  Backends: DummyVecEnv, SubprocVecEnv,
ShmVecEnv with masks through the pipe (``action_masks=False``), and ShmVecEnv with masks
in shared memory (the default for envs with an ``action_masks`` method).  The loop is what
sb3-contrib's MaskablePPO does while collecting a rollout, without the policy::

    masks = get_action_masks(venv)          # venv.env_method("action_masks")
    venv.step(<a random allowed action per env>)

``--ppo`` also times ``MaskablePPO.learn`` (policy and updates included) per backend.
Backends are measured in alternating rounds; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

from shmvec import ShmVecEnv
from shmvec.bench import machine


class MaskedChainEnv(gym.Env):
    """A cheap env (about CartPole's cost) with ``n`` actions of which a random subset is allowed."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n,), dtype=np.float32)
        self.action_space = spaces.Discrete(n)
        self._mask = np.ones(n, dtype=bool)
        self._t = 0

    def _obs(self) -> np.ndarray:
        self._mask = self.np_random.random(self.n) < 0.5
        self._mask[self._t % self.n] = True
        return self._mask.astype(np.float32)

    def action_masks(self) -> np.ndarray:
        return self._mask

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        reward = 1.0 if self._mask[int(action)] else -1.0
        return self._obs(), reward, self._t >= 100, False, {}


def make_env(n: int) -> gym.Env:
    return Monitor(MaskedChainEnv(n))


BACKENDS = {
    "DummyVecEnv": lambda fns: DummyVecEnv(fns),
    "SubprocVecEnv": lambda fns: SubprocVecEnv(fns),
    "ShmVecEnv (masks via pipe)": lambda fns: ShmVecEnv(fns, action_masks=False),
    "ShmVecEnv (masks in shm)": lambda fns: ShmVecEnv(fns),
}


def loop_sps(venv, seconds: float, rng: np.random.Generator) -> float:
    from sb3_contrib.common.maskable.utils import get_action_masks

    n = venv.num_envs
    steps = 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        for _ in range(50):
            masks = get_action_masks(venv)
            actions = (rng.random(masks.shape) * masks).argmax(axis=1)  # a random allowed action
            venv.step(actions)
        steps += 50 * n
    return steps / (time.perf_counter() - start)


def ppo_sps(venv, steps: int) -> float:
    from sb3_contrib import MaskablePPO

    model = MaskablePPO("MlpPolicy", venv, n_steps=64, batch_size=256, n_epochs=1, seed=0, verbose=0)
    start = time.perf_counter()
    model.learn(steps)
    return model.num_timesteps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--n-actions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0, help="per backend per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ppo", type=int, default=0, help="also time MaskablePPO.learn for this many steps")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"machine: {machine()}; {args.rounds} rounds of {args.seconds} s per backend, alternating")
    for n_envs in args.n_envs:
        fns = [functools.partial(make_env, args.n_actions)] * n_envs
        venvs = {name: BACKENDS[name](fns) for name in args.backends}
        try:
            for venv in venvs.values():
                venv.seed(0)
                venv.reset()
            rng = np.random.default_rng(0)
            sps: dict[str, list[float]] = {name: [] for name in venvs}
            for _ in range(args.rounds):
                for name, venv in venvs.items():
                    sps[name].append(loop_sps(venv, args.seconds, rng))
            ref = statistics.median(sps[args.backends[0]])
            print(f"\nn_envs={n_envs}: masks + step loop (median of rounds)")
            for name in venvs:
                med = statistics.median(sps[name])
                print(f"  {name:28s} {med:10,.0f} steps/s  {med / ref:5.2f}x {args.backends[0]}")
            if args.ppo:
                print(f"n_envs={n_envs}: MaskablePPO.learn({args.ppo})")
                for name, venv in venvs.items():
                    print(f"  {name:28s} {ppo_sps(venv, args.ppo):10,.0f} steps/s")
        finally:
            for venv in venvs.values():
                venv.close()


if __name__ == "__main__":
    main()
