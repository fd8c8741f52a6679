"""``python -m shmvec.doctor`` (or ``shmvec-doctor``): what makes vec envs slow or fragile here, and what to change.

Checks, each with a status (``ok``, ``info``, ``warn``, ``fail``) and advice:

- ``cores``: the CPU budget (physical cores among the CPUs this process may run on, its affinity,
  the cgroup CPU quota: what was found and why ShmVecEnv's default ``n_workers`` is what it is)
  against the workers asked for, the load, and how many cores other processes keep busy right
  now (sampled from ``/proc/stat``);
- ``shm``: ``/dev/shm`` exists, its size and free space against what the env needs (Docker gives
  64 MiB by default), and segments left by crashed processes;
- ``start-method``: which start methods exist and what ShmVecEnv will use;
- ``threads``: ``OMP_NUM_THREADS`` and friends (threads per process times processes must not
  exceed the cores);
- ``parent-threads``: torch's default threads here, and what ShmVecEnv's ``parent_threads="auto"``
  will set them to while its workers run (shmvec._threads);
- ``placement``: whether ShmVecEnv will measure packing its workers off the parent's core
  (shmvec._placement: where a worker shares the parent's core) or leave them to the scheduler, and why;
- ``env`` (with ``--env``): one env step timed in a bare loop against ShmVecEnv's round trip,
  measured here: does the IPC overhead dominate, so that ``DummyVecEnv`` would be as fast?
  ``--measure`` also times both side by side.

The exit status is 1 when a check fails, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from shmvec._machine import CpuBudget, cpu_budget, usable_cores
from shmvec._threads import USER_SET_VARS

SHM_DIR = "/dev/shm"
#: Below this, /dev/shm is the container default or close to it: warn.
SMALL_SHM_BYTES = 512 * 2**20
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")
#: Cores that other processes keep busy, from which the doctor warns: a busy core takes one
#: from the workers, which then wait for each other (docs/design.md; see check_cores).
BUSY_CORES_WARN = 0.5
#: Predicted ShmVecEnv / DummyVecEnv speed below which the doctor advises DummyVecEnv.
WORTH_IT = 1.2
_SEGMENT = re.compile(r"^shmvec_(\d+)_")


@dataclass
class Check:
    name: str
    status: str  # "ok" | "info" | "warn" | "fail"
    detail: str
    advice: str = ""
    data: dict[str, Any] | None = None


def _cores() -> int:
    return usable_cores()


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.1f} GiB"


def busy_cores(seconds: float = 0.3) -> float | None:
    """Cores (of those this process may use) that are busy over the next ``seconds``, from
    ``/proc/stat``'s per-CPU counters; None where there is no ``/proc/stat``.  This process
    sleeps meanwhile, so the count is other processes' (a load average lags by minutes)."""
    def sample() -> dict[int, tuple[int, int]]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                m = re.match(r"cpu(\d+) (.*)", line)
                if m:
                    v = [int(x) for x in m.group(2).split()]
                    # user nice system idle iowait irq softirq steal (guest is inside user)
                    out[int(m.group(1))] = (sum(v[:8]), v[3] + v[4])
        return out

    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return None
    try:
        before = sample()
        time.sleep(seconds)
        after = sample()
    except (OSError, ValueError, IndexError):
        return None
    busy, seen = 0.0, 0
    for cpu in cpus:
        if cpu in before and cpu in after:
            total = after[cpu][0] - before[cpu][0]
            idle = after[cpu][1] - before[cpu][1]
            if total > 0:
                busy += 1.0 - idle / total
                seen += 1
    return busy if seen else None


