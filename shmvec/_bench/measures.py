"""What the benchmark measures, each as one function.

- :func:`bare_loop_sps`: steps/s of one env stepped in a plain loop (the base of the limit).
- :class:`Ceiling`: steps/s of ``k`` processes that each step one env in a plain loop at the same
  time, measured in the same rounds as the vec envs: what ``k`` busy processes really get from
  the machine at that moment (on a shared VM, less than ``k`` x one), so the ceiling of any vec
  env with ``k`` workers.
- :class:`Stepper` and :func:`side_by_side`: env steps/s of a vec env with random actions drawn
  beforehand, measured in alternating short chunks so that a slow spell of a shared machine hits
  every backend alike.
- :func:`latency_us`: the time of one vec step, step by step (median and 90th percentile).
- :func:`tree_memory`: resident memory of a process and all its descendants, as PSS.

Only numpy, gymnasium, (for memory) psutil and shmvec's pure-Python ``_machine`` are imported: a
helper process in another interpreter can use this module.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shmvec._bench.envs import EnvFactory
from shmvec._machine import usable_cores

#: Batches of random actions drawn before timing (cycled through while stepping).
ACTION_BATCHES = 64


def cores() -> int:
    """The cores a run uses by default: shmvec's CPU budget (physical cores among the CPUs this
    process may run on, within its cgroup CPU quota), which is also ShmVecEnv's default ``n_workers``."""
    return usable_cores()


def bare_loop_sps(env: str, seconds: float) -> float:
    """Steps/s of one env built by ``EnvFactory(env)`` and stepped in a plain Python loop."""
    return env_loop_sps(EnvFactory(env)(), seconds)


