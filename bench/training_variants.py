"""ShmVecEnv's defaults against variants of its options, where users train, beside DummyVecEnv.

Answers: which defaults win with a policy in the loop (torch at its default threads) and on a
machine where another process keeps a core busy?  Each variant is a ``ShmVecEnv`` built with the
keyword arguments given as JSON; every backend is measured in alternating rounds with
``DummyVecEnv`` in one run, and the table gives the median of the per-round ratios::

    python bench/training_variants.py --situation policy --variants '{"default": {}, "keep torch": {"parent_threads": null}}'
    python bench/training_variants.py --situation busy --variants '{"default": {}, "2 workers": {"n_workers": 2}}'

Situations (as ``python -m shmvec.bench``'s, shmvec._bench.training): ``random`` (random
actions), ``policy`` (SB3's ActorCriticPolicy picks the actions; torch at its default threads,
each backend at the count it has alone), ``busy`` (random actions; another process spins on a
core from before the vec envs start).  ``--torch-threads N`` sets torch's count first (as a
script calling ``torch.set_num_threads(N)`` does).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from shmvec._bench.envs import EnvFactory
from shmvec._bench.measures import Stepper, median_ratio, side_by_side
from shmvec._bench.training import Hog, PolicyLoop
from shmvec.bench import machine


def stepper(venv, situation: str):
    """A stepper of ``venv``: random actions drawn beforehand, or the policy's (``policy``)."""
    obs = venv.reset()
    if situation == "policy":
        return PolicyLoop("DummyVecEnv", venv.step, obs, venv.num_envs, venv.observation_space, venv.action_space,
                          torch.get_num_threads())
    venv.action_space.seed(0)
    actions = [np.array([venv.action_space.sample() for _ in range(venv.num_envs)]) for _ in range(64)]
    return Stepper(venv.step, actions, venv.num_envs)


def measure(env: str, n_envs: int, variants: dict, situation: str, seconds: float, rounds: int) -> dict:
    """Each variant's ratio to DummyVecEnv (median of per-round ratios), and DummyVecEnv's steps/s."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv

    default_threads = torch.get_num_threads()
    venvs, steppers = {}, {}
    try:
        venvs["DummyVecEnv"] = DummyVecEnv([EnvFactory(env)] * n_envs)
        steppers["DummyVecEnv"] = stepper(venvs["DummyVecEnv"], situation)
        for name, kwargs in variants.items():
            torch.set_num_threads(default_threads)  # as if it were the process's only vec env
            venvs[name] = ShmVecEnv([EnvFactory(env)] * n_envs, start_method="fork", **kwargs)
            steppers[name] = stepper(venvs[name], situation)
        figures = side_by_side(steppers, seconds, rounds)
    finally:
        for venv in venvs.values():
            venv.close()
        torch.set_num_threads(default_threads)
    ref = figures.pop("DummyVecEnv")
    return {name: median_ratio(f, ref) for name, f in figures.items()} | {"DummyVecEnv steps/s": float(np.median(ref))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--situation", choices=["random", "policy", "busy"], default="policy")
    parser.add_argument("--variants", default='{"default": {}}', help="JSON: name -> ShmVecEnv keyword arguments")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per backend and point")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    variants = json.loads(args.variants)
    m = machine()
    print(f"{m['cores']} cores ({m['cpu']}); {args.env}, situation {args.situation}, torch threads "
          f"{torch.get_num_threads()}; x DummyVecEnv, median of {args.rounds} alternating rounds")
    hog = Hog() if args.situation == "busy" else None
    try:
        if hog:
            time.sleep(0.3)
        for n in args.n_envs:
            r = measure(args.env, n, variants, args.situation, args.seconds, args.rounds)
            print(f"n_envs {n:4d}: DummyVecEnv {r.pop('DummyVecEnv steps/s'):9,.0f} steps/s | "
                  + " | ".join(f"{k} {v:.2f}x" for k, v in r.items()), flush=True)
    finally:
        if hog:
            hog.close()


if __name__ == "__main__":
    main()