def check_cores(workers: int | None, n_envs: int | None = None, cores: int | None = None,
                load: float | None = None, busy: float | None = None, budget: CpuBudget | None = None) -> Check:
    """Workers against cores: more workers than cores timeshare the cores and every step waits
    for the slowest.  ``busy``: cores other processes keep busy now (:func:`busy_cores`), or None.
    ``budget``: the CPU budget to report (:func:`shmvec._machine.cpu_budget`); read here when
    neither it nor ``cores`` is given, and ``cores`` defaults to its choice."""
    if budget is None and cores is None:
        budget = cpu_budget()
    cores = cores or budget.chosen  # type: ignore[union-attr]
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # pragma: no cover
            load = 0.0
    data = {"cores": cores, "workers": workers, "n_envs": n_envs, "load_1min": load, "busy_cores": busy,
            "budget": asdict(budget) if budget else None}
    if budget is not None:
        detail = f"{budget.describe()}; load average {load:.1f}"
    else:
        detail = f"{cores} cores usable by this process (of {os.cpu_count()}); load average {load:.1f}"
    if busy is not None:
        detail += f"; {busy:.1f} busy now"
    # The load average counts the whole machine's runnable processes: compare it with all its CPUs.
    machine_cpus = budget.logical if budget is not None else cores
    if workers is not None and workers > cores:
        return Check("cores", "warn", f"{detail}; {workers} workers asked for",
                     f"Use n_workers <= {cores} (ShmVecEnv's default here): more workers than cores "
                     "take turns on the cores, and every step waits for the last of them.", data)
    if busy is None and load > machine_cpus:  # the load average lags by minutes: the sample wins where there is one
        return Check("cores", "warn", f"{detail}: other processes keep every core busy",
                     "Workers get only part of a core, so multi-process vec envs lose their edge and timings "
                     "move from run to run. Benchmark on a quiet machine, compare backends side by side.", data)
    if busy is not None and busy >= BUSY_CORES_WARN:
        return Check("cores", "warn", f"{detail}: other processes are running",
                     "Every step waits for the slowest worker, and a worker that shares its core with a busy "
                     "process waits for the scheduler to hand the core back, again and again (measured on 2 "
                     "cores: one busy process took ShmVecEnv from about 2x to 0.3x-0.8x DummyVecEnv at 8 and "
                     "64 CartPoles, SubprocVecEnv did worse, DummyVecEnv kept its own core). Stop them before "
                     "training or benchmarking, or use DummyVecEnv while they run.", data)
    if cores == 1:
        return Check("cores", "warn", detail,
                     "With one core, workers cannot run in parallel: DummyVecEnv is as fast unless the env "
                     "waits on something other than the CPU (I/O, a simulator process).", data)
    extra = f"; {workers} workers fit" if workers else ""
    return Check("cores", "ok", detail + extra, "", data)


