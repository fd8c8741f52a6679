"""The best a synchronous vec env with one worker per core could do here, beside DummyVecEnv and ShmVecEnv.

Any vec env that steps a fixed slice of the envs in each of k processes and returns all of them
together (ShmVecEnv, SubprocVecEnv, EnvPool's sync mode) is, on every step, as slow as its
slowest process.  This script measures that bound directly, in alternating rounds with
``DummyVecEnv`` and ``ShmVecEnv`` (same envs: ``make_vec_env``'s ``gym.make`` + ``Monitor``):

- ``lockstep``: k processes, each stepping n/k envs in a bare loop, meeting at a spinning
  barrier in shared memory after every step (no parent, no actions to pass, no results to
  read, no futex: nothing but the stepping and the wait for the slowest process);
- ``free``: the same processes without the barrier (each at its own core's speed: the
  ``ceiling`` column of ``python -m shmvec.bench``);
- ``roundtrip``: the same processes driven by this (parent) process through ShmVecEnv's own
  signalling and nothing else: every step the parent posts a sequence number to each process
  (``shmvec._sync.Words``: release store, futex wake of sleepers), each steps its envs, and the
  last to finish wakes the parent (or the first, if it shares the parent's core: the early wake
  of ``shmvec._protocol``), with ShmVecEnv's default spins.  No actions, observations,
  rewards or infos cross: this is the bound of any vec env with a parent in the loop that
  signals as ShmVecEnv does, and ``ShmVecEnv / roundtrip`` is what its data path costs.

``lockstep / DummyVecEnv`` is the highest ratio any such vec env can reach on this machine at
that moment; ``ShmVecEnv / lockstep`` is how much of it ShmVecEnv gets (the rest is its parent's
work between steps and the two wake-ups); ``roundtrip / lockstep`` splits that rest into the
signalling and the data.  Ratios are per round, then the median::

    python bench/lockstep_ceiling.py                  # 64 envs, 2 processes, 8 rounds of 2 s
    python bench/lockstep_ceiling.py --n-envs 8 64 --rounds 12 --seconds 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory

import numpy as np
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv
from shmvec._bench.measures import stop_processes
from shmvec._sync import Words, current_cpu
from shmvec._protocol import EARLY_SPIN_S, NO_CPU
from shmvec._machine import usable_cores
from shmvec._options import DEFAULT_PARENT_SPIN_US, DEFAULT_WORKER_SPIN_US

ENV_ID = "CartPole-v1"
STOP = -1  # a process's slot in the barrier array once it has stopped


def _make_envs(start: int, count: int) -> list:
    # The envs make_vec_env builds: gym.make(ENV_ID) wrapped in Monitor, seeded as it seeds them.
    vec = make_vec_env(ENV_ID, n_envs=count, start_index=start, vec_env_cls=DummyVecEnv)
    envs = vec.envs
    for i, env in enumerate(envs):
        env.reset(seed=start + i)
    return envs


# The round trip's words (shmvec._sync.Words), after the barrier's slots: the parent's counter of
# processes still stepping and its sleepers, the parent's core and the early-wake flag, a stop
# flag, then each process's sequence number and its sleepers (as shmvec._protocol's PENDING,
# PARENT_SLEEPERS, PARENT_CPU, EARLY_WAKE, CMD_SEQ and CMD_SLEEPERS).
PENDING, PARENT_SLEEPERS, PARENT_CPU, EARLY_WAKE, STOP_WORD = 0, 1, 2, 3, 4


def _words_offset(k: int) -> int:
    return -(-8 * k // 64) * 64  # the slots (int64), rounded up to a cache line


def _seq_word(index: int) -> int:
    return 5 + 2 * index


def _word_count(k: int) -> int:
    return 5 + 2 * k


def _step_slice(envs: list, actions) -> None:
    for env, a in zip(envs, actions):
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()


def _stepper(index: int, k: int, start: int, count: int, shm_name: str, conn) -> None:
    shm = shared_memory.SharedMemory(name=shm_name)
    words = None
    try:
        slots = np.ndarray((k,), dtype=np.int64, buffer=shm.buf)
        words = Words(shm.buf, _words_offset(k), _word_count(k))
        envs = _make_envs(start, count)
        actions = np.random.default_rng(index).integers(0, 2, size=(512, count))
        seen = 0  # the last sequence number seen: the parent may post before this process reads its message
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg is None:
                break
            seconds, mode = msg
            if mode == "roundtrip":
                seen, result = _serve_roundtrip(index, words, envs, actions, seen)
                conn.send(result)
                continue
            lockstep = mode == "lockstep"
            others = [j for j in range(k) if j != index]
            steps, t0 = 0, time.perf_counter()
            end = t0 + seconds
            stopped = False
            while not stopped:
                _step_slice(envs, actions[steps & 511])
                steps += 1
                if index == 0 and (steps & 15) == 0 and time.perf_counter() >= end:
                    slots[0] = STOP  # the leader decides when the round ends
                    stopped = True
                elif slots[0] == STOP:
                    stopped = True
                elif lockstep:
                    slots[index] = steps
                    for j in others:  # spin until every other process has finished this step
                        while True:
                            v = slots[j]
                            if v >= steps or v == STOP or slots[0] == STOP:
                                break
                    stopped = slots[0] == STOP
            conn.send((steps, time.perf_counter() - t0))
        del slots
    finally:
        if words is not None:
            words.release()
        shm.close()


def _serve_roundtrip(index: int, words: Words, envs: list, actions, seen: int) -> tuple[int, tuple[int, float]]:
    """A ShmVecEnv worker's loop (shmvec._worker.Worker.serve) with a bare step body, until the
    parent posts with the stop flag set; returns the last sequence number seen, (steps, seconds)."""
    seq_word, sleepers_word = _seq_word(index), _seq_word(index) + 1
    budget = DEFAULT_WORKER_SPIN_US * 1e-6
    parent = os.getppid()
    sleep_next = False
    steps, t0 = 0, time.perf_counter()
    while True:
        spin, sleep_next = (0.0 if sleep_next else budget), False
        value = words.wait_while(seq_word, seen, 1.0, spin, sleepers_word)
        if value is None:
            if os.getppid() != parent:
                raise SystemExit("the parent is gone")
            continue
        seen = value
        if words.load(STOP_WORD):
            return seen, (steps, time.perf_counter() - t0)
        _step_slice(envs, actions[steps & 511])
        steps += 1
        if words.fetch_add(PENDING, -1) == 1:
            words.wake_sleepers(PENDING, PARENT_SLEEPERS)
        elif words.load(PARENT_CPU) == current_cpu():  # early wake (shmvec._protocol)
            words.store(EARLY_WAKE, 1)
            words.wake_sleepers(PENDING, PARENT_SLEEPERS)
            sleep_next = True


class Lockstep:
    """k stepping processes; ``run(seconds, mode)`` returns the env steps/s of all together."""

    def __init__(self, n_envs: int, k: int) -> None:
        ctx = mp.get_context("fork")
        self.k = k
        self.shm = shared_memory.SharedMemory(create=True, size=_words_offset(k) + 4 * _word_count(k))
        self.slots = np.ndarray((k,), dtype=np.int64, buffer=self.shm.buf)
        self.words = Words(self.shm.buf, _words_offset(k), _word_count(k))
        bounds = [int(b) for b in np.linspace(0, n_envs, k + 1)]
        self.conns, self.procs = [], []
        for i in range(k):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_stepper, args=(i, k, bounds[i], bounds[i + 1] - bounds[i], self.shm.name, child),
                            daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self.n_envs = n_envs
        try:
            for c in self.conns:
                if c.recv() != "ready":
                    raise RuntimeError("a stepping process did not start")
        except BaseException:
            self.close()
            raise

    def run(self, seconds: float, mode: str) -> float:
        """Env steps/s of all processes together in ``mode``: lockstep, free or roundtrip."""
        self.slots[:] = 0
        for c in self.conns:
            c.send((seconds, mode))
        if mode == "roundtrip":
            steps, elapsed = self._drive(seconds)
            results = [c.recv() for c in self.conns]
            self.last_steps = [s for s, _ in results]
            if any(s != steps for s in self.last_steps):
                raise RuntimeError(f"the parent posted {steps} steps, the processes stepped {self.last_steps}")
            return steps * self.n_envs / elapsed
        results = [c.recv() for c in self.conns]
        self.last_steps = [s for s, _ in results]
        if mode == "lockstep":  # every process stepped the same steps (+- the one in flight at the stop)
            steps = min(s for s, _ in results)
            return steps * self.n_envs / max(t for _, t in results)
        return sum(s * (self.n_envs / self.k) / t for s, t in results)

    def _post(self, spin: float = 0.0) -> None:
        words = self.words
        cpu = current_cpu() if spin == 0.0 else -1
        words.store(PARENT_CPU, cpu if cpu >= 0 else NO_CPU)
        words.store(EARLY_WAKE, 0)
        words.store(PENDING, self.k)
        for w in range(self.k):
            seq_word = _seq_word(w)
            words.store(seq_word, (words.load(seq_word) + 1) & 0xFFFFFFFF)
        for w in range(self.k):
            words.wake_sleepers(_seq_word(w), _seq_word(w) + 1)

    def _drive(self, seconds: float) -> tuple[int, float]:
        """ShmVecEnv's step_async + step_wait, with nothing to write or read: post, wait for PENDING == 0."""
        words, post = self.words, self._post
        spin = DEFAULT_PARENT_SPIN_US * 1e-6 if self.k < usable_cores() else 0.0  # as ShmVecEnv decides
        words.store(STOP_WORD, 0)
        steps, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while True:
            post(spin)
            pending, wait_spin = self.k, spin
            while pending:
                if not wait_spin and words.load(EARLY_WAKE):
                    wait_spin = EARLY_SPIN_S
                value = words.wait_while(PENDING, pending, 1.0, wait_spin, PARENT_SLEEPERS)
                if value is not None:
                    pending = value
                elif not all(p.is_alive() for p in self.procs):
                    raise RuntimeError("a stepping process died")
            steps += 1
            if (steps & 15) == 0 and time.perf_counter() >= end:
                elapsed = time.perf_counter() - t0
                break
        words.store(STOP_WORD, 1)
        post()
        return steps, elapsed

    def close(self) -> None:
        stop_processes(self.conns, self.procs, join_s=10.0)
        self.conns, self.procs = [], []
        self.words.release()
        del self.slots
        self.shm.close()
        self.shm.unlink()


