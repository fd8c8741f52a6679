"""How fast does one RLlib env runner sample, with shmvec and with RLlib's own vectorize modes?

One remote ``SingleAgentEnvRunner`` (``num_env_runners=1``) of PPO on CartPole-v1 with
``num_envs_per_env_runner`` envs, its env made three ways: RLlib's ``"sync"`` mode (Gymnasium's
``SyncVectorEnv`` in the runner), its ``"async"`` mode (``AsyncVectorEnv``: a process per env), and
``shmvec.integrations.rllib.use_shmvec`` (a ``ShmVectorEnv``, with its default worker count, the
runner's CPUs, and with ``--shm-workers`` more).  The runner samples ``--timesteps`` env steps per
call (its RLModule picks the actions, as in training); the configurations alternate, round by
round, in one run, and the figure is env steps per second of the median round; the ratios are
medians of per-round ratios against ``sync``.  Needs ``ray[rllib]`` (a venv of its own: it pins
Gymnasium 1.2.x) and torch.

    python bench/rllib_sampling.py --n-envs 8 32 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def build(mode: str, n_envs: int, shm_workers: int | None, fragment: int):
    from ray.rllib.algorithms.ppo import PPOConfig

    from shmvec.integrations.rllib import use_shmvec

    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=1, num_envs_per_env_runner=n_envs, rollout_fragment_length=fragment,
                           gym_env_vectorize_mode="sync" if mode == "sync" else "async")
              .training(train_batch_size_per_learner=n_envs * fragment))
    if mode.startswith("shmvec"):
        config = use_shmvec(config, n_workers=shm_workers)
    return config.build_algo()


def sample_seconds(algo, timesteps: int) -> float:
    start = time.perf_counter()
    algo.env_runner_group.foreach_env_runner(lambda r: len(r.sample(num_timesteps=timesteps)),
                                             local_env_runner=False)
    return time.perf_counter() - start


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--timesteps", type=int, default=4096, help="env steps per sample call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shm-workers", type=int, default=os.cpu_count(),
                        help="the second shmvec configuration's workers (default: the CPUs)")
    parser.add_argument("--json", help="write the figures there too")
    args = parser.parse_args()

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    results = []
    print(f"RLlib sampling, one remote env runner, PPO's RLModule, CartPole-v1; {machine()}")
    try:
        for n_envs in args.n_envs:
            modes = {"sync": None, "async": None, "shmvec (runner's CPUs)": None,
                     f"shmvec ({args.shm_workers} workers)": args.shm_workers}
            algos = {name: build(name, n_envs, workers, 32) for name, workers in modes.items()}
            try:
                for algo in algos.values():
                    sample_seconds(algo, args.timesteps // 4)  # warm-up: start, first reset, compile
                seconds: dict[str, list[float]] = {name: [] for name in algos}
                for _ in range(args.rounds):
                    for name, algo in algos.items():
                        seconds[name].append(sample_seconds(algo, args.timesteps))
            finally:
                for algo in algos.values():
                    algo.stop()
            print(f"\n{n_envs} envs per runner, {args.timesteps} env steps per round, {args.rounds} rounds")
            print(f"{'configuration':<28}{'steps/s':>10}{'x sync':>9}")
            for name, s in seconds.items():
                ratio = statistics.median(ref / mine for ref, mine in zip(seconds["sync"], s))
                sps = args.timesteps / statistics.median(s)
                print(f"{name:<28}{sps:>10,.0f}{ratio:>8.2f}x")
                results.append({"n_envs": n_envs, "configuration": name, "steps_per_s": sps, "x_sync": ratio})
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
