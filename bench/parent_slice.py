"""Would the parent stepping a slice of the envs itself win?  An upper sketch, beside DummyVecEnv.

Answers: if the parent stepped part of the envs in its own process while one worker stepped the
rest, would a loop run faster than shmvec's defaults?  The sketch: a ``DummyVecEnv`` of a share of
the envs, stepped while a one-worker ``ShmVecEnv`` steps the others (``step_async``, the parent's
slice, ``step_wait``), the results joined; ``ShmVecEnv`` with its defaults beside it, both against
``DummyVecEnv`` in alternating rounds (the median of per-round ratios)::

    python bench/parent_slice.py --n-envs 8 64 --situation policy
    python bench/parent_slice.py --n-envs 8 64 --situation random

``policy``: SB3's policy picks the actions (torch at its default threads for ``DummyVecEnv``, one
for the others, as ``parent_threads`` sets it); ``random``: random actions.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from shmvec._bench.envs import EnvFactory
from shmvec._bench.training import PolicyLoop
from shmvec.bench import machine


class ParentSlice:
    """``share`` of the envs stepped in the parent (a DummyVecEnv), the rest by one shmvec worker."""

    def __init__(self, env: str, n_envs: int, share: float) -> None:
        from stable_baselines3.common.vec_env import DummyVecEnv

        from shmvec import ShmVecEnv

        self.k = k = max(1, min(n_envs - 1, round(n_envs * share)))
        self.own = DummyVecEnv([EnvFactory(env)] * k)
        self.worker = ShmVecEnv([EnvFactory(env)] * (n_envs - k), start_method="fork", n_workers=1)
        self.num_envs, self.observation_space, self.action_space = n_envs, self.own.observation_space, self.own.action_space

    def reset(self):
        return np.concatenate([self.own.reset(), self.worker.reset()])

    def step(self, actions):
        self.worker.step_async(actions[self.k:])
        o1, r1, d1, i1 = self.own.step(actions[:self.k])
        o2, r2, d2, i2 = self.worker.step_wait()
        return np.concatenate([o1, o2]), np.concatenate([r1, r2]), np.concatenate([d1, d2]), i1 + i2

    def close(self) -> None:
        self.worker.close()
        self.own.close()


class RandomLoop:
    """Random actions drawn beforehand, as ``PolicyLoop``'s interface."""

    def __init__(self, venv, n_envs: int) -> None:
        venv.action_space.seed(0)
        self.actions = [np.array([venv.action_space.sample() for _ in range(n_envs)]) for _ in range(64)]
        self.step, self.num_envs = venv.step, n_envs

    def chunk(self, seconds: float) -> float:
        n, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            self.step(self.actions[n % 64])
            n += 1
        return n * self.num_envs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--situation", choices=["policy", "random"], default="policy")
    parser.add_argument("--share", type=float, default=0.5, help="the parent's share of the envs")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv

    m = machine()
    print(f"{m['cores']} cores ({m['cpu']}); {args.env}, {args.situation}; x DummyVecEnv, median of "
          f"{args.rounds} alternating rounds")
    default_threads = torch.get_num_threads()
    for n_envs in args.n_envs:
        venvs = {}
        try:
            venvs["DummyVecEnv"] = DummyVecEnv([EnvFactory(args.env)] * n_envs)
            venvs["ShmVecEnv"] = ShmVecEnv([EnvFactory(args.env)] * n_envs, start_method="fork")
            venvs["parent slice"] = ParentSlice(args.env, n_envs, args.share)
            loops = {}
            for name, v in venvs.items():
                obs = v.reset()
                loops[name] = (PolicyLoop("DummyVecEnv", v.step, obs, n_envs, v.observation_space, v.action_space,
                                          default_threads if name == "DummyVecEnv" else 1)
                               if args.situation == "policy" else RandomLoop(v, n_envs))
            rates = {name: [] for name in venvs}
            for _ in range(args.rounds):
                for name, loop in loops.items():
                    rates[name].append(loop.chunk(args.seconds))
        finally:
            for v in venvs.values():
                v.close()
            torch.set_num_threads(default_threads)
        ref = rates["DummyVecEnv"]
        cells = [f"{name} {np.median([a / b for a, b in zip(r, ref)]):.2f}x" for name, r in rates.items()
                 if name != "DummyVecEnv"]
        print(f"n_envs {n_envs:4d}: DummyVecEnv {np.median(ref):9,.0f} steps/s | " + " | ".join(cells))


if __name__ == "__main__":
    main()
