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
  parallel), squeezed onto the same cores.

``pytest bench/test_ray_overhead.py`` times 100 vec steps per configuration with
pytest-benchmark.  ``python bench/test_ray_overhead.py [--seconds S]`` measures the three side
by side in alternating rounds and prints steps/s and the ratio to ``local`` (medians of
per-round ratios): on a shared machine, only those ratios mean something.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from shmvec.bench import Stepper, machine, make_backend, measure_side_by_side  # noqa: E402

N_ENVS = 64
STEPS = 100
CONFIGS = ("local", "ray-1x64", "ray-2x32")


def start_cluster() -> Cluster:
    """Two nodes of 3 logical CPUs on this machine (room for both Ray layouts at once: the
    side-by-side run keeps them all alive), and the driver connected to them."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


def make_config(config: str):
    from shmvec.ray import RayShmVecEnv

    if config == "local":
        return make_backend("ShmVecEnv", "CartPole-v1", N_ENVS, start_method="forkserver", n_workers=2)
    if config == "ray-1x64":
        kwargs = {"n_actors": 1, "num_cpus_per_actor": 2}
    elif config == "ray-2x32":
        kwargs = {"num_cpus_per_actor": 1}  # one actor per node
    else:
        raise ValueError(config)
    from stable_baselines3.common.env_util import make_vec_env

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
        benchmark.extra_info["env_steps_per_round"] = STEPS * N_ENVS
        benchmark.pedantic(stepper.steps, args=(STEPS,), rounds=10, iterations=1)
    finally:
        venv.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per configuration (default 5)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    m = machine()
    print(f"{m['cores']} cores, {m['cpu']}, Python {m['python']}, ray {ray.__version__}; CartPole-v1 x {N_ENVS}")
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
    print(f"{'config':<10}{'steps/s':>12}{'x local':>9}")
    for config, figures in per_round.items():
        ratio = float(np.median([f / r for f, r in zip(figures, ref)]))
        print(f"{config:<10}{np.median(figures):>12,.0f}{ratio:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
