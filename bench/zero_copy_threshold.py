"""ShmVecEnv with and without ``zero_copy``, side by side: where handing out the blocks beats the copy.

For each env and ``n_envs``, two ShmVecEnvs (``zero_copy=True`` and ``zero_copy=False``, same
envs, same workers) step in alternating rounds, the caller dropping each observation before the
next step as SB3's algorithms do (two blocks take turns).  It prints steps/s of each, their ratio
per round and its median, and the bytes one step's observations weigh: the default
(``zero_copy=None``) turns it on from ``shmvec._leases.AUTO_MIN_BYTES``::

    python bench/zero_copy_threshold.py
    python bench/zero_copy_threshold.py --envs CartPole-v1 image-16x16x4 --n-envs 8 64 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from shmvec import ShmVecEnv
from shmvec._bench.envs import EnvFactory
from shmvec._bench.session import machine
from shmvec._leases import AUTO_MIN_BYTES, obs_batch_bytes

DEFAULT_ENVS = ["CartPole-v1", "dict-obs", "image-16x16x4", "image-32x32x4", "image-84x84x4"]


def _steps_per_s(env: ShmVecEnv, actions: list, seconds: float) -> float:
    n, k = 0, 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        for _ in range(50):
            obs, _, _, _ = env.step(actions[k % len(actions)])
            k += 1
        n += 50
    return n * env.num_envs / (time.perf_counter() - start)


def measure(name: str, n_envs: int, rounds: int, seconds: float) -> dict:
    envs = {zc: ShmVecEnv([EnvFactory(name)] * n_envs, start_method="fork", zero_copy=zc) for zc in (True, False)}
    try:
        space = envs[True].action_space
        space.seed(0)
        actions = [np.stack([np.asarray(space.sample()) for _ in range(n_envs)]) for _ in range(64)]
        for env in envs.values():
            env.reset()
            _steps_per_s(env, actions, 0.2)  # warm up
        on, off = [], []
        for _ in range(rounds):
            on.append(_steps_per_s(envs[True], actions, seconds / rounds))
            off.append(_steps_per_s(envs[False], actions, seconds / rounds))
        ratios = [a / b for a, b in zip(on, off)]
        return {"env": name, "n_envs": n_envs, "obs_bytes": obs_batch_bytes(envs[True].observation_space, n_envs),
                "zero_copy": statistics.median(on), "copy": statistics.median(off),
                "ratios": ratios, "median": statistics.median(ratios)}
    finally:
        for env in envs.values():
            env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=DEFAULT_ENVS)
    parser.add_argument("--n-envs", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0, help="per vec env and point, split into the rounds")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    m = machine()
    where = f"{m['cores']} cores ({m['cpu']}), Python {m['python']}"
    print(f"zero_copy on and off: {where}")
    print(f"zero_copy=None turns it on from {AUTO_MIN_BYTES} bytes of observations a step\n")
    print(f"{'env':16} {'n_envs':>6} {'obs bytes':>10} {'zero_copy':>11} {'copy':>11}  on/off (median; rounds)")
    results = []
    for name in args.envs:
        for n in args.n_envs:
            r = measure(name, n, args.rounds, args.seconds)
            results.append(r)
            print(f"{name:16} {n:6d} {r['obs_bytes']:10d} {r['zero_copy']:11,.0f} {r['copy']:11,.0f}  "
                  f"{r['median']:.2f} ({' '.join(f'{x:.2f}' for x in r['ratios'])})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": m, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
