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
script calling ``torch.set_num_threads(N)`` does).  ``--face gymnasium`` measures ``ShmVectorEnv``
variants against ``SyncVectorEnv`` instead (CleanRL's loop in the policy situation)::

    python bench/training_variants.py --face gymnasium --situation busy --n-envs 8 --variants '{"default": {}, "2 workers": {"n_workers": 2}}'
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


# The reference and the shmvec class of each face.
FACES = {"sb3": ("DummyVecEnv", "ShmVecEnv"), "gymnasium": ("SyncVectorEnv", "ShmVectorEnv")}


def stepper(venv, situation: str, face: str = "sb3"):
    """A stepper of ``venv``: random actions drawn beforehand, or the policy's (``policy``): SB3's
    rollout loop on the SB3 face, CleanRL's on the Gymnasium face."""
    if face == "gymnasium":
        obs = venv.reset(seed=0)[0]
        obs_space, act_space = venv.single_observation_space, venv.single_action_space
    else:
        obs = venv.reset()
        obs_space, act_space = venv.observation_space, venv.action_space
    if situation == "policy":
        return PolicyLoop(FACES[face][0], venv.step, obs, venv.num_envs, obs_space, act_space,
                          torch.get_num_threads())
    act_space.seed(0)
    actions = [np.array([act_space.sample() for _ in range(venv.num_envs)]) for _ in range(64)]
    return Stepper(venv.step, actions, venv.num_envs)


def measure(env: str, n_envs: int, variants: dict, situation: str, seconds: float, rounds: int,
            face: str = "sb3") -> dict:
    """Each variant's ratio to the face's reference (median of per-round ratios), and the
    reference's steps/s."""
    import gymnasium as gym

    from shmvec import ShmVecEnv, ShmVectorEnv

    reference = FACES[face][0]
    default_threads = torch.get_num_threads()
    venvs, steppers = {}, {}
    try:
        if face == "gymnasium":
            venvs[reference] = gym.vector.SyncVectorEnv([EnvFactory(env)] * n_envs)
        else:
            from stable_baselines3.common.vec_env import DummyVecEnv

            venvs[reference] = DummyVecEnv([EnvFactory(env)] * n_envs)
        steppers[reference] = stepper(venvs[reference], situation, face)
        cls = ShmVectorEnv if face == "gymnasium" else ShmVecEnv
        for name, kwargs in variants.items():
            torch.set_num_threads(default_threads)  # as if it were the process's only vec env
            venvs[name] = cls([EnvFactory(env)] * n_envs, start_method="fork", **kwargs)
            steppers[name] = stepper(venvs[name], situation, face)
        figures = side_by_side(steppers, seconds, rounds)
    finally:
        for venv in venvs.values():
            venv.close()
        torch.set_num_threads(default_threads)
    ref = figures.pop(reference)
    return {name: median_ratio(f, ref) for name, f in figures.items()} | {f"{reference} steps/s": float(np.median(ref))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--situation", choices=["random", "policy", "busy"], default="policy")
    parser.add_argument("--variants", default='{"default": {}}',
                        help="JSON: name -> keyword arguments of ShmVecEnv (ShmVectorEnv with --face gymnasium)")
    parser.add_argument("--face", choices=sorted(FACES), default="sb3",
                        help="sb3: ShmVecEnv x DummyVecEnv; gymnasium: ShmVectorEnv x SyncVectorEnv")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per backend and point")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    variants = json.loads(args.variants)
    m = machine()
    print(f"{m['cores']} cores ({m['cpu']}); {args.env}, situation {args.situation}, torch threads "
          f"{torch.get_num_threads()}; x {FACES[args.face][0]}, median of {args.rounds} alternating rounds")
    hog = Hog() if args.situation == "busy" else None
    try:
        if hog:
            time.sleep(0.3)
        for n in args.n_envs:
            r = measure(args.env, n, variants, args.situation, args.seconds, args.rounds, args.face)
            reference = FACES[args.face][0]
            print(f"n_envs {n:4d}: {reference} {r.pop(f'{reference} steps/s'):9,.0f} steps/s | "
                  + " | ".join(f"{k} {v:.2f}x" for k, v in r.items()), flush=True)
    finally:
        if hog:
            hog.close()


if __name__ == "__main__":
    main()
