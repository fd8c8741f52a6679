"""Where a step of the user's loop goes: the policy's time and the step's, apart, per variant.

Answers: with SB3's policy in the loop, does a variant of ShmVecEnv slow the parent's own work
(the policy), the step, or both?  torch runs one thread in every backend here (the cores' share is
what is measured, not torch's pool), ``DummyVecEnv`` is the reference, and backends alternate in
rounds within one run; the table gives each backend's median over the rounds::

    python bench/loop_split.py --n-envs 8 --variants '{"2 workers, spread": {"cpu_affinity": false}, "1 worker": {"n_workers": 1}, "default": {}}'

``--face gymnasium``: ``ShmVectorEnv`` with CleanRL's agent, ``SyncVectorEnv`` the reference.
Each row also gives the step's time with random actions, stepped alone (no policy in between)::

    python bench/loop_split.py --face gymnasium --n-envs 64
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


def alone(venv, seconds: float) -> float:
    """The mean microseconds of a step with random actions drawn beforehand, nothing in between."""
    space = getattr(venv, "single_action_space", venv.action_space)  # SB3's action_space is one env's
    space.seed(0)
    actions = [np.array([space.sample() for _ in range(venv.num_envs)]) for _ in range(64)]
    clock = time.perf_counter
    n, start = 0, clock()
    end = start + seconds
    while True:
        venv.step(actions[n % 64])
        n += 1
        t = clock()
        if t >= end:
            return (t - start) / n * 1e6


def build(face: str, n_envs: int, env: str, kwargs: dict | None):
    """The face's reference (``kwargs`` None) or its shmvec class with ``kwargs``, and its first observations."""
    import gymnasium as gym

    if face == "gymnasium":
        from shmvec import ShmVectorEnv

        fns = [EnvFactory(env)] * n_envs
        venv = gym.vector.SyncVectorEnv(fns) if kwargs is None else ShmVectorEnv(fns, start_method="fork", **kwargs)
        return venv, venv.reset(seed=0)[0], venv.single_observation_space, venv.single_action_space
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv

    fns = [EnvFactory(env)] * n_envs
    venv = DummyVecEnv(fns) if kwargs is None else ShmVecEnv(fns, start_method="fork", **kwargs)
    return venv, venv.reset(), venv.observation_space, venv.action_space


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8])
    parser.add_argument("--variants", default='{"default": {}}', help="JSON: name -> ShmVecEnv keyword arguments")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--face", choices=["sb3", "gymnasium"], default="sb3",
                        help="sb3: ShmVecEnv, SB3's policy, x DummyVecEnv; gymnasium: ShmVectorEnv, CleanRL's agent, "
                             "x SyncVectorEnv")
    args = parser.parse_args()
    variants = json.loads(args.variants)
    reference = "SyncVectorEnv" if args.face == "gymnasium" else "DummyVecEnv"
    torch.set_num_threads(1)
    m = machine()
    policy = "CleanRL's agent" if args.face == "gymnasium" else "SB3's policy"
    print(f"{m['cores']} cores ({m['cpu']}); {args.env}, {policy}, torch at 1 thread everywhere; "
          f"median of {args.rounds} alternating rounds")
    for n_envs in args.n_envs:
        venvs, loops = {}, {}
        try:
            for name, kwargs in {reference: None, **variants}.items():
                venv, obs, obs_space, act_space = build(args.face, n_envs, args.env, kwargs)
                venvs[name] = venv
                loops[name] = PolicyLoop(reference, venv.step, obs, n_envs, obs_space, act_space, 1)
            rows = {name: [] for name in venvs}
            for _ in range(args.rounds):
                for name, venv in venvs.items():
                    rows[name].append(split(loops[name], venv.step, args.seconds) + (alone(venv, args.seconds / 3),))
        finally:
            for venv in venvs.values():
                venv.close()
        ref = float(np.median([r[0] for r in rows[reference]]))
        for name, r in rows.items():
            sps, pol, stp, bare = (float(np.median(col)) for col in zip(*r))
            print(f"n_envs {n_envs:4d}: {name:24s} {sps:9,.0f} steps/s ({sps / ref:.2f}x)  policy {pol:6.1f} us  "
                  f"step {stp:6.1f} us  (alone {bare:6.1f} us)")


if __name__ == "__main__":
    main()
