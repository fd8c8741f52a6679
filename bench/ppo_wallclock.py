"""Wall-clock time of PPO on CartPole-v1 through DummyVecEnv and ShmVecEnv, same seeds and settings.

Answers: does training get faster with shmvec, and by how much, at a given n_envs?  Both
runs must collect the same rollouts and end with the same weights (checked, printed); the
time of each run is split into rollout collection (env steps + policy forward passes) and
PPO's updates, which no vec env speeds up.  ``--busy-us`` makes each env step cost that
many extra microseconds of CPU (a stand-in for a costlier simulator than CartPole)::

    python bench/ppo_wallclock.py                          # n_envs 8, 64, 256
    python bench/ppo_wallclock.py --n-envs 64 --busy-us 50 --subproc

``--torch-threads`` sets torch's threads for every run: ``default`` (torch's own count, as a
training script that does not set it: shmvec's ``parent_threads`` then decides for ShmVecEnv's
runs, as it would for the user) or a number (``1``: what a tuned script sets for everyone).  Both
can be given; each is its own table::

    python bench/ppo_wallclock.py --n-envs 16 64 --steps 32768 --repeat 2 --torch-threads default 1

Absolute times depend on the machine (and on its load); compare the runs of one call.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper

from shmvec import ShmVecEnv
from shmvec.bench import machine


class BusyStep(gym.Wrapper):
    """Spins ``busy_us`` microseconds of CPU in every step."""

    def __init__(self, env: gym.Env, busy_us: float) -> None:
        super().__init__(env)
        self.busy_s = busy_us * 1e-6

    def step(self, action):
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


class StepTimer(VecEnvWrapper):
    """Adds up the wall-clock time spent inside the vec env's step (step_async + step_wait)."""

    def __init__(self, venv) -> None:
        super().__init__(venv)
        self.step_s = 0.0
        self._start = 0.0

    def reset(self):
        return self.venv.reset()

    def step_async(self, actions) -> None:
        self._start = time.perf_counter()
        self.venv.step_async(actions)

    def step_wait(self):
        out = self.venv.step_wait()
        self.step_s += time.perf_counter() - self._start
        return out


