"""How much of a second core does this machine really give?  (one question, one script)

Runs a bare CartPole-v1 loop in one process, then in two processes at once, alternately, and
prints each one's steps/s.  On a machine with two free cores the two processes together reach
2x one; on a shared VM they may reach less (host contention), and no vec env can beat that
ceiling.  ``python bench/parallel_ceiling.py [--seconds 3] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import gymnasium as gym
import numpy as np


def _loop(queue: mp.Queue, seconds: float) -> None:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, 1000)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        n += len(actions)
    queue.put(n / (time.perf_counter() - t0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ctx = mp.get_context("fork")
    for _ in range(args.rounds):
        results = {}
        for k in (1, 2):
            queue = ctx.Queue()
            procs = [ctx.Process(target=_loop, args=(queue, args.seconds)) for _ in range(k)]
            for p in procs:
                p.start()
            rates = [queue.get() for _ in procs]
            for p in procs:
                p.join()
            results[k] = sum(rates)
            print(f"{k} process(es): " + ", ".join(f"{r:,.0f}" for r in rates) + f" steps/s; total {sum(rates):,.0f}")
        print(f"two processes give {results[2] / results[1]:.2f}x one")


if __name__ == "__main__":
    main()
