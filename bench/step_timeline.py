"""Where one ShmVecEnv step's time goes: a timeline of every step, parent and workers.

Runs ``n_envs`` CartPoles (``make_vec_env``, fork start method) and stamps, with the monotonic
clock shared by all processes, when the parent starts ``step``, when it starts waiting, when its
wait returns and when ``step`` returns, and when each worker starts and ends the body of the
step.  Prints the medians of each interval (microseconds)::

    python bench/step_timeline.py                       # 64 envs, 2 workers, 3000 steps
    python bench/step_timeline.py --n-envs 8 --steps 5000 --spin-us 1000 1000

A diagnostic, not a benchmark: the stamps cost about a microsecond each.  It wraps private
methods (``Worker._sync_command``, ``Engine._complete_or_raise``) and needs ``fork``, so
that the workers inherit the wrappers.  ``step`` is what SB3's loops call: ``ShmVecEnv.step``
(its short way, or ``step_async`` + ``step_wait``).
"""

from __future__ import annotations

import argparse
import json
import time
from multiprocessing import shared_memory

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env

from shmvec import ShmVecEnv
from shmvec import _engine as E
from shmvec import _worker as W
from shmvec import shm_vec_env as S

# Columns of the stamp table, one row per command sequence number (mod the table's length).
ASYNC, WAIT, WAIT_DONE, RETURNED = 0, 1, 2, 3
WORKER0 = 4  # worker w: begin at WORKER0 + 2w, end of the body at WORKER0 + 2w + 1


def _install(table: np.ndarray):
    """Wraps the four methods to stamp ``table``; returns the function that unwraps them."""
    rows = table.shape[0]
    clock = time.perf_counter
    sync, step, complete = W.Worker._sync_command, S.ShmVecEnv.step, E.Engine._complete_or_raise

    def timed_sync(self, seq, name, body):
        row, col = seq % rows, WORKER0 + 2 * self.index
        table[row, col] = clock()

        def timed_body():
            out = body()
            table[row, col + 1] = clock()
            return out
        return sync(self, seq, name, timed_body)

    def timed_step(self, actions):
        row = (self._engine.seqs[0] + 1) % rows
        table[row, ASYNC] = clock()
        out = step(self, actions)
        table[row, RETURNED] = clock()
        return out

    def timed_complete(self, command, deadline_s, *args):
        table[self.seqs[0] % rows, WAIT] = clock()
        out = complete(self, command, deadline_s, *args)
        table[self.seqs[0] % rows, WAIT_DONE] = clock()
        return out

    def restore() -> None:
        W.Worker._sync_command = sync
        S.ShmVecEnv.step, E.Engine._complete_or_raise = step, complete

    W.Worker._sync_command = timed_sync
    S.ShmVecEnv.step, E.Engine._complete_or_raise = timed_step, timed_complete
    return restore


def timeline(n_envs: int, steps: int, n_workers: int = 2, spin_us: tuple | None = None,
             stat=np.median, cpu_affinity: bool = False, policy: bool = False) -> dict:
    """Runs the steps and returns ``stat`` (the median) of each interval in microseconds (and steps/s).
    ``policy``: SB3's PPO MlpPolicy picks each action from the last observations, as its rollout loop
    does (torch at the threads it has), instead of random actions."""
    if policy:
        import gymnasium as gym
        from stable_baselines3 import PPO

        policy = PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0).policy.eval()
    else:
        policy = None
    rows = steps + 16
    shm = shared_memory.SharedMemory(create=True, size=8 * rows * (WORKER0 + 2 * n_workers))
    try:
        table = np.ndarray((rows, WORKER0 + 2 * n_workers), dtype=np.float64, buffer=shm.buf)
        table[:] = 0.0
        restore = _install(table)
        kwargs = {"n_workers": n_workers, "start_method": "fork"}
        if spin_us is not None:
            kwargs["spin_us"] = spin_us
        if cpu_affinity:
            kwargs["cpu_affinity"] = True
        env = make_vec_env("CartPole-v1", n_envs=n_envs, vec_env_cls=ShmVecEnv, vec_env_kwargs=kwargs)
        try:
            obs = env.reset()
            actions = np.random.default_rng(0).integers(0, 2, size=(256, n_envs))
            t0 = time.perf_counter()
            for k in range(steps):
                if policy is None:
                    env.step(actions[k % 256])
                else:
                    with torch.no_grad():
                        action = policy(torch.as_tensor(obs))[0].numpy()
                    obs = env.step(action)[0]
            elapsed = time.perf_counter() - t0
            last = env._engine.seqs[0]
        finally:
            env.close()
            restore()
        seqs = [(last - steps + 1 + k) % rows for k in range(steps)]
        t = table[seqs][steps // 5:].copy()  # the first fifth is warm-up
        del table
    finally:
        shm.close()
        shm.unlink()

    def med(x: np.ndarray) -> float:
        return round(float(stat(x)) * 1e6, 1)

    period = np.diff(t[:, ASYNC])
    t = t[:-1]  # each step's period holds its body: the same steps for both
    begins = t[:, WORKER0::2]
    ends = t[:, WORKER0 + 1::2]
    out = {
        "n_envs": n_envs, "n_workers": n_workers, "steps_per_s": round(steps * n_envs / elapsed),
        "period_us": med(period),
        "parent_post_us": med(t[:, WAIT] - t[:, ASYNC]),
        "post_to_worker_begin_us": [med(begins[:, w] - t[:, ASYNC]) for w in range(n_workers)],
        "worker_body_us": [med(ends[:, w] - begins[:, w]) for w in range(n_workers)],
        "worker_skew_us": med(ends.max(axis=1) - ends.min(axis=1)),
        "last_end_to_wait_return_us": med(t[:, WAIT_DONE] - ends.max(axis=1)),
        "wait_return_to_step_wait_end_us": med(t[:, RETURNED] - t[:, WAIT_DONE]),
    }
    out["overhead_us"] = round(out["period_us"] - max(out["worker_body_us"]), 1)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--spin-us", type=float, nargs=2, default=None, metavar=("PARENT", "WORKER"))
    parser.add_argument("--cpu-affinity", action="store_true", help="pin worker w to core w")
    parser.add_argument("--policy", action="store_true", help="SB3's MlpPolicy picks the actions (torch in the loop)")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--mean", action="store_true", help="means instead of medians (the tail counts)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    spin = tuple(args.spin_us) if args.spin_us else None
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    out = timeline(args.n_envs, args.steps, args.n_workers, spin, np.mean if args.mean else np.median,
                   args.cpu_affinity, args.policy)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.n_envs} CartPoles, {args.n_workers} workers: {out['steps_per_s']:,} steps/s; "
              f"{'means' if args.mean else 'medians'} in microseconds:")
        for key, value in out.items():
            if key.endswith("_us"):
                print(f"  {key[:-3].replace('_', ' '):32s} {value}")
    return out


if __name__ == "__main__":
    main()