def stale_segments(directory: str = SHM_DIR) -> list[str]:
    """shmvec segments in ``directory`` whose creating process is gone (left by a killed parent)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stale = []
    for name in names:
        m = _SEGMENT.match(name)
        if m and not _pid_alive(int(m.group(1))):
            stale.append(name)
    return sorted(stale)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_shm(needed_bytes: int | None = None, directory: str = SHM_DIR) -> Check:
    """Size and free space of the shared-memory filesystem against what the vec env needs."""
    try:
        st = os.statvfs(directory)
    except OSError as e:
        return Check("shm", "fail", f"{directory} is not usable: {e.strerror}",
                     "multiprocessing.shared_memory needs a tmpfs at /dev/shm (on Linux: mount -t tmpfs tmpfs "
                     "/dev/shm). Without it use DummyVecEnv.")
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    stale = stale_segments(directory)
    data = {"size_bytes": size, "free_bytes": free, "needed_bytes": needed_bytes, "stale_segments": stale}
    detail = f"{directory}: {_mib(size)}, {_mib(free)} free"
    if needed_bytes:
        detail += f"; the vec env needs {_mib(needed_bytes)}"
    docker = ("In Docker, start the container with --shm-size=2g (or --ipc=host); on Kubernetes mount an "
              "emptyDir with medium: Memory at /dev/shm.")
    if needed_bytes and needed_bytes > free:
        return Check("shm", "fail", detail, f"Not enough room: ShmVecEnv would fail with a bus error or ENOSPC. "
                                            f"{docker} Or use fewer envs.", data)
    if stale:
        shown = " ".join(os.path.join(directory, s) for s in stale[:5])
        return Check("shm", "warn", f"{detail}; {len(stale)} segment(s) left by processes that are gone",
                     f"They hold memory until removed: rm {shown}{' ...' if len(stale) > 5 else ''}", data)
    if needed_bytes and needed_bytes > free / 2:
        return Check("shm", "warn", detail, f"The vec env takes more than half of what is free. {docker}", data)
    if size < SMALL_SHM_BYTES:
        return Check("shm", "warn", detail + " (a container's default size)",
                     f"Image observations of many envs will not fit. {docker}", data)
    return Check("shm", "ok", detail, "", data)


def check_start_method(requested: str | None = None) -> Check:
    methods = mp.get_all_start_methods()
    from_shmvec = "forkserver" if "forkserver" in methods else "spawn"
    chosen = requested or from_shmvec
    data = {"available": methods, "shmvec_default": from_shmvec, "requested": requested}
    if chosen not in methods:
        return Check("start-method", "fail", f"{chosen!r} is not available here (available: {', '.join(methods)})",
                     f"Pass start_method={from_shmvec!r} (ShmVecEnv's default here).", data)
    detail = f"available: {', '.join(methods)}; ShmVecEnv uses {chosen}"
    if chosen == "fork":
        return Check("start-method", "info", detail,
                     "fork starts fastest but copies a parent that may hold threads (torch, CUDA, a data loader): "
                     "a worker can deadlock on a lock held at fork time. Keep fork only when the vec env is "
                     "built before the learner starts threads; otherwise use forkserver (the default).", data)
    if chosen == "spawn":
        return Check("start-method", "info", detail,
                     "spawn imports everything again in each worker: env factories and their classes must be "
                     "importable (defined in a module, not in __main__ of a notebook).", data)
    return Check("start-method", "ok", detail + " (safe with threads in the parent, starts fast)", "", data)


def check_threads(environ: Mapping[str, str] | None = None, cores: int | None = None,
                  workers: int | None = None) -> Check:
    """Thread-count variables: each worker process multiplies them."""
    environ = os.environ if environ is None else environ
    cores = cores or _cores()
    workers = workers or cores
    values = {k: environ[k] for k in THREAD_VARS if k in environ}
    data = {"set": values, "cores": cores, "workers": workers}
    bad = {}
    for k, v in values.items():
        try:
            n = int(v)
        except ValueError:
            bad[k] = v
            continue
        if n > cores:
            bad[k] = v
    if bad:
        shown = ", ".join(f"{k}={v}" for k, v in bad.items())
        return Check("threads", "warn", f"{shown}: more threads per process than cores ({cores})",
                     f"Each of the {workers} workers and the learner would start that many threads. Unset them "
                     "(ShmVecEnv caps its workers at worker_threads=1 through threadpoolctl) and give the learner "
                     f"what is left: torch.set_num_threads({max(1, cores - workers)}).", data)
    shown = ", ".join(f"{k}={v}" for k, v in values.items()) or "none set"
    return Check("threads", "ok", f"{shown}; ShmVecEnv limits each worker to 1 thread (worker_threads=1)",
                 "" if values else "SubprocVecEnv and AsyncVectorEnv workers do not: with them, set "
                 "OMP_NUM_THREADS=1 before starting Python, and torch.set_num_threads("
                 f"{max(1, cores - workers)}) in the learner (ShmVecEnv does that one itself: parent-threads).",
                 data)


def check_parent_threads(torch_threads: int | None, cores: int, workers: int,
                         environ: Mapping[str, str] | None = None) -> Check:
    """What ``parent_threads="auto"`` (shmvec._threads) will do to torch's threads in a training
    script: ``torch_threads`` is torch's default count here (None: torch is not installed)."""
    environ = os.environ if environ is None else environ
    free = max(1, cores - workers)
    data = {"torch_threads": torch_threads, "cores": cores, "workers": workers, "free": free}
    if torch_threads is None:
        return Check("parent-threads", "ok", "torch is not installed: no intra-op pool in the parent to compete "
                     "with the workers", "", data)
    user_set = [name for name in USER_SET_VARS if environ.get(name)]
    if user_set:
        return Check("parent-threads", "ok" if torch_threads <= free else "warn",
                     f"{user_set[0]} is set: shmvec leaves torch's {torch_threads} thread(s) as they are",
                     "" if torch_threads <= free else
                     f"torch's idle threads spin on the {workers} workers' cores after each forward pass: "
                     f"torch.set_num_threads({free}) (or unset {user_set[0]} and let shmvec do it)", data)
    if torch_threads <= free:
        return Check("parent-threads", "ok", f"torch runs {torch_threads} thread(s), no more than the {free} "
                     f"core(s) the {workers} workers leave free: shmvec leaves them as they are", "", data)
    return Check("parent-threads", "ok",
                 f"torch runs {torch_threads} threads on {cores} cores: while {workers} workers run, ShmVecEnv "
                 f"sets it to {free} (parent_threads='auto': its idle threads would spin on the workers' cores "
                 f"after each forward pass) and restores it at close, with a ParentThreadsWarning once; through "
                 f"long gaps between steps (PPO's updates) it times lending torch its {torch_threads} threads and "
                 "keeps what is faster",
                 "To keep torch's count, pass parent_threads=None (or set OMP_NUM_THREADS before Python starts).",
                 data)


