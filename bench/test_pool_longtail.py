"""Asynchronous pool vs synchronous stepping of the same envs, when step times are long-tailed.

Answers: with envs whose step time varies widely (lognormal, median 0.5 ms, sigma 1: one step in
20 takes over 2.6 ms, one in 100 over 5 ms), how many env steps per second does ``ShmEnvPool``
(16 envs, batches of 8) deliver against ``ShmVectorEnv`` stepping all 16 envs together, on the
same 4 workers?  Synchronous stepping waits on every step for the slowest worker's slice; the
pool hands back the first 8 envs to finish, and the workers never wait for each other.

The step time is a sleep, as for an env that waits on a simulator, a game engine or I/O: the
workers then do not compete for the cores, so the figure measures the scheduling effect and
holds on a small or loaded machine.  Both are measured in alternating rounds in one run and the
ratio is the median of per-round ratios (the goal: at least 1.5x).

    pytest bench/test_pool_longtail.py            # pytest-benchmark
    python bench/test_pool_longtail.py            # the side-by-side table only
"""
from __future__ import annotations

import statistics
import time

import gymnasium as gym
import numpy as np

from shmvec import ShmEnvPool, ShmVectorEnv

N_ENVS = 16
BATCH = 8
N_WORKERS = 4
MEDIAN_S = 0.5e-3
SIGMA = 1.0


class LongTailEnv(gym.Env):
    """Steps take a lognormal time (median ``MEDIAN_S``, sigma ``SIGMA``), slept."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, index: int = 0) -> None:
        self._rng = np.random.default_rng(index)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(8, np.float32), {}

    def step(self, action):
        time.sleep(float(self._rng.lognormal(np.log(MEDIAN_S), SIGMA)))
        self._t += 1
        return np.full(8, self._t % 7, np.float32), 1.0, False, self._t >= 200, {}


def _fns():
    return [lambda i=i: LongTailEnv(i) for i in range(N_ENVS)]


def sync_steps_per_s(env: ShmVectorEnv, seconds: float) -> float:
    actions = np.zeros(N_ENVS, dtype=np.int64)
    env.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(actions)
        n += N_ENVS
    return n / (time.perf_counter() - t0)


def pool_steps_per_s(pool: ShmEnvPool, seconds: float) -> float:
    actions = np.zeros(BATCH, dtype=np.int64)
    _, infos = pool.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pool.send(actions, infos["env_id"])
        _, _, _, _, infos = pool.recv()
        n += BATCH
    return n / (time.perf_counter() - t0)


def side_by_side(rounds: int = 5, seconds: float = 1.0) -> dict[str, float]:
    """Alternating rounds of both; returns median steps/s of each and the median per-round ratio."""
    sync = ShmVectorEnv(_fns(), n_workers=N_WORKERS, start_method="fork")
    pool = ShmEnvPool(_fns(), batch_size=BATCH, n_workers=N_WORKERS, start_method="fork")
    try:
        s, p = [], []
        for _ in range(rounds):
            s.append(sync_steps_per_s(sync, seconds))
            p.append(pool_steps_per_s(pool, seconds))
    finally:
        sync.close()
        pool.close()
    return {
        "sync_steps_per_s": statistics.median(s),
        "pool_steps_per_s": statistics.median(p),
        "ratio": statistics.median(b / a for a, b in zip(s, p)),
        "bound_steps_per_s": N_WORKERS / (MEDIAN_S * float(np.exp(SIGMA ** 2 / 2))),
    }


def test_pool_vs_sync_longtail(benchmark):
    result = benchmark.pedantic(side_by_side, kwargs={"rounds": 3, "seconds": 1.0}, rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    print(f"\nsync {result['sync_steps_per_s']:.0f} steps/s, pool {result['pool_steps_per_s']:.0f} steps/s, "
          f"pool/sync {result['ratio']:.2f}x")


if __name__ == "__main__":
    r = side_by_side()
    print(f"{N_ENVS} envs, {N_WORKERS} workers, lognormal step time (median {MEDIAN_S * 1e3:g} ms, sigma {SIGMA:g})")
    print(f"| backend | steps/s |\n|---|---:|\n| ShmVectorEnv (all {N_ENVS} per step) | {r['sync_steps_per_s']:,.0f} |")
    print(f"| ShmEnvPool (batch {BATCH}) | {r['pool_steps_per_s']:,.0f} |")
    print(f"pool / sync (median of per-round ratios): {r['ratio']:.2f}x; "
          f"bound (workers / mean step time): {r['bound_steps_per_s']:,.0f} steps/s")
