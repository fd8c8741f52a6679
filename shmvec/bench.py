"""``python -m shmvec.bench``: steps/s of shmvec against SB3's DummyVecEnv and SubprocVecEnv.

Every backend steps the same env through ``make_vec_env`` with random actions
drawn beforehand, side by side in one run, and the table reports ratios to
``DummyVecEnv`` (ratios hold across machines; absolute numbers do not).  The
limit is ``cores x`` the steps/s of one env stepped in a bare Python loop,
measured in the same run.

The pytest-benchmark files in ``bench/`` use the same env and backend
definitions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

# ---------------------------------------------------------------------------------------------
# Envs
# ---------------------------------------------------------------------------------------------


class InfoEveryStep(gym.Wrapper):
    """CartPole with MuJoCo-style reward terms in ``info`` on every step (a non-empty info each step)."""

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info.update(
            reward_run=float(obs[1]),
            reward_ctrl=-0.1 * float(action),
            x_position=float(obs[0]),
            x_velocity=float(obs[1]),
            reward_survive=1.0,
        )
        return obs, reward, terminated, truncated, info


def make_info_env() -> gym.Env:
    return InfoEveryStep(gym.make("CartPole-v1"))


ENVS: dict[str, Callable[[], gym.Env] | str] = {
    "CartPole-v1": "CartPole-v1",
    "CartPole-info": make_info_env,
}

# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------

BACKENDS = ("DummyVecEnv", "SubprocVecEnv", "ShmVecEnv")


def make_backend(backend: str, env: str, n_envs: int, start_method: str = "fork", **kwargs: Any) -> Any:
    """Builds ``n_envs`` copies of ``env`` through SB3's ``make_vec_env`` on ``backend``."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec import ShmVecEnv

    cls: Any
    vec_kwargs: dict[str, Any] = {}
    if backend == "DummyVecEnv":
        cls = DummyVecEnv
    elif backend == "SubprocVecEnv":
        cls, vec_kwargs = SubprocVecEnv, {"start_method": start_method}
    elif backend == "ShmVecEnv":
        cls, vec_kwargs = ShmVecEnv, {"start_method": start_method, **kwargs}
    else:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    return make_vec_env(ENVS[env], n_envs=n_envs, seed=0, vec_env_cls=cls, vec_env_kwargs=vec_kwargs)


def bare_loop_sps(env: str, seconds: float) -> float:
    """Steps/s of one env (with the Monitor wrapper make_vec_env adds) stepped in a plain loop."""
    from stable_baselines3.common.monitor import Monitor

    spec = ENVS[env]
    e = Monitor(gym.make(spec) if isinstance(spec, str) else spec())
    e.reset(seed=0)
    actions = [e.action_space.sample() for _ in range(4096)]
    n, t0 = 0, time.perf_counter()
    while True:
        for a in actions[:512]:
            _, _, term, trunc, _ = e.step(a)
            if term or trunc:
                e.reset()
        n += 512
        dt = time.perf_counter() - t0
        if dt >= seconds:
            e.close()
            return n / dt


class Stepper:
    """Steps one vec env with random actions drawn beforehand, in timed chunks."""

    def __init__(self, venv: Any, warmup: int = 20) -> None:
        self.venv = venv
        venv.action_space.seed(0)
        self.actions = [np.array([venv.action_space.sample() for _ in range(venv.num_envs)]) for _ in range(64)]
        self.k = 0
        venv.reset()
        self.steps(warmup)

    def steps(self, n: int) -> None:
        step, actions = self.venv.step, self.actions
        for _ in range(n):
            step(actions[self.k % 64])
            self.k += 1

    def chunk(self, seconds: float) -> float:
        """Env steps/s over about ``seconds``."""
        steps, t0 = 0, time.perf_counter()
        while True:
            self.steps(8)
            steps += 8
            dt = time.perf_counter() - t0
            if dt >= seconds:
                return steps * self.venv.num_envs / dt


