"""ShmVecEnv beside a process that starts keeping a core busy after the vec env was built.

Answers: when another job starts spinning on the machine after training began, how much of
``DummyVecEnv``'s speed does ``ShmVecEnv`` keep, and does leaving the busy core out help?  The
backends are built on a quiet machine; then another process spins (pinned to ``--hog-core``
when given, else wherever the scheduler puts it); each backend steps ``--warm`` seconds beside
it (what a long run sees once the machine changed), then all are measured in alternating rounds
with random actions, and the table gives the median of the per-round ratios to ``DummyVecEnv``::

    python bench/busy_later.py --hog-core 1
    python bench/busy_later.py --hog-core 1 --variants '{"default": {}, "pinned to core 0": {"cpu_affinity": [[0], [0]]}}'

Each variant is a ``ShmVecEnv`` built with the keyword arguments given as JSON.  ``python -m
shmvec.bench``'s ``later`` situation measures the same without pinning the other process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from shmvec import ShmVecEnv
from shmvec._bench.backends import BuildSpec
from shmvec._bench.envs import EnvFactory
from shmvec._bench.measures import Stepper, median_ratio, side_by_side
from shmvec._bench.session import LocalBackend
from shmvec.bench import machine


class Variant:
    """A ShmVecEnv of ``n_envs`` copies of ``env`` built with ``kwargs``, stepped with random actions."""

    def __init__(self, env: str, n_envs: int, kwargs: dict) -> None:
        self.venv = ShmVecEnv([EnvFactory(env)] * n_envs, start_method="fork", **kwargs)
        try:
            self.venv.seed(0)
            self.venv.reset()
            space = self.venv.action_space
            space.seed(0)
            actions = [np.array([space.sample() for _ in range(n_envs)]) for _ in range(16)]
            self.stepper = Stepper(self.venv.step, actions, n_envs, warmup_steps=20)
        except BaseException:
            self.venv.close()
            raise

    def chunk(self, seconds: float) -> float:
        return self.stepper.chunk(seconds)

    def close(self) -> None:
        self.venv.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--n-envs", type=int, nargs="+", default=[8, 64])
    p.add_argument("--hog-core", type=int, default=None, help="the CPU the other process is pinned to (default: none)")
    p.add_argument("--warm", type=float, default=2.0, help="seconds each backend steps beside it before the rounds")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per backend and point")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", default='{"default": {}}', help="JSON: name -> keyword arguments of ShmVecEnv")
    args = p.parse_args(argv)
    variants = json.loads(args.variants)
    info = machine()
    print(f"{info.get('cores', '?')} cores ({info.get('cpu', '?')}); {args.env}, random actions, another process "
          f"spinning {'on core %d' % args.hog_core if args.hog_core is not None else 'unpinned'}, started after the "
          f"build; x DummyVecEnv, median of {args.rounds} alternating rounds after {args.warm:g} s beside it")
    for n_envs in args.n_envs:
        opened: dict = {"DummyVecEnv": LocalBackend("DummyVecEnv", BuildSpec(args.env, n_envs, 1))}
        hog = None
        try:
            for name, kwargs in variants.items():
                opened[name] = Variant(args.env, n_envs, kwargs)
            cmd = [sys.executable, "-c", "while True: pass"]
            hog = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
            if args.hog_core is not None:
                os.sched_setaffinity(hog.pid, {args.hog_core})
            time.sleep(0.3)
            for backend in opened.values():
                backend.chunk(args.warm)
            figures = side_by_side(opened, args.seconds, args.rounds)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
            for backend in opened.values():
                backend.close()
        ref = figures["DummyVecEnv"]
        cells = [f"{name} {median_ratio(rounds, ref):.2f}x" for name, rounds in figures.items() if name != "DummyVecEnv"]
        print(f"n_envs {n_envs:4d}: DummyVecEnv {np.median(ref):>9,.0f} steps/s | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
