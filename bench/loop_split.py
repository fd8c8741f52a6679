"""Where a step of the user's loop goes: the policy's time and the step's, apart, per variant.

Answers: with SB3's policy in the loop, does a variant of ShmVecEnv slow the parent's own work
(the policy), the step, or both?  torch runs one thread in every backend here (the cores' share is
what is measured, not torch's pool), ``DummyVecEnv`` is the reference, and backends alternate in
rounds within one run; the table gives each backend's median over the rounds::

    python bench/loop_split.py --n-envs 8 --variants '{"2 workers, spread": {"cpu_affinity": false}, "1 worker": {"n_workers": 1}, "default": {}}'
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from shmvec._bench.envs import EnvFactory
from shmvec._bench.training import PolicyLoop
from shmvec.bench import machine


def split(loop: PolicyLoop, step, seconds: float) -> tuple[float, float, float]:
    """Steps/s, and the mean microseconds of the policy and of the step, over ``seconds``."""
    obs, clock = loop.obs, time.perf_counter
    policy_s = step_s = 0.0
    n = 0
    start = clock()
    end = start + seconds
    while True:
        a = clock()
        actions = loop.act(obs)
        b = clock()
        obs = step(actions)[0]
        c = clock()
        policy_s += b - a
        step_s += c - b
        n += 1
        if c >= end:
            break
    loop.obs = obs
    return n * loop.num_envs / (c - start), policy_s / n * 1e6, step_s / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8])
    parser.add_argument("--variants", default='{"default": {}}', help="JSON: name -> ShmVecEnv keyword arguments")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv

    variants = json.loads(args.variants)
    torch.set_num_threads(1)
    m = machine()
    print(f"{m['cores']} cores ({m['cpu']}); {args.env}, SB3's policy, torch at 1 thread everywhere; "
          f"median of {args.rounds} alternating rounds")
    for n_envs in args.n_envs:
        venvs = {"DummyVecEnv": DummyVecEnv([EnvFactory(args.env)] * n_envs)}
        try:
            for name, kwargs in variants.items():
                venvs[name] = ShmVecEnv([EnvFactory(args.env)] * n_envs, start_method="fork", **kwargs)
            loops = {name: PolicyLoop("DummyVecEnv", v.step, v.reset(), n_envs, v.observation_space, v.action_space, 1)
                     for name, v in venvs.items()}
            rows = {name: [] for name in venvs}
            for _ in range(args.rounds):
                for name, venv in venvs.items():
                    rows[name].append(split(loops[name], venv.step, args.seconds))
        finally:
            for venv in venvs.values():
                venv.close()
        ref = float(np.median([r[0] for r in rows["DummyVecEnv"]]))
        for name, r in rows.items():
            sps, pol, stp = (float(np.median(col)) for col in zip(*r))
            print(f"n_envs {n_envs:4d}: {name:24s} {sps:9,.0f} steps/s ({sps / ref:.2f}x)  policy {pol:6.1f} us  "
                  f"step {stp:6.1f} us")


if __name__ == "__main__":
    main()