def measure(venv: Any, seconds: float) -> float:
    """Env steps/s of ``venv.step`` with random actions drawn beforehand."""
    return Stepper(venv).chunk(seconds)


def measure_side_by_side(venvs: dict[str, Any], seconds: float, rounds: int = 10) -> dict[str, list[float]]:
    """Steps/s of each vec env, measured in alternating short chunks so that a slow spell of a
    shared machine hits every backend alike; returns each backend's per-round figures."""
    steppers = {name: Stepper(v) for name, v in venvs.items()}
    out: dict[str, list[float]] = {name: [] for name in venvs}
    for _ in range(rounds):
        for name, st in steppers.items():
            out[name].append(st.chunk(seconds / rounds))
    return out


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    return {
        "cores": cores(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def run(envs: list[str], n_envs_list: list[int], backends: list[str], seconds: float, start_method: str,
        progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Measures every backend at every n_envs, side by side; ratios are medians of per-round ratios."""
    results: dict[str, Any] = {"machine": machine(), "seconds_per_point": seconds, "start_method": start_method,
                               "points": [], "bare": {}}
    for env in envs:
        progress(f"{env}: one env in a bare loop")
        results["bare"][env] = bare_loop_sps(env, seconds)
        for n_envs in n_envs_list:
            venvs: dict[str, Any] = {}
            startup: dict[str, float] = {}
            try:
                for backend in backends:
                    progress(f"{env}: starting {backend} n_envs={n_envs}")
                    t0 = time.perf_counter()
                    venvs[backend] = make_backend(backend, env, n_envs, start_method=start_method)
                    startup[backend] = time.perf_counter() - t0
                progress(f"{env}: measuring n_envs={n_envs} side by side")
                per_round = measure_side_by_side(venvs, seconds * len(venvs))
            finally:
                for v in venvs.values():
                    v.close()
            ref = per_round.get("DummyVecEnv")
            for backend, figures in per_round.items():
                ratio = float(np.median([f / r for f, r in zip(figures, ref)])) if ref else None
                results["points"].append({
                    "env": env, "backend": backend, "n_envs": n_envs, "steps_per_s": float(np.median(figures)),
                    "ratio_to_dummy": ratio, "startup_s": startup[backend],
                })
    return results


def format_table(results: dict[str, Any]) -> str:
    n_cores = results["machine"]["cores"]
    lines = []
    for env, bare in results["bare"].items():
        limit = n_cores * bare
        lines.append(f"\n{env}: one env in a bare loop {bare:,.0f} steps/s; limit ({n_cores} cores) {limit:,.0f} steps/s")
        lines.append(f"{'backend':<15}{'n_envs':>7}{'steps/s':>12}{'x Dummy':>9}{'% limit':>9}{'start s':>9}")
        points = [p for p in results["points"] if p["env"] == env]
        for n_envs in sorted({p["n_envs"] for p in points}):
            row = [p for p in points if p["n_envs"] == n_envs]
            for p in row:
                ratio = f"{p['ratio_to_dummy']:.2f}" if p["ratio_to_dummy"] is not None else "-"
                lines.append(
                    f"{p['backend']:<15}{n_envs:>7}{p['steps_per_s']:>12,.0f}{ratio:>9}"
                    f"{100 * p['steps_per_s'] / limit:>8.0f}%{p['startup_s']:>9.2f}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmvec.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1"], choices=list(ENVS))
    parser.add_argument("--n-envs", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="seconds measured per backend and point, in alternating rounds (default 3)")
    parser.add_argument("--start-method", default="fork", choices=["fork", "forkserver", "spawn"],
                        help="start method of the multiprocess backends (default fork: fastest start-up; "
                             "it does not change stepping speed)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)

    def progress(msg: str) -> None:
        print(f"  .. {msg}", file=sys.stderr, flush=True)

    m = machine()
    print(f"shmvec benchmark: {m['cores']} cores, {m['cpu']}, Python {m['python']}, {args.seconds:g} s per point")
    results = run(args.envs, args.n_envs, args.backends, args.seconds, args.start_method, progress)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