def _vec_rate(env, actions: np.ndarray, seconds: float) -> float:
    steps, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(16):
            env.step(actions[steps & 511])
            steps += 1
        t = time.perf_counter()
        if t >= end:
            return steps * actions.shape[1] / (t - t0)


def measure(n_envs: int, k: int, rounds: int, seconds: float) -> dict[str, list[float]]:
    dummy = make_vec_env(ENV_ID, n_envs=n_envs, vec_env_cls=DummyVecEnv)
    shm = make_vec_env(ENV_ID, n_envs=n_envs, vec_env_cls=ShmVecEnv,
                       vec_env_kwargs={"n_workers": k, "start_method": "fork"})
    lock = Lockstep(n_envs, k)
    rates: dict[str, list[float]] = {"DummyVecEnv": [], "ShmVecEnv": [], "lockstep": [], "free": [], "roundtrip": []}
    try:
        dummy.reset()
        shm.reset()
        actions = np.random.default_rng(0).integers(0, 2, size=(512, n_envs))
        for _ in range(rounds):
            rates["DummyVecEnv"].append(_vec_rate(dummy, actions, seconds))
            rates["ShmVecEnv"].append(_vec_rate(shm, actions, seconds))
            for mode in ("lockstep", "free", "roundtrip"):
                rates[mode].append(lock.run(seconds, mode))
    finally:
        lock.close()
        shm.close()
        dummy.close()
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[64])
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", action="store_true", help="print each point's per-round steps/s as JSON")
    args = parser.parse_args(argv)
    for n in args.n_envs:
        raw = measure(n, args.processes, args.rounds, args.seconds)
        if args.json:
            print(json.dumps({"n_envs": n, "processes": args.processes, "rates": raw}))
            continue
        r = {name: np.array(v) for name, v in raw.items()}
        d = r["DummyVecEnv"]
        print(f"\n{ENV_ID} x {n}, {args.processes} processes, {args.rounds} rounds of {args.seconds:g} s "
              "(medians of per-round ratios)")
        print(f"{'':12s}{'steps/s':>10s}{'x Dummy':>9s}{'x lockstep':>12s}   x Dummy per round")
        for name, v in r.items():
            per_round = v / d
            print(f"{name:12s}{np.median(v):10,.0f}{np.median(per_round):9.2f}{np.median(v / r['lockstep']):12.2f}   "
                  + " ".join(f"{x:.2f}" for x in per_round))


if __name__ == "__main__":
    main()