def check_placement(workers: int, busy: float | None = None) -> Check:
    """Whether ShmVecEnv's workers get placement trials here (shmvec._placement.plan)."""
    from shmvec._placement import plan

    taken = int(busy) if busy else 0
    placed = plan(workers, {}, taken)
    data = {"workers": workers, "trials": placed.on, "why": placed.why}
    if placed.on:
        return Check("placement", "ok", f"{workers} workers on these cores: {placed.why} (spread over every core, "
                     "or packed off the parent's; describe()['decided']['placement'] says which, and why)",
                     "To leave the workers where the scheduler puts them, pass cpu_affinity=False.", data)
    return Check("placement", "ok", f"{workers} worker(s): the workers stay where the scheduler puts them "
                 f"({placed.why})", "", data)


def torch_default_threads() -> int | None:
    """torch's intra-op threads in a fresh interpreter (its default here), or None without torch."""
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def predict_speedup(step_s: float, n_envs: int, workers: int, overhead_s: float) -> float:
    """ShmVecEnv's speed over DummyVecEnv's: n_envs x step against one worker's slice plus the round trip."""
    return (n_envs * step_s) / (math.ceil(n_envs / workers) * step_s + overhead_s)


def env_step_seconds(env: str, seconds: float = 0.5) -> float:
    """Seconds of one step of ``env`` (a Gymnasium id, or a benchmark env name) in a bare loop."""
    return 1.0 / _bare(env, seconds)


def _bare(env: str, seconds: float) -> float:
    import gymnasium as gym

    from shmvec._bench.envs import EnvFactory, check_env_name
    from shmvec._bench.measures import env_loop_sps

    try:
        e = EnvFactory(check_env_name(env))()
    except ValueError:
        e = gym.make(env)
    return env_loop_sps(e, seconds, n_actions=64)


def shmvec_roundtrip_seconds(workers: int, steps: int = 300) -> float:
    """Median seconds of one ShmVecEnv step with ``workers`` envs of zero cost (one per worker);
    ShmVectorEnv's (the same engine and round trip) where Stable-Baselines3 is not installed."""
    import numpy as np

    from shmvec._bench.envs import EnvFactory

    if importlib.util.find_spec("stable_baselines3") is None:
        from shmvec import ShmVectorEnv as face
    else:
        from shmvec import ShmVecEnv as face
    venv = face([EnvFactory("zero-cost")] * workers, n_workers=workers, start_method="fork")
    try:
        venv.reset()
        from shmvec._bench.measures import Stepper

        stepper = Stepper(venv.step, [np.zeros(workers, dtype=np.int64)], workers, warmup_steps=50)
        return float(np.median(stepper.latency_us(steps))) * 1e-6
    finally:
        venv.close()


