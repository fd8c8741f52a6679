"""What a vec env needs to know of the machine: its CPU budget, start methods, CPU pinning, the forkserver.

- :func:`cpu_budget` (and :func:`usable_cores`, its number): how many workers this process should
  run, from the physical cores, the affinity mask and the cgroup CPU quota, with what was found
  and why; the default of ``n_workers``, and the core the parent spins on when workers leave one;
- :func:`cores_taken`: the cores of the budget that other processes keep busy as a vec env starts
  (the default ``n_workers`` leaves them out, and the parent spins only on a core left free);
- :func:`default_start_method`: the default of ``start_method``;
- :func:`cpu_sets`: the cores each worker is pinned to (the ``cpu_affinity`` option);
- :func:`set_forkserver_preload`: modules multiprocessing's forkserver imports once (the
  ``preload`` option); :func:`start_forkserver`: the forkserver started with the program's main
  module, shmvec's worker modules and those modules imported once, in the server
  (:mod:`shmvec._mainload`).

The CPU budget
--------------
Three numbers bound the workers that can each have a core, and the budget is the smallest:

- **physical cores** among the CPUs this process may run on: the two hardware threads of one core
  share its execution units, so two workers there step at well under twice the speed of one, and
  a synchronous step waits for the slower (read from ``/sys/devices/system/cpu/cpuN/topology``:
  ``core_cpus_list`` or ``thread_siblings_list``, else ``physical_package_id`` + ``core_id``;
  where the topology cannot be read, every CPU counts as a core);
- **the affinity mask** (``taskset``, a cpuset cgroup, SLURM's binding): the CPUs the kernel lets
  this process run on;
- **the cgroup CPU quota** (Docker's ``--cpus``, a Kubernetes CPU limit, SLURM with cgroups):
  ``cpu.max`` (v2) or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1), the smallest over the
  process's cgroup and its ancestors.  It is rounded **down** (at least 1): the kernel throttles
  the whole group, every process at once, for the rest of a period once it has used its quota,
  and a synchronous step waits for its last worker; with ``floor(quota)`` busy workers, the
  group never runs out, and the fraction left over goes to the parent (SB3's bookkeeping, the
  policy), which needs some CPU every step.  Rounding up would put one worker more on the CPUs
  than the quota pays for.

:func:`cpu_budget` takes a root directory, so that tests can read faked ``/sys`` and ``/proc``
trees.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import multiprocessing.forkserver
import numbers
import os
import re
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shmvec import _mainload
from shmvec._errors import user_stacklevel

__all__ = ["CpuBudget", "cpu_budget", "usable_cores", "cores_taken", "note_workers", "Load", "read_load", "TICKS_PER_S",
           "default_start_method", "cpu_sets", "set_forkserver_preload", "start_forkserver"]

_CPU_DIR = "sys/devices/system/cpu"


@dataclass(frozen=True)
class CpuBudget:
    """What :func:`cpu_budget` found of the CPUs, and the number of workers it chose.

    :ivar logical: CPUs online on the machine.
    :ivar affinity: CPUs this process may run on (its affinity mask).
    :ivar physical: physical cores among those CPUs; None where the topology is unknown.
    :ivar quota: the cgroup CPU quota in CPUs (2.5: two and a half CPUs' time per period); None
        where no limit was found.
    :ivar quota_source: the file the quota was read from (or the cgroup files looked at, when
        none set a limit); None where there is no cgroup CPU controller to read.
    :ivar chosen: the budget: the smallest of ``affinity``, ``physical`` and ``floor(quota)``
        (at least 1).
    :ivar reason: what bound ``chosen``, in words.
    """

    logical: int
    affinity: int
    physical: int | None
    quota: float | None
    quota_source: str | None
    chosen: int
    reason: str

    def describe(self) -> str:
        """One line: what was found, then the choice and its reason."""
        physical = "topology unknown" if self.physical is None else f"{_n(self.physical, 'physical core')} among them"
        if self.quota is not None:
            quota = f"a cgroup CPU quota of {self.quota:g} CPUs ({self.quota_source})"
        elif self.quota_source:
            quota = f"no cgroup CPU quota (read {self.quota_source})"
        else:
            quota = "no cgroup CPU controller found"
        return (f"{_n(self.affinity, 'CPU')} in this process's affinity (of {self.logical} online), {physical}, {quota}; "
                f"default n_workers {self.chosen}: {self.reason}")


def cpu_budget(root: str = "/", affinity: Iterable[int] | None = None) -> CpuBudget:
    """How many workers this process should run: the smallest of the physical cores among the
    CPUs it may run on, its affinity mask and its cgroup CPU quota (rounded down, at least 1);
    see the module's docstring for why each.

    :param root: where ``sys/`` and ``proc/`` are read from (``"/"``; a faked tree in tests).
    :param affinity: the CPUs this process may run on; default ``os.sched_getaffinity(0)``.
    """
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except AttributeError:  # pragma: no cover - not Linux
            affinity = range(os.cpu_count() or 1)
    cpus = sorted(set(affinity)) or [0]
    online = _read_cpu_list(os.path.join(root, _CPU_DIR, "online"))
    logical = max(len(online) if online else (os.cpu_count() or 1), len(cpus))
    physical = _physical_cores(root, cpus)
    quota, source = _cgroup_quota(root)
    chosen = min(len(cpus), len(cpus) if physical is None else physical)
    if physical is None:
        reason = "one per CPU this process may run on (its affinity; the topology is unknown: each counts as a core)"
    elif physical < len(cpus):
        reason = (f"one per physical core: {len(cpus)} CPUs are {_n(physical, 'core')}, and two workers on the "
                  "threads of one core share it")
    else:
        reason = "one per CPU this process may run on (its affinity), each a core of its own"
    if quota is not None and max(1, math.floor(quota)) < chosen:
        chosen = max(1, math.floor(quota))
        reason = (f"the cgroup CPU quota of {quota:g} CPUs, rounded down: a worker never waits for the "
                  "quota to refill, and the fraction left is the parent's")
    return CpuBudget(logical=logical, affinity=len(cpus), physical=physical, quota=quota, quota_source=source,
                     chosen=chosen, reason=reason)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def usable_cores() -> int:
    """The workers this process should run, one per core it can really use: :func:`cpu_budget`'s
    choice (physical cores, affinity, cgroup quota)."""
    return cpu_budget().chosen


#: How long :func:`cores_taken` watches the CPUs, and how many times it counts the running tasks.
BUSY_SAMPLE_S = 0.04
SAMPLES = 8


@dataclass(frozen=True)
class Taken:
    """What :func:`cores_taken` saw: ``cores`` of the budget taken by other processes (whole
    cores), ``busy`` (the median count of their running tasks, None where not measured), and why."""

    cores: int
    busy: float | None
    reason: str


def cores_taken(budget: CpuBudget | None = None, seconds: float = BUSY_SAMPLE_S, root: str = "/") -> Taken:
    """The cores of ``budget`` that other processes keep busy now, watched for ``seconds`` while
    this process sleeps: the median, over ``SAMPLES`` readings, of the tasks the kernel has
    running or ready to run (``procs_running`` in ``/proc/stat``), less this process's threads
    and the workers of its other vec envs (:func:`note_workers`) that run or are ready then.

    A worker on such a core waits behind the other process for the scheduler's tick, and a
    synchronous step waits for its last worker: one worker fewer, on the cores left, is faster
    (docs/design.md, "The default number of workers").  At least one core is left.  Not measured
    (``cores=0``) where the count would not be about this process's CPUs: a budget from a cgroup
    quota, or an affinity mask smaller than the machine (a cpuset: ``procs_running`` counts the
    tasks of every CPU); nor where ``/proc`` cannot be read.
    """
    budget = budget or cpu_budget(root)
    if budget.chosen <= 1:
        return Taken(0, None, "one core: nothing to leave out")
    if budget.quota is not None and math.floor(budget.quota) < budget.affinity:
        return Taken(0, None, "a cgroup CPU quota sets the budget: the load of other groups is not measured")
    if budget.affinity < budget.logical:
        return Taken(0, None, "a cpuset or affinity mask: the load of the other CPUs is not this process's")
    import time

    counts = []
    try:
        tree = [os.getpid(), *_OWN_WORKERS]
        for _ in range(SAMPLES):
            running = _procs_running(root)
            counts.append(running - _own_running(root, tree))
            time.sleep(seconds / SAMPLES)
    except (OSError, ValueError, IndexError):
        return Taken(0, None, "/proc cannot be read")
    others = max(0, sorted(counts)[len(counts) // 2])
    taken = min(budget.chosen - 1, others)
    if taken:
        return Taken(taken, float(others), f"other processes kept {others} of the {budget.chosen} cores busy as it "
                     "started: a worker there would wait behind them")
    return Taken(0, float(others), "no other process kept a core busy as it started")


def _procs_running(root: str) -> int:
    with open(os.path.join(root, "proc/stat")) as f:
        for line in f:
            if line.startswith("procs_running "):
                return int(line.split()[1])
    raise ValueError("no procs_running in /proc/stat")


def _own_running(root: str, pids: list[int]) -> int:
    """Threads of ``pids`` running or ready to run now (state R)."""
    n = 0
    for pid in pids:
        try:
            tids = os.listdir(os.path.join(root, f"proc/{pid}/task"))
        except OSError:
            continue
        for tid in tids:
            try:
                with open(os.path.join(root, f"proc/{pid}/task/{tid}/stat")) as f:
                    if f.read().rpartition(")")[2].split()[0] == "R":
                        n += 1
            except (OSError, IndexError):
                continue
    return n


# The live workers of this process's vec envs (shmvec._workers notes and forgets them): their load
# is this process's own, not another's.
_OWN_WORKERS: set[int] = set()


def note_workers(pids: Iterable[int | None], live: bool = True) -> None:
    """Records (``live``) or forgets the pids of this process's workers, for :func:`cores_taken`."""
    for pid in pids:
        if pid is not None:
            (_OWN_WORKERS.add if live else _OWN_WORKERS.discard)(pid)


@dataclass(frozen=True)
class Load:
    """One reading of what runs on a set of CPUs (:func:`read_load`); two readings apart in time
    say how many cores other processes took meanwhile and which workers waited for a core."""

    busy: int  # busy clock ticks of the CPUs read (user, nice, system, irq, softirq), since boot
    own: dict[int, int]  # clock ticks each process of ours ran (this one, all its threads; its workers)
    waits: dict[int, tuple[int, int, int]]  # a worker's pid -> (ns it waited on a run queue, its last CPU, ns it ran)
    cpus: dict[int, int] = field(default_factory=dict)  # busy ticks of each CPU read (``busy`` is their sum)


#: /proc's clock ticks per second (``busy`` and ``own`` of :class:`Load`).
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_load(cpus: Iterable[int], workers: Iterable[int], root: str = "/") -> Load | None:
    """What runs on ``cpus`` now: their busy ticks (``/proc/stat``), the ticks of this process and
    of every worker of its vec envs (:func:`note_workers`, ``/proc/<pid>/stat``), and for each of
    ``workers`` the time it waited for a core and the time it ran (``/proc/<pid>/schedstat``) and
    its last CPU.  None where ``/proc`` cannot be read.  A process that is gone is left out."""
    wanted = {f"cpu{c}": c for c in cpus}
    per_cpu: dict[int, int] = {}
    try:
        with open(os.path.join(root, "proc/stat")) as f:
            for line in f:
                name, _, rest = line.partition(" ")
                if name in wanted:
                    v = rest.split()
                    per_cpu[wanted[name]] = int(v[0]) + int(v[1]) + int(v[2]) + int(v[5]) + int(v[6])
    except (OSError, ValueError, IndexError):
        return None
    busy = sum(per_cpu.values())
    own: dict[int, int] = {}
    waits: dict[int, tuple[int, int, int]] = {}
    workers = set(workers)
    for pid in {os.getpid(), *_OWN_WORKERS, *workers}:
        fields = _stat_fields(root, pid)
        if fields is None:
            continue
        own[pid] = int(fields[11]) + int(fields[12])  # utime + stime
        sched = _read(os.path.join(root, f"proc/{pid}/schedstat")) if pid in workers else None
        if sched is not None:
            try:
                ran, delay = sched.split()[:2]
                waits[pid] = (int(delay), int(fields[36]), int(ran))  # run_delay, processor, sum_exec_runtime
            except (ValueError, IndexError):
                continue
    return Load(busy, own, waits, per_cpu)


def _stat_fields(root: str, pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command's name (the state first), or None."""
    text = _read(os.path.join(root, f"proc/{pid}/stat"))
    if text is None:
        return None
    fields = text.rpartition(")")[2].split()
    return fields if len(fields) > 36 else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_cpu_list(path: str) -> frozenset[int] | None:
    """A kernel CPU list (``0-3,8-11``) read from ``path``; None if missing or malformed."""
    text = _read(path)
    if text is None:
        return None
    return parse_cpu_list(text)


def parse_cpu_list(text: str) -> frozenset[int] | None:
    """``"0-3,8,10-11"`` as a set of CPU numbers; None if malformed."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            first, _, last = part.partition("-")
            out.update(range(int(first), int(last or first) + 1))
    except ValueError:
        return None
    return frozenset(out)


def _physical_cores(root: str, cpus: list[int]) -> int | None:
    """Distinct physical cores among ``cpus``; None if the topology of any of them is unknown."""
    cores: set[Any] = set()
    for cpu in cpus:
        topology = os.path.join(root, _CPU_DIR, f"cpu{cpu}", "topology")
        siblings = None
        for name in ("core_cpus_list", "thread_siblings_list"):
            siblings = _read_cpu_list(os.path.join(topology, name))
            if siblings:
                break
        if siblings:
            cores.add(siblings)
            continue
        package, core = _read(os.path.join(topology, "physical_package_id")), _read(os.path.join(topology, "core_id"))
        if package is None or core is None:
            return None
        cores.add((package, core))
    return len(cores)


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(root: str) -> list[tuple[str, str, str, set[str]]]:
    """cgroup mounts from ``/proc/self/mountinfo``: (fstype, mount root, mount point, super options)."""
    text = _read(os.path.join(root, "proc/self/mountinfo"))
    out = []
    for line in (text or "").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 4 or fields[dash + 1] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[dash + 1], _unescape(fields[3]), _unescape(fields[4]), set(fields[dash + 3].split(","))))
    return out


def _cgroup_dirs(root: str) -> list[tuple[str, str, str]]:
    """(version, the process's cgroup directory, its mount point) for the v2 hierarchy and the v1
    one with the cpu controller, as found; directories are under ``root``."""
    text = _read(os.path.join(root, "proc/self/cgroup"))
    if text is None:
        return []
    mounts = _mounts(root)
    found = []
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            version = "v2"
            mine = [(r, p) for fs, r, p, _ in mounts if fs == "cgroup2"]
            guesses = ["/sys/fs/cgroup"]
        elif "cpu" in controllers.split(","):
            version = "v1"
            mine = [(r, p) for fs, r, p, opts in mounts if fs == "cgroup" and "cpu" in opts]
            guesses = ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"]
        else:
            continue
        if not mine:  # no mountinfo: the usual places, mounted at their root
            mine = [("/", g) for g in guesses if os.path.isdir(os.path.join(root, g.lstrip("/")))]
        for mount_root, mount_point in mine[:1]:
            top = os.path.normpath(os.path.join(root, mount_point.lstrip("/")))
            rel = os.path.relpath(path or "/", mount_root)
            here = top if rel == "." or rel.startswith("..") else os.path.normpath(os.path.join(top, rel))
            if not os.path.isdir(here):  # the path as seen from another namespace: the mount's own root
                here = top
            found.append((version, here, top))
    return found


def _quota_at(version: str, directory: str) -> tuple[bool, float | None]:
    """(whether ``directory`` has the quota's files, the quota they set in CPUs or None: no limit)."""
    if version == "v2":  # cpu.max: "200000 100000" (2 CPUs) or "max 100000" (no limit)
        text = _read(os.path.join(directory, "cpu.max"))
        if text is None:
            return False, None
        quota, _, period = text.partition(" ")
    else:  # cpu.cfs_quota_us: -1 for no limit
        quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))  # type: ignore[assignment]
        period = _read(os.path.join(directory, "cpu.cfs_period_us"))  # type: ignore[assignment]
        if quota is None or period is None:
            return False, None
    if quota == "max":
        return True, None
    try:
        q, p = int(quota), int(period or 100000)
    except ValueError:
        return False, None
    return True, (q / p if q > 0 and p > 0 else None)


def _cgroup_quota(root: str) -> tuple[float | None, str | None]:
    """The smallest CPU quota over the process's cgroups and their ancestors, in CPUs, and the
    file it came from; (None, what was looked at) when no limit is set, (None, None) when there
    is no cgroup CPU controller to read."""
    best: tuple[float, str] | None = None
    looked: list[str] = []
    for version, here, top in _cgroup_dirs(root):
        name = "cpu.max" if version == "v2" else "cpu.cfs_quota_us"
        directory = here
        while True:  # the process's cgroup, then each ancestor up to the mount: each limit applies
            found, quota = _quota_at(version, directory)
            shown = "/" + os.path.relpath(os.path.join(directory, name), root)
            if found:
                looked.append(shown)
            if quota is not None and (best is None or quota < best[0]):
                best = (quota, f"cgroup {version}, {shown}")
            if directory == top or not directory.startswith(top + os.sep):
                break
            directory = os.path.dirname(directory)
    if best is not None:
        return best
    if looked:
        more = f" and {len(looked) - 1} more" if len(looked) > 1 else ""
        return None, f"{looked[0]}{more}"
    return None, None


def default_start_method() -> str:
    """As SB3: forkserver where available (thread-safe, cheap), else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def cpu_sets(cpu_affinity: Any, n_workers: int) -> list[frozenset[int] | None]:
    """The cores each worker is pinned to.

    - None/False: no pinning;
    - True: worker w gets the w-th core (cycling) of those this process may run on;
    - a sequence: worker w gets entry ``w % len``, an int (one core) or a collection of cores.
    """
    if cpu_affinity is None or cpu_affinity is False:
        return [None] * n_workers
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("cpu_affinity needs os.sched_setaffinity (Linux)")
    allowed = sorted(os.sched_getaffinity(0))
    if cpu_affinity is True:
        return [frozenset({allowed[w % len(allowed)]}) for w in range(n_workers)]
    usage = "pass True, or a list of one core (or a set of cores) per worker, e.g. cpu_affinity=[0, 1]"
    if isinstance(cpu_affinity, (str, bytes, numbers.Number)) or not isinstance(cpu_affinity, Iterable):
        raise TypeError(f"cpu_affinity={cpu_affinity!r}: {usage}")
    entries = list(cpu_affinity)
    if not entries:
        raise ValueError(f"cpu_affinity is an empty list: {usage}")

    def core(c: Any) -> int:
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral):
            raise TypeError(f"cpu_affinity names cores by number, got {c!r}: {usage}")
        return int(c)

    out = []
    for w in range(n_workers):
        entry = entries[w % len(entries)]
        if isinstance(entry, numbers.Number):
            cores = frozenset({core(entry)})
        elif isinstance(entry, (str, bytes)) or not isinstance(entry, Iterable):
            raise TypeError(f"cpu_affinity entry {entry!r}: {usage}")
        else:
            cores = frozenset(core(c) for c in entry)
        bad = sorted(cores - set(allowed))
        if not cores or bad:
            raise ValueError(
                f"cpu_affinity for worker {w} is {sorted(cores)}; this process may run on cores {allowed} only")
        out.append(cores)
    return out


def _forkserver_running() -> bool:
    server = multiprocessing.forkserver._forkserver
    return getattr(server, "_forkserver_pid", None) is not None


def set_forkserver_preload(modules: Iterable[str]) -> bool:
    """Makes multiprocessing's forkserver import ``modules`` once, so that its children inherit them.

    multiprocessing's forkserver is one process per parent process, started lazily on first use
    (by any library); modules named here are imported by it when it starts, and every worker
    forked from it then finds them already imported (``import torch`` costs a worker nothing).
    ``"__main__"`` is kept in the list, as multiprocessing does by default.

    :returns: True if the forkserver will preload them; False (with a ``RuntimeWarning``) if it is
        already running without them: it cannot be told to import more.  Call this early, before
        anything starts a process with the forkserver method.
    """
    if isinstance(modules, str):
        raise TypeError(f"preload takes a list of module names, e.g. [{modules!r}], not a string")
    modules = list(modules)
    if not all(isinstance(m, str) for m in modules):
        raise TypeError("preload takes module names (strings)")
    server = multiprocessing.forkserver._forkserver
    current = list(getattr(server, "_preload_modules", ["__main__"]))
    wanted = current + [m for m in modules if m not in current]
    if "__main__" not in wanted:
        wanted.insert(0, "__main__")
    if _forkserver_running():
        missing = [m for m in modules if m not in current]
        if missing:
            warnings.warn(
                f"the forkserver is already running without {missing}: preloading has no effect in this process, and "
                "each worker imports them itself. Call shmvec.set_forkserver_preload(...) (or pass preload= to the "
                "first ShmVecEnv) before anything starts a process with the forkserver method.",
                RuntimeWarning, stacklevel=user_stacklevel(),
            )
            return False
        return True
    mp.get_context("forkserver").set_forkserver_preload(wanted)
    return True


# What every forkserver worker imports: imported once in the server, they cost a worker nothing.
_SERVER_PRELOAD = ("shmvec._mainload", "shmvec._worker")
_START_LOCK = threading.Lock()


def start_forkserver(modules: Iterable[str] = ()) -> None:
    """Starts multiprocessing's forkserver, unless it runs already, so that it imports once the
    program's main module (as each worker would, ``__mp_main__``: :mod:`shmvec._mainload`),
    shmvec's worker modules and ``modules`` (the ``preload`` option), and its workers fork with
    them imported.  A server running already (started by anything else) is left as it is; for
    ``modules`` it missed, :func:`set_forkserver_preload` warns.

    :raises RuntimeError: called while this process imports its main module as a worker or a
        server does (a script without ``if __name__ == "__main__":``), as multiprocessing raises.
    """
    modules = list(modules)
    if mp.current_process().daemon:  # it may start no process: starting the workers raises, and says why
        return
    with _START_LOCK:
        if _forkserver_running():
            if modules:
                set_forkserver_preload(modules)
            return
        value = _mainload.environment(os.getpid())
        set_forkserver_preload([_SERVER_PRELOAD[0], *modules, *_SERVER_PRELOAD[1:]])
        if value is None or len(value) > 100_000:  # nothing to import, or more than an environment holds
            multiprocessing.forkserver.ensure_running()
            return
        os.environ[_mainload.ENV] = value  # read (and removed) by the server alone, as it starts
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.pop(_mainload.ENV, None)
