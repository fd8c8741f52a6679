"""Soak: does a long run with crashes leak anything?

Runs ``--steps`` env steps (default one million) of CartPole-v1 through a
``ShmVecEnv(on_failure="restart")``, with, along the way:

- episode ends and their automatic resets (CartPole ends every few dozen steps),
- a full ``reset()`` every ``--reset-every`` env steps,
- ``get_attr`` and ``env_method`` calls every ``--call-every`` env steps,
- a worker killed with SIGKILL in the middle of a step every ``--kill-every`` env
  steps (as the OOM killer would), which the vec env restarts.

It measures, after a warm-up (the first ``--warmup`` of the steps, which includes a
restart) and at the end: resident memory of the parent and of the workers (psutil),
open file descriptors and threads of the parent, child processes, and the
``/dev/shm/shmvec_<pid>_*`` segments of this process.  It exits with status 1 when any of them grew beyond
the tolerance (``--rss-tolerance-mb`` for memory, none for the counts), or when the
restarts were not all reported.

    python bench/soak.py --steps 1000000

It is a script, not a test: pytest does not collect it (``bench/`` is not in
``testpaths``, and its name does not start with ``test_``).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import sys
import time
import warnings

import gymnasium as gym
import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the shmvec beside bench/

from shmvec import ShmVecEnv  # noqa: E402
from shmvec._errors import WorkerRestartWarning  # noqa: E402
from shmvec._protocol import RESTART_INFO_KEY  # noqa: E402


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def shm_segments() -> int:
    """This process's segments: ShmVecEnv names them shmvec_<creator pid>_<random> (other
    programs on the machine may hold segments of their own meanwhile)."""
    try:
        return sum(1 for name in os.listdir("/dev/shm") if name.startswith(f"shmvec_{os.getpid()}_"))
    except FileNotFoundError:  # pragma: no cover - no /dev/shm
        return 0


def measure(env: ShmVecEnv) -> dict[str, float]:
    me = psutil.Process()
    workers = [psutil.Process(p.pid) for p in env._engine.workers.processes]
    return {
        "parent RSS (MiB)": me.memory_info().rss / 2**20,
        "workers RSS (MiB)": sum(w.memory_info().rss for w in workers) / 2**20,
        "open fds (parent)": me.num_fds(),
        "threads (parent)": me.num_threads(),
        "child processes": len(me.children(recursive=True)),
        "/dev/shm segments": shm_segments(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps in all (default 1e6)")
    parser.add_argument("--n-envs", type=int, default=32)
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--kill-every", type=int, default=50_000, help="env steps between worker kills")
    parser.add_argument("--reset-every", type=int, default=20_000, help="env steps between full resets")
    parser.add_argument("--call-every", type=int, default=5_000, help="env steps between get_attr/env_method")
    parser.add_argument("--warmup", type=float, default=0.1, help="share of the steps before the first measure")
    parser.add_argument("--rss-tolerance-mb", type=float, default=16.0,
                        help="allowed growth of parent and of workers' resident memory (MiB, each)")
    parser.add_argument("--start-method", default="forkserver")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    n = args.n_envs
    iters = max(1, args.steps // n)
    warm_iter = int(iters * args.warmup)
    kill_iters = max(1, args.kill_every // n)
    reset_iters = max(1, args.reset_every // n)
    call_iters = max(1, args.call_every // n)
    warned = 0

    def count_warning(message, category, *rest) -> None:
        nonlocal warned
        if issubclass(category, WorkerRestartWarning):
            warned += 1
        else:  # pragma: no cover - anything else is shown
            print(f"warning: {category.__name__}: {message}", file=sys.stderr)

    warnings.simplefilter("always")  # "always" keeps no registry of messages seen: nothing grows
    warnings.showwarning = count_warning

    print(f"soak: {iters * n:,} env steps of CartPole-v1, {n} envs on {args.n_workers} workers "
          f"({args.start_method}), a worker killed every {kill_iters * n:,} env steps")
    print(f"machine: {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.platform()}")
    env = ShmVecEnv([make_cartpole] * n, n_workers=args.n_workers, start_method=args.start_method,
                    on_failure="restart", max_restarts=None)
    kills = flagged = episodes = calls = resets = 0
    restart_s = 0.0
    before: dict[str, float] = {}
    start = time.perf_counter()
    try:
        env.seed(args.seed)
        env.reset()
        act_rng = np.random.default_rng(args.seed)
        actions = [act_rng.integers(0, 2, size=n) for _ in range(64)]
        for it in range(iters):
            if it == warm_iter:
                before = measure(env)
                warm_time = time.perf_counter()
            acts = actions[it % 64]
            if it % kill_iters == kill_iters - 1:
                t0 = time.perf_counter()
                env.step_async(acts)
                victim = env._engine.workers.processes[rng.randrange(args.n_workers)]
                os.kill(victim.pid, signal.SIGKILL)
                kills += 1
                _, _, dones, infos = env.step_wait()
                restart_s += time.perf_counter() - t0
            else:
                _, _, dones, infos = env.step(acts)
            episodes += int(dones.sum())
            if kills and any(RESTART_INFO_KEY in info for info in infos):
                flagged += sum(1 for info in infos if RESTART_INFO_KEY in info)
            if it % call_iters == call_iters - 1:
                assert env.get_attr("spec")[0].id == "CartPole-v1"
                env.env_method("get_wrapper_attr", "np_random", indices=[rng.randrange(n)])
                calls += 2
            if it % reset_iters == reset_iters - 1:
                env.reset()
                resets += 1
                # A worker killed just after it finished the step is found dead by this reset (the
                # kill and the reset share an iteration by default): the reset reports its envs.
                flagged += sum(1 for info in env.reset_infos if RESTART_INFO_KEY in info)
        if not before:
            before = measure(env)
            warm_time = time.perf_counter()
        after = measure(env)
        end = time.perf_counter()
        restarts = env.restarts
    finally:
        env.close()
    closed_segments = shm_segments()

    steps_after_warm = (iters - warm_iter) * n
    print(f"done: {iters * n:,} env steps in {end - start:.1f} s ({iters * n / (end - start):,.0f} steps/s, "
          f"{steps_after_warm / max(end - warm_time, 1e-9):,.0f} after warm-up), {episodes:,} episodes, "
          f"{resets} resets, {calls} get_attr/env_method calls, {kills} kills, {restarts} restarts, "
          f"{warned} restart warnings; a step with a kill and its restart took {restart_s / max(kills, 1):.2f} s "
          "on average")
    print(f"{'':24}{'after warm-up':>14}{'end':>12}{'growth':>10}")
    failures = []
    for key in before:
        growth = after[key] - before[key]
        print(f"{key:24}{before[key]:>14.1f}{after[key]:>12.1f}{growth:>+10.1f}")
        limit = args.rss_tolerance_mb if "RSS" in key else 0
        if growth > limit:
            failures.append(f"{key} grew by {growth:.1f} (tolerance {limit})")
    print(f"/dev/shm segments after close: {closed_segments}")
    if closed_segments:
        failures.append(f"{closed_segments} /dev/shm/shmvec* segments remain after close")
    if restarts != kills or warned != kills:
        failures.append(f"{kills} kills but {restarts} restarts and {warned} warnings")
    per_worker = n // args.n_workers
    if not per_worker * kills <= flagged <= (per_worker + 1) * kills:
        failures.append(f"{kills} kills but {flagged} envs reported with info[{RESTART_INFO_KEY!r}]")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("OK: no growth beyond the tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