def env_loop_sps(e: Any, seconds: float, n_actions: int = 512) -> float:
    """Steps/s of the env ``e`` stepped for about ``seconds`` in a plain Python loop, with
    ``n_actions`` random actions drawn beforehand; closes ``e``.  Agent steps/s for a multi-agent
    env (:class:`shmvec._bench.envs.AgentSteps`: ``agents_per_step`` per step)."""
    per_step = getattr(e, "agents_per_step", 1)
    n_actions = max(8, n_actions // per_step)  # the clock is read after each pass: short for a slow env
    try:
        e.reset(seed=0)
        e.action_space.seed(0)
        actions = [e.action_space.sample() for _ in range(n_actions)]
        n, t0 = 0, time.perf_counter()
        while True:
            for a in actions:
                _, _, term, trunc, _ = e.step(a)
                if term or trunc:
                    e.reset()
            n += len(actions)
            dt = time.perf_counter() - t0
            if dt >= seconds:
                return n * per_step / dt
    finally:
        e.close()


def _ceiling_loop(conn: Any, env: str, n_actions: int = 512) -> None:
    """One process of :class:`Ceiling`: steps its env for the seconds it is sent, answers steps/s."""
    e = EnvFactory(env)()
    per_step = getattr(e, "agents_per_step", 1)  # agent steps of a multi-agent env
    check = max(1, 64 // per_step)  # steps between two readings of the clock
    try:
        e.reset(seed=0)
        e.action_space.seed(0)
        actions = [e.action_space.sample() for _ in range(n_actions)]
        conn.send("ready")
        while True:
            seconds = conn.recv()
            if seconds is None:
                return
            n, t0 = 0, time.perf_counter()
            while True:
                for a in actions[:check]:
                    _, _, term, trunc, _ = e.step(a)
                    if term or trunc:
                        e.reset()
                n += check
                t = time.perf_counter()
                if t - t0 >= seconds:
                    break
            conn.send(n * per_step / (t - t0))
    except (EOFError, OSError):
        pass  # the benchmark went away
    finally:
        e.close()
        conn.close()


def stop_processes(conns: list[Any], procs: list[Any], join_s: float = 5.0) -> None:
    """Ends helper processes that serve requests on a pipe until they receive None: sends None,
    joins each (killing one still alive after ``join_s``), then closes the processes and pipes."""
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass  # already gone
    for proc in procs:
        proc.join(join_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()
    for conn in conns:
        conn.close()


class Ceiling:
    """``k`` processes, each stepping one env built by ``EnvFactory(env)`` in a plain loop, all at
    the same time: a stepper (``chunk(seconds)``) whose steps/s is the sum of the ``k`` loops'.

    Measured in the same rounds as the vec envs (:func:`side_by_side`), it says what ``k`` busy
    processes get from the machine at that moment; the processes wait on a pipe (no CPU)
    between chunks.
    """

    workers: int | None = None

    def __init__(self, env: str, k: int, start_method: str = "fork") -> None:
        ctx = mp.get_context(start_method)
        self.workers = k
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        try:
            for _ in range(k):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_ceiling_loop, args=(child, env), daemon=True, name="shmvec-bench-ceiling")
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            for conn in self.conns:
                if not conn.poll(60) or conn.recv() != "ready":
                    raise RuntimeError(f"a bare-loop process for {env} did not start")
        except BaseException:
            self.close()
            raise

    def chunk(self, seconds: float) -> float:
        for conn in self.conns:
            conn.send(seconds)
        return float(sum(conn.recv() for conn in self.conns))

    def close(self) -> None:
        stop_processes(self.conns, self.procs)
        self.conns, self.procs = [], []


class Stepper:
    """Steps one vec env with random actions drawn beforehand, timing chunks of steps.

    ``step`` is the vec env's own bound method; actions cycle through ``ACTION_BATCHES``
    batches, so drawing them costs nothing while timing.  Episodes end and reset inside the
    vec envs, as in training.
    """

    def __init__(self, step: Callable[[Any], Any], actions: list, num_envs: int, warmup_steps: int = 20) -> None:
        self._step = step
        self.actions = actions
        self.num_envs = num_envs
        self.k = 0
        self.steps(warmup_steps)

    def steps(self, n: int) -> None:
        step, actions, k = self._step, self.actions, self.k
        m = len(actions)
        for i in range(k, k + n):
            step(actions[i % m])
        self.k = k + n

    def chunk(self, seconds: float) -> float:
        """Env steps/s (vec steps x num_envs) over about ``seconds`` (at least one vec step)."""
        step, actions, k = self._step, self.actions, self.k
        m = len(actions)
        clock = time.perf_counter
        t0 = clock()
        end = t0 + seconds
        n = 0
        while True:
            step(actions[(k + n) % m])
            n += 1
            t = clock()
            if t >= end:
                break
        self.k = k + n
        return n * self.num_envs / (t - t0)

    def latency_us(self, n: int) -> list[float]:
        """Microseconds of each of ``n`` single vec steps."""
        step, actions, k = self._step, self.actions, self.k
        m = len(actions)
        clock = time.perf_counter
        out = []
        for i in range(n):
            t0 = clock()
            step(actions[(k + i) % m])
            out.append((clock() - t0) * 1e6)
        self.k = k + n
        return out


def side_by_side(steppers: dict[str, Any], seconds: float, rounds: int,
                 tick: Callable[[], None] = lambda: None,
                 on_error: Callable[[str, Exception], None] | None = None) -> dict[str, list[float]]:
    """Each stepper's steps/s in ``rounds`` rounds: in each round every stepper runs one chunk of
    ``seconds / rounds``, one after the other (so each is measured ``seconds`` in all).
    Anything with ``chunk(seconds)`` is a stepper.  With ``on_error``, a stepper that raises is
    reported there and left out of the result; without it, the exception propagates."""
    out: dict[str, list[float]] = {name: [] for name in steppers}
    live = dict(steppers)
    for _ in range(rounds):
        for name, st in list(live.items()):
            try:
                out[name].append(st.chunk(seconds / rounds))
            except Exception as e:
                if on_error is None:
                    raise
                on_error(name, e)
                del live[name], out[name]
        tick()
    return out


def median_ratio(figures: Iterable[float], reference: Iterable[float]) -> float:
    """Median of the per-round ratios (rounds measured side by side share the machine's state)."""
    return float(np.median([f / r for f, r in zip(figures, reference)]))


def summarize_latency(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples)
    return {"median_us": float(np.median(a)), "p90_us": float(np.percentile(a, 90)), "samples": int(a.size)}


def tree_memory(pid: int | None = None) -> dict[str, Any]:
    """Memory of process ``pid`` (default: this one) and all its descendants, in bytes.

    ``pss`` (proportional set size) counts each private page once and splits each shared page
    (the shared-memory block, copy-on-write pages of forked workers, shared libraries) among the
    processes that map it: summed over the tree it is what the tree really uses.  RSS would count
    a shared page once per process; USS would not count shared pages at all.  Where PSS is not
    available (not Linux), RSS is summed and ``kind`` says so.
    """
    import psutil

    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)
    total, kind, counted = 0, "pss", 0
    for p in procs:
        try:
            info = p.memory_full_info()
            value = getattr(info, "pss", None)
            if value is None:
                kind, value = "rss", info.rss
            total += value
            counted += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return {"bytes": total, "kind": kind, "processes": counted}