def shm_bytes(env: str, n_envs: int, workers: int) -> int:
    """Bytes of ShmVecEnv's shared-memory block for ``n_envs`` copies of ``env``."""
    import gymnasium as gym

    from shmvec._bench.envs import EnvFactory, check_env_name
    from shmvec._layout import Layout

    try:
        e = EnvFactory(check_env_name(env))()
    except ValueError:
        e = gym.make(env)
    try:
        return Layout(e.observation_space, e.action_space, n_envs, workers).nbytes
    finally:
        e.close()


def check_env(env: str, n_envs: int, workers: int, measure: bool = False, seconds: float = 0.5) -> Check:
    """Whether ShmVecEnv pays off for ``env``: the env's step time against the round trip, measured here."""
    step_s = 1.0 / _bare(env, seconds)
    overhead_s = shmvec_roundtrip_seconds(workers)
    speedup = predict_speedup(step_s, n_envs, workers, overhead_s)
    data: dict[str, Any] = {"env": env, "n_envs": n_envs, "workers": workers, "step_us": step_s * 1e6,
                            "roundtrip_us": overhead_s * 1e6, "predicted_speedup": speedup}
    per_worker = math.ceil(n_envs / workers) * step_s
    detail = (f"{env}: one step {step_s * 1e6:.1f} us; a worker's slice of {math.ceil(n_envs / workers)} envs "
              f"{per_worker * 1e6:.0f} us against ShmVecEnv's round trip {overhead_s * 1e6:.0f} us; "
              f"predicted {speedup:.2f}x DummyVecEnv at {n_envs} envs on {workers} workers")
    if measure and importlib.util.find_spec("stable_baselines3") is None:
        detail += "; not measured against DummyVecEnv: Stable-Baselines3 is not installed (pip install \"shmvec[sb3]\")"
        measure = False
    if measure:
        data["measured"] = _measure_side_by_side(env, n_envs, workers, seconds=max(1.0, 2 * seconds))
        speedup = data["measured"]["ShmVecEnv/DummyVecEnv"]
        detail += f"; measured {speedup:.2f}x"
    if speedup >= WORTH_IT:
        return Check("env", "ok", detail, "", data)
    if measure and data["predicted_speedup"] >= WORTH_IT:
        return Check("env", "warn", detail,
                     "Measured, DummyVecEnv is about as fast here although the step and round-trip times say "
                     "ShmVecEnv should win: the workers do not get whole cores (see the cores check: other "
                     "processes are busy). On this machine as it is now, DummyVecEnv is the better choice.", data)
    need = envs_per_worker_needed(step_s, workers, overhead_s)
    more = (f"give each worker more envs (ShmVecEnv pays off from about {need} envs per worker)" if need
            else "use at least 2 workers")
    return Check("env", "warn", detail,
                 f"The round trip dominates: DummyVecEnv is about as fast or faster for this env. Use it, or {more}.",
                 data)


def envs_per_worker_needed(step_s: float, workers: int, overhead_s: float) -> int | None:
    """Envs per worker from which the predicted speed-up reaches ``WORTH_IT`` (None: never, too few workers)."""
    gain = 1.0 - WORTH_IT / workers
    if gain <= 0:
        return None
    n_envs = WORTH_IT * overhead_s / (step_s * gain)
    return max(1, math.ceil(n_envs / workers))


def _measure_side_by_side(env: str, n_envs: int, workers: int, seconds: float) -> dict[str, float]:
    from shmvec._bench import backends as B
    from shmvec._bench.measures import ACTION_BATCHES, Stepper, side_by_side

    if not _is_bench_env(env):
        return _measure_gym_id(env, n_envs, workers, seconds)
    spec = B.BuildSpec(env, n_envs, workers, "fork")
    handles = {name: B.build(name, spec) for name in ("DummyVecEnv", "ShmVecEnv")}
    try:
        steppers = {}
        for name, h in handles.items():
            h.reset()
            steppers[name] = Stepper(h.step, h.sample_actions(ACTION_BATCHES), n_envs)
        rounds = side_by_side(steppers, seconds, 6)
    finally:
        for h in handles.values():
            h.close()
    return _summary(rounds)


