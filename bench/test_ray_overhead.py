"""The cost of going through Ray: RayShmVecEnv against a local ShmVecEnv, CartPole-v1, n_envs=64.

Answers: how many env steps/s does a RayShmVecEnv lose to the Ray round trip of each step
(the actions into each actor, obs/rewards/dones/infos back through the object store), when
the envs themselves step exactly as fast?  All on this machine, so the network is loopback
and every configuration shares the same cores:

- ``local``: ``ShmVecEnv(n_workers=2)``, no Ray;
- ``ray-1x64``: one actor (2 CPUs) running a ShmVecEnv of 64 envs with 2 workers: the same
  work as ``local`` plus one Ray actor call per step;
- ``ray-2x32``: two actors, one per node of a two-node ``ray.cluster_utils.Cluster``, each a
  ShmVecEnv of 32 envs with 1 worker: the layout of a two-machine run (two calls per step, in
  parallel), squeezed onto the same cores;
- ``ray-pool-2x32``: the pool mode on that layout, ``RayShmVecEnvPool`` with ``batch_size=32``:
  each step returns the 32 envs of whichever actor answered first while the other actor steps
  (steps/s count rows returned).

``pytest bench/test_ray_overhead.py`` times 100 vec steps per configuration with
pytest-benchmark.  ``python bench/test_ray_overhead.py [--seconds S]`` measures the three side
by side in alternating rounds and prints steps/s and the ratio to ``local`` (medians of
per-round ratios): on a shared machine, only those ratios mean something.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

N_ENVS = 64
STEPS = 100
CONFIGS = ("local", "ray-1x64", "ray-2x32", "ray-pool-2x32")


class Stepper:
    """Steps one vec env with random actions drawn beforehand."""

    def __init__(self, venv, warmup: int = 20) -> None:
        self.venv = venv
        venv.action_space.seed(0)
        self.actions = [np.array([venv.action_space.sample() for _ in range(venv.num_envs)]) for _ in range(64)]
        self.k = 0
        venv.reset()
        self.steps(warmup)

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.venv.step(self.actions[self.k % 64])
            self.k += 1

    def chunk(self, seconds: float) -> float:
        """Env steps/s over about ``seconds``."""
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.steps(8)
            steps += 8
        return steps * self.venv.num_envs / (time.perf_counter() - t0)


def measure_side_by_side(venvs: dict, seconds: float, rounds: int) -> dict[str, list[float]]:
    """Steps/s of each vec env in alternating short chunks (a slow spell hits all alike)."""
    steppers = {name: Stepper(v) for name, v in venvs.items()}
    out: dict[str, list[float]] = {name: [] for name in venvs}
    for _ in range(rounds):
        for name, st in steppers.items():
            out[name].append(st.chunk(seconds / rounds / len(venvs)))
    return out


def start_cluster() -> Cluster:
    """Two nodes of 4 logical CPUs on this machine (room for all Ray layouts at once: the
    side-by-side run keeps them all alive), and the driver connected to them."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    cluster.add_node(num_cpus=4)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


def make_config(config: str):
    from shmvec.ray import RayShmVecEnv

    from shmvec import ShmVecEnv

    if config == "local":
        return make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0, vec_env_cls=ShmVecEnv,
                            vec_env_kwargs={"start_method": "forkserver", "n_workers": 2})
    if config == "ray-pool-2x32":
        from shmvec.ray_pool import RayShmVecEnvPool

        return make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0, vec_env_cls=RayShmVecEnvPool,
                            vec_env_kwargs={"batch_size": N_ENVS // 2, "num_cpus_per_actor": 1})
    if config == "ray-1x64":
        kwargs = {"n_actors": 1, "num_cpus_per_actor": 2}
    elif config == "ray-2x32":
        kwargs = {"num_cpus_per_actor": 1}  # one actor per node
    else:
        raise ValueError(config)
    return make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0, vec_env_cls=RayShmVecEnv, vec_env_kwargs=kwargs)


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster()
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.mark.parametrize("config", CONFIGS)
def test_cartpole_64_through_ray(benchmark, cluster, config):
    venv = make_config(config)
    try:
        stepper = Stepper(venv)
        benchmark.extra_info["env_steps_per_round"] = STEPS * venv.num_envs
        benchmark.pedantic(stepper.steps, args=(STEPS,), rounds=10, iterations=1)
    finally:
        venv.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per configuration (default 5)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"{len(os.sched_getaffinity(0))} cores, {platform.machine()}, Python {platform.python_version()}, "
          f"ray {ray.__version__}; CartPole-v1 x {N_ENVS}")
    cluster = start_cluster()
    venvs = {}
    try:
        for config in CONFIGS:
            venvs[config] = make_config(config)
        per_round = measure_side_by_side(venvs, args.seconds * len(venvs), rounds=args.rounds)
    finally:
        for v in venvs.values():
            v.close()
        stop_cluster(cluster)
    ref = per_round["local"]
    print(f"{'config':<15}{'steps/s':>12}{'x local':>9}")
    for config, figures in per_round.items():
        ratio = float(np.median([f / r for f, r in zip(figures, ref)]))
        print(f"{config:<15}{np.median(figures):>12,.0f}{ratio:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
