"""What a policy's forward pass costs after the gap a step leaves on the parent's core.

Answers: why does the parent's policy run slower beside a vec env's workers than in a
one-process loop, even with torch at one thread?  Times the forward pass of the CleanRL agent
(64 CartPole observations, torch at one thread, this process pinned to one core) after each of
these gaps, ``--gap-us`` long, in alternating rounds::

    python bench/cold_core.py
    python bench/cold_core.py --gap-us 100 300 1000

- ``none``: forward passes back to back;
- ``spin``: this process spins through the gap (its core stays busy with it);
- ``python``: this process runs Python through the gap (as ``SyncVectorEnv`` steps its envs);
- ``sleep``: this process sleeps through the gap with nothing else on its core (the core halts,
  as the parent's does when it waits on the futex with its workers on other cores);
- ``other``: this process sleeps while another process runs Python on its core for the gap (as a
  worker that shares the parent's core steps its envs).

A diagnostic of the machine, not of shmvec: docs/design.md ("Placement") tells what it means for
where the workers run.
"""

from __future__ import annotations

import argparse
import os
import time
from multiprocessing import get_context

import gymnasium as gym
import numpy as np
import torch

from shmvec._bench.training import POLICY_SEED, CleanRLAgent
from shmvec.bench import machine


def _other(core: int, gap_s, go, done) -> None:
    """On ``core``: each time ``go`` is set, runs Python for ``gap_s.value`` seconds (below 0: returns),
    then sets ``done``."""
    os.sched_setaffinity(0, {core})
    table: dict[int, float] = {}
    while True:
        go.wait()
        go.clear()
        gap = gap_s.value
        if gap < 0:
            return
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            for i in range(50):
                table[i] = i * 1.5
        done.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap-us", type=float, nargs="+", default=[300.0])
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per gap kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    here = machine()
    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    ctx = get_context("fork")
    go_gap = ctx.Value("d", 0.0, lock=False)
    go, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_other, args=(core, go_gap, go, done), daemon=True)
    other.start()
    env = gym.make("CartPole-v1")
    torch.manual_seed(POLICY_SEED)
    agent = CleanRLAgent(env.observation_space, env.action_space)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    kinds = ["none", "spin", "python", "sleep", "other"]
    print(f"machine: {here}; one core ({core}), torch 1 thread, {args.rounds} rounds of {args.seconds} s")
    print(f"{'gap us':>7s} " + " ".join(f"{k:>8s}" for k in kinds) + "   (forward pass, median of rounds, us)")
    try:
        for gap_us in args.gap_us:
            gap = gap_us * 1e-6
            go_gap.value = gap
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.rounds):
                for kind in kinds:
                    total, n = 0.0, 0
                    end = time.perf_counter() + args.seconds
                    while time.perf_counter() < end:
                        t0 = time.perf_counter()
                        with torch.no_grad():
                            agent.get_action_and_value(torch.Tensor(obs))
                        total += time.perf_counter() - t0
                        n += 1
                        if kind == "spin" or kind == "python":
                            table: dict[int, float] = {}
                            stop = time.perf_counter() + gap
                            while time.perf_counter() < stop:
                                if kind == "python":
                                    for i in range(50):
                                        table[i] = i * 1.5
                        elif kind == "sleep":
                            time.sleep(gap)
                        elif kind == "other":
                            go.set()
                            done.wait()
                            done.clear()
                    times[kind].append(total / n * 1e6)
            print(f"{gap_us:7.0f} " + " ".join(f"{np.median(times[k]):8.1f}" for k in kinds))
    finally:
        go_gap.value = -1.0
        go.set()
        other.join(5)
        if other.is_alive():
            other.kill()


if __name__ == "__main__":
    main()