def _summary(rounds: dict[str, list[float]]) -> dict[str, float]:
    import numpy as np

    from shmvec._bench.measures import median_ratio

    return {"DummyVecEnv": float(np.median(rounds["DummyVecEnv"])), "ShmVecEnv": float(np.median(rounds["ShmVecEnv"])),
            "ShmVecEnv/DummyVecEnv": median_ratio(rounds["ShmVecEnv"], rounds["DummyVecEnv"])}


def _is_bench_env(env: str) -> bool:
    from shmvec._bench.envs import check_env_name

    try:
        check_env_name(env)
        return True
    except ValueError:
        return False


class _GymFactory:
    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self) -> Any:
        import gymnasium as gym

        return gym.make(self.env_id)


def _measure_gym_id(env: str, n_envs: int, workers: int, seconds: float) -> dict[str, float]:
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv
    from shmvec._bench.measures import Stepper, side_by_side

    venvs = {"DummyVecEnv": DummyVecEnv([_GymFactory(env)] * n_envs),
             "ShmVecEnv": ShmVecEnv([_GymFactory(env)] * n_envs, n_workers=workers, start_method="fork")}
    try:
        steppers = {}
        for name, v in venvs.items():
            v.reset()
            v.action_space.seed(0)
            actions = [np.array([v.action_space.sample() for _ in range(n_envs)]) for _ in range(16)]
            steppers[name] = Stepper(v.step, actions, n_envs)
        rounds = side_by_side(steppers, seconds, 6)
    finally:
        for v in venvs.values():
            v.close()
    return _summary(rounds)


def diagnose(env: str | None = None, n_envs: int | None = None, workers: int | None = None,
             start_method: str | None = None, measure: bool = False) -> list[Check]:
    """Runs every check; ``env`` adds the shared-memory estimate and the env timing."""
    budget = cpu_budget()
    cores = budget.chosen
    n_workers = workers or (min(n_envs, cores) if n_envs else cores)
    busy = busy_cores()
    checks = [check_cores(workers, n_envs, busy=busy, budget=budget)]
    needed = None
    if env:
        try:
            needed = shm_bytes(env, n_envs or 1, n_workers)
        except Exception as e:  # noqa: BLE001 - an env that cannot be built is reported as its own check
            checks.append(Check("env", "fail", f"cannot build {env!r}: {type(e).__name__}: {e}",
                                "Pass a Gymnasium id (gymnasium.make works with it) or a benchmark env name."))
            env = None
    checks.append(check_shm(needed))
    checks.append(check_start_method(start_method))
    checks.append(check_threads(cores=cores, workers=n_workers))
    checks.append(check_parent_threads(torch_default_threads(), cores, n_workers))
    checks.append(check_placement(n_workers, busy))
    if env:
        checks.append(check_env(env, n_envs or n_workers, n_workers, measure=measure))
    return checks


def format_checks(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{c.status.upper():^4}] {c.name}: {c.detail}")
        if c.advice:
            lines.append(f"       -> {c.advice}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmvec.doctor", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--env", help="a Gymnasium id (or a benchmark env name, e.g. busy-200us) to time")
    parser.add_argument("--n-envs", type=int, help="envs you plan to run (default: one per worker)")
    parser.add_argument("--workers", type=int, help="worker processes you plan to use (default: one per core)")
    parser.add_argument("--start-method", choices=["fork", "forkserver", "spawn"])
    parser.add_argument("--measure", action="store_true",
                        help="with --env: also time DummyVecEnv and ShmVecEnv side by side (a few seconds)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    checks = diagnose(args.env, args.n_envs, args.workers, args.start_method, args.measure)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=1))
    else:
        import platform

        budget = next((c.data or {} for c in checks if c.name == "cores"), {}).get("budget") or asdict(cpu_budget())
        physical = "" if budget["physical"] is None else f" ({budget['physical']} physical cores)"
        print(f"shmvec doctor: {budget['affinity']} CPUs{physical}, {platform.platform()}, "
              f"Python {platform.python_version()}")
        print(format_checks(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