class RolloutTimer(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.rollout_s = 0.0
        self._start = 0.0

    def _on_rollout_start(self) -> None:
        self._start = time.perf_counter()

    def _on_rollout_end(self) -> None:
        self.rollout_s += time.perf_counter() - self._start

    def _on_step(self) -> bool:
        return True


def run(cls, n_envs: int, args: argparse.Namespace, threads: int) -> dict:
    wrapper = (lambda env: BusyStep(env, args.busy_us)) if args.busy_us > 0 else None
    kwargs = None
    if cls is ShmVecEnv:
        kwargs = {"n_workers": args.n_workers}
        if args.spin_us is not None:
            if len(args.spin_us) > 2:
                raise SystemExit("--spin-us takes one number (both sides) or two (PARENT WORKER)")
            kwargs["spin_us"] = args.spin_us[0] if len(args.spin_us) == 1 else tuple(args.spin_us)
    torch.set_num_threads(threads)  # each run starts from the count being measured
    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0, vec_env_cls=cls, wrapper_class=wrapper,
                       vec_env_kwargs=kwargs)
    startup = time.perf_counter() - start
    env = StepTimer(env)
    try:
        model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=max(64, n_envs * args.n_steps // 4),
                    n_epochs=args.n_epochs, learning_rate=1e-3, seed=0, policy_kwargs={"net_arch": [64, 64]})
        timer = RolloutTimer()
        start = time.perf_counter()
        model.learn(args.steps, callback=timer)
        total = time.perf_counter() - start
        ran_threads = torch.get_num_threads()
    finally:
        env.close()
    return {"backend": cls.__name__, "n_envs": n_envs, "torch_threads": ran_threads, "steps": model.num_timesteps, "startup_s": startup,
            "total_s": total, "rollout_s": timer.rollout_s, "update_s": total - timer.rollout_s,
            "env_step_s": env.step_s, "policy_s": timer.rollout_s - env.step_s,
            "episodes": [(ep["r"], ep["l"]) for ep in model.ep_info_buffer],
            "params": [p.detach().clone() for p in model.policy.parameters()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=65_536)
    parser.add_argument("--n-steps", type=int, default=32)
    parser.add_argument("--n-epochs", type=int, default=2)
    parser.add_argument("--busy-us", type=float, default=0.0)
    parser.add_argument("--n-workers", type=int, default=None)
    parser.add_argument("--spin-us", type=float, nargs="+", default=None, metavar="US",
                        help="ShmVecEnv spin_us: one number for both sides, or PARENT WORKER "
                             "(default: its own); 0 makes a waiting side sleep at once")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each backend, alternating (the summary gives medians)")
    parser.add_argument("--subproc", action="store_true", help="also time SubprocVecEnv (slow at many envs)")
    parser.add_argument("--torch-threads", nargs="+", default=["default"], metavar="N",
                        help="torch's threads for every run: 'default' (torch's own count; ShmVecEnv's parent_threads "
                             "decides for its runs) and/or numbers; each is measured in turn (default: default)")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    counts = [default_threads if t == "default" else int(t) for t in args.torch_threads]
    print(f"machine: {machine()}; PPO n_steps={args.n_steps} n_epochs={args.n_epochs}, "
          f"{args.steps} steps, busy_us={args.busy_us}, {args.repeat} alternating runs per backend; torch threads "
          + ", ".join(f"{t} ({n})" for t, n in zip(args.torch_threads, counts)))
    header = (f"{'threads':>7s} {'backend':14s} {'n_envs':>6s} {'total s':>8s} {'rollout s':>9s} {'env step s':>10s} "
              f"{'policy s':>8s} {'update s':>8s} {'x Dummy':>8s}")
    print(header + "  same as Dummy (-: torch ran another thread count)")
    rows = []
    summary = []
    for label, threads in zip(args.torch_threads, counts):
        for n_envs in args.n_envs:
            backends = [DummyVecEnv, ShmVecEnv] + ([SubprocVecEnv] if args.subproc else [])
            runs: dict[str, list[dict]] = {cls.__name__: [] for cls in backends}
            for _ in range(args.repeat):
                ref = None
                for cls in backends:
                    r = run(cls, n_envs, args, threads)
                    if ref is None:
                        ref = r
                    # With another torch thread count (ShmVecEnv's parent_threads), float sums differ in
                    # their last bits and training drifts apart: nothing to compare ("-").
                    same = None if r["torch_threads"] != ref["torch_threads"] else (
                        r["episodes"] == ref["episodes"]
                        and all(torch.equal(a, b) for a, b in zip(r["params"], ref["params"])))
                    r["x_dummy"] = ref["total_s"] / r["total_s"]
                    print(f"{label:>7s} {r['backend']:14s} {n_envs:6d} {r['total_s']:8.2f} {r['rollout_s']:9.2f} "
                          f"{r['env_step_s']:10.2f} {r['policy_s']:8.2f} {r['update_s']:8.2f} {r['x_dummy']:8.2f}  {'-' if same is None else same}")
                    row = {k: v for k, v in r.items() if k not in ("params", "episodes")} | {"same_as_dummy": same,
                                                                                          "threads": label}
                    rows.append(row)
                    runs[r["backend"]].append(row)
            for name, rs in runs.items():
                med = {k: float(np.median([x[k] for x in rs])) for k in
                       ("total_s", "rollout_s", "env_step_s", "policy_s", "update_s", "x_dummy")}
                summary.append({"threads": label, "backend": name, "n_envs": n_envs} | med
                               | {"x_dummy_min": min(x["x_dummy"] for x in rs),
                                  "x_dummy_max": max(x["x_dummy"] for x in rs)})
    print(f"\nMedians of {args.repeat} runs (x Dummy: the median of the per-run ratios, min..max)")
    print(header)
    for m in summary:
        print(f"{m['threads']:>7s} {m['backend']:14s} {m['n_envs']:6d} {m['total_s']:8.2f} {m['rollout_s']:9.2f} "
              f"{m['env_step_s']:10.2f} "
              f"{m['policy_s']:8.2f} {m['update_s']:8.2f} {m['x_dummy']:8.2f}  "
              f"({m['x_dummy_min']:.2f}..{m['x_dummy_max']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "args": vars(args), "rows": rows, "summary": summary}, f, indent=2)
    if any(row["same_as_dummy"] is False for row in rows):
        raise SystemExit("a run differs from DummyVecEnv's: please report it as a shmvec bug")


if __name__ == "__main__":
    main()
