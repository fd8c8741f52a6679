"""Start-up time of vec envs: construct + first ``reset()``, each measurement in a fresh interpreter.

``python -m shmvec._startup`` prints a table; ``--json`` prints the rows.  Two questions:

1. **Backends** (``--n-envs 256`` CartPole-v1 envs): ShmVecEnv (one worker per core, each
   building a slice of the envs) against SB3's ``SubprocVecEnv`` and Gymnasium's
   ``AsyncVectorEnv`` (one process per env), for each start method.
2. **Forkserver preload** (``--preload``): envs whose construction imports torch, one per
   process (``envs_per_worker=1``), with and without ``preload=["torch"]``; a first and a second
   vec env built in the same interpreter (the second one finds the forkserver running).

Each point runs in a new ``python -m shmvec._startup --one ...`` process, so no forkserver,
import cache or page cache of one point helps another beyond what the OS shares; the timer
starts after the measuring process has imported SB3 and Gymnasium and stops after the first
``reset()`` returns.  This module imports nothing heavy at module level: spawned workers
import it (as their ``__main__``) and must stay light.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

BACKENDS = ("shmvec", "subproc", "async")


def make_torch_cartpole() -> Any:
    """CartPole whose construction imports torch (an env that needs torch, e.g. for a learned model)."""
    import gymnasium as gym
    import torch  # noqa: F401

    return gym.make("CartPole-v1")


def _factory(env: str) -> Any:
    from shmvec.factories import make_env

    if env == "cartpole":
        return make_env("CartPole-v1")
    if env == "torch":
        return make_env(make_torch_cartpole)
    raise ValueError(f"unknown env {env!r}")


def _build(backend: str, n_envs: int, start_method: str, env: str, options: dict[str, Any]) -> Any:
    fns = [_factory(env)] * n_envs
    if backend == "shmvec":
        from shmvec import ShmVecEnv

        return ShmVecEnv(fns, start_method=start_method, **options)
    if backend == "subproc":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv(fns, start_method=start_method)
    if backend == "async":
        import gymnasium as gym

        return gym.vector.AsyncVectorEnv(fns, shared_memory=True, context=start_method)
    raise ValueError(f"unknown backend {backend!r}")


def measure_here(backend: str, n_envs: int, start_method: str, env: str = "cartpole",
                 options: dict[str, Any] | None = None, repeats: int = 1) -> list[float]:
    """Seconds to construct and first-reset the vec env, ``repeats`` times in this process."""
    import gymnasium  # noqa: F401  (imported before the timer starts, as in any training script)
    import stable_baselines3  # noqa: F401

    import shmvec.shm_vec_env  # noqa: F401

    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        venv = _build(backend, n_envs, start_method, env, dict(options or {}))
        try:
            venv.reset()
            out.append(time.perf_counter() - start)
        finally:
            venv.close()
    return out


def measure_fresh(backend: str, n_envs: int, start_method: str, env: str = "cartpole",
                  options: dict[str, Any] | None = None, repeats: int = 1, timeout: float = 600.0) -> list[float]:
    """:func:`measure_here` in a new interpreter (``python -m shmvec._startup --one``)."""
    spec = json.dumps({"backend": backend, "n_envs": n_envs, "start_method": start_method, "env": env,
                       "options": options or {}, "repeats": repeats})
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout of shmvec first
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "shmvec._startup", "--one", spec], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"startup measurement {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def _rows_backends(n_envs: int, start_methods: list[str], backends: list[str]) -> list[dict[str, Any]]:
    rows = []
    for method in start_methods:
        for backend in backends:
            seconds = measure_fresh(backend, n_envs, method)[0]
            rows.append({"question": "backends", "backend": backend, "start_method": method, "n_envs": n_envs,
                         "env": "CartPole-v1", "seconds": seconds})
            print(f"  {backend:8s} {method:10s} n_envs={n_envs}: {seconds:7.2f} s", file=sys.stderr, flush=True)
    return rows


def _rows_preload(n_envs: int) -> list[dict[str, Any]]:
    rows = []
    for preload in (None, ["torch"]):
        options: dict[str, Any] = {"envs_per_worker": 1}
        if preload:
            options["preload"] = preload
        first, second = measure_fresh("shmvec", n_envs, "forkserver", env="torch", options=options, repeats=2)
        rows.append({"question": "preload", "backend": "shmvec", "start_method": "forkserver", "n_envs": n_envs,
                     "env": "CartPole-v1 importing torch", "preload": preload, "seconds": first,
                     "second_seconds": second})
        print(f"  preload={preload} n_envs={n_envs}: first {first:.2f} s, second {second:.2f} s", file=sys.stderr,
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--n-envs", type=int, default=256)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--start-methods", default="forkserver,spawn,fork")
    parser.add_argument("--preload", action="store_true", help="also measure forkserver preloading of torch")
    parser.add_argument("--preload-n-envs", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.one:
        spec = json.loads(args.one)
        seconds = measure_here(spec["backend"], spec["n_envs"], spec["start_method"], spec["env"], spec["options"],
                               spec["repeats"])
        print(json.dumps({"seconds": seconds}))
        return
    rows = _rows_backends(args.n_envs, args.start_methods.split(","), args.backends.split(","))
    if args.preload:
        rows += _rows_preload(args.preload_n_envs)
    from shmvec._machine import usable_cores  # here: the measured children import this module and stay light

    cores = usable_cores()
    if args.json:
        print(json.dumps({"cores": cores, "rows": rows}, indent=1))
        return
    print(f"construct + first reset, {cores} cores, each point in a fresh interpreter")
    print("| question | backend | start method | n_envs | env | seconds |")
    print("|---|---|---|---:|---|---:|")
    for r in rows:
        label = r["backend"] if r["question"] == "backends" else f"shmvec preload={r['preload']}"
        extra = f" (second vec env: {r['second_seconds']:.2f})" if "second_seconds" in r else ""
        print(f"| {r['question']} | {label} | {r['start_method']} | {r['n_envs']} | {r['env']} | "
              f"{r['seconds']:.2f}{extra} |")


if __name__ == "__main__":
    main()
