"""The CPU budget (``shmvec._machine.cpu_budget``) read from faked ``/sys`` and ``/proc`` trees.

Each test writes the files the kernel would show (CPU topology, ``/proc/self/cgroup``,
``/proc/self/mountinfo``, cgroup v1 and v2 quota files) under ``tmp_path`` and passes the
affinity mask explicitly, so that nothing depends on the machine running the tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shmvec import _machine as M
from shmvec._machine import CpuBudget, cpu_budget, parse_cpu_list


def write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


def topology(root: Path, cores: list[list[int]], ids: bool = True, siblings: bool = True) -> None:
    """CPUs grouped by physical core: ``[[0, 4], [1, 5]]`` is two cores of two hardware threads."""
    cpus = sorted(c for core in cores for c in core)
    write(root, "sys/devices/system/cpu/online", f"{cpus[0]}-{cpus[-1]}")
    for core_id, threads in enumerate(cores):
        for cpu in threads:
            base = f"sys/devices/system/cpu/cpu{cpu}/topology"
            if siblings:
                write(root, f"{base}/thread_siblings_list", ",".join(map(str, threads)))
            if ids:
                write(root, f"{base}/core_id", str(core_id))
                write(root, f"{base}/physical_package_id", "0")


HT_8_4 = [[0, 4], [1, 5], [2, 6], [3, 7]]  # 8 logical CPUs on 4 hyperthreaded cores, numbered as Linux does

MOUNTINFO_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate"
MOUNTINFO_V1 = (
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
)


def cgroup_v2(root: Path, cpu_max: dict[str, str], path: str = "/job") -> None:
    """A v2 hierarchy; ``cpu_max`` maps cgroup paths (``/``-rooted, under the mount) to cpu.max."""
    write(root, "proc/self/cgroup", f"0::{path}")
    write(root, "proc/self/mountinfo", MOUNTINFO_V2)
    (root / "sys/fs/cgroup" / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for where, value in cpu_max.items():
        write(root, f"sys/fs/cgroup/{where.strip('/')}/cpu.max".replace("//", "/"), value)


def cgroup_v1(root: Path, quotas: dict[str, tuple[int, int]], path: str = "/docker/abc") -> None:
    write(root, "proc/self/cgroup", f"12:memory:{path}\n4:cpu,cpuacct:{path}\n0::/")
    write(root, "proc/self/mountinfo", MOUNTINFO_V1)
    (root / "sys/fs/cgroup/cpu,cpuacct" / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for where, (quota, period) in quotas.items():
        base = f"sys/fs/cgroup/cpu,cpuacct/{where.strip('/')}".rstrip("/")
        write(root, f"{base}/cpu.cfs_quota_us", str(quota))
        write(root, f"{base}/cpu.cfs_period_us", str(period))


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    assert parse_cpu_list("") == frozenset()
    assert parse_cpu_list("a-b") is None


def test_hyperthreads_count_once(tmp_path):
    topology(tmp_path, HT_8_4)
    b = cpu_budget(str(tmp_path), affinity=range(8))
    assert (b.logical, b.affinity, b.physical, b.quota, b.chosen) == (8, 8, 4, None, 4)
    assert "physical core" in b.reason and "8 CPUs are 4 cores" in b.reason
    assert b.quota_source is None  # no cgroup files at all


def test_core_and_package_ids_when_there_is_no_siblings_list(tmp_path):
    topology(tmp_path, HT_8_4, siblings=False)
    assert cpu_budget(str(tmp_path), affinity=range(8)).physical == 4
    # the same core_id in two packages is two cores
    for cpu, (package, core) in enumerate([(0, 0), (1, 0)]):
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(package))
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", str(core))
    assert cpu_budget(str(tmp_path), affinity=[0, 1]).physical == 2


@pytest.mark.parametrize("affinity, physical, chosen", [
    ([0, 4], 1, 1),          # both threads of one core
    ([0, 1, 2, 3], 4, 4),    # one thread of each core: every CPU a core of its own
    ([0, 1, 4], 2, 2),
    ([6], 1, 1),
])
def test_affinity_masks(tmp_path, affinity, physical, chosen):
    topology(tmp_path, HT_8_4)
    b = cpu_budget(str(tmp_path), affinity=affinity)
    assert (b.logical, b.affinity, b.physical, b.chosen) == (8, len(affinity), physical, chosen)
    if physical == len(affinity):
        assert "its affinity" in b.reason and "a core of its own" in b.reason


def test_unknown_topology_counts_every_cpu(tmp_path):
    b = cpu_budget(str(tmp_path), affinity=range(3))  # no /sys at all
    assert b.physical is None and b.affinity == 3 and b.chosen == 3
    assert "topology is unknown" in b.reason
    assert b.logical >= 3 and b.quota is None and b.quota_source is None
    # one CPU whose topology is missing makes the count unknown, not wrong
    topology(tmp_path, [[0], [1]])
    assert cpu_budget(str(tmp_path), affinity=[0, 1, 2]).physical is None


@pytest.mark.parametrize("cpu_max, quota, chosen", [
    ("200000 100000", 2.0, 2),
    ("max 100000", None, 4),
    ("max", None, 4),
    ("250000 100000", 2.5, 2),   # rounded down: the half is the parent's
    ("50000 100000", 0.5, 1),    # at least one worker
    ("1000000 100000", 10.0, 4),  # a quota above the cores changes nothing
])
def test_cgroup_v2_quota(tmp_path, cpu_max, quota, chosen):
    topology(tmp_path, HT_8_4)
    cgroup_v2(tmp_path, {"/job": cpu_max})
    b = cpu_budget(str(tmp_path), affinity=range(8))
    assert (b.quota, b.chosen) == (quota, chosen)
    assert b.quota_source is not None and "/sys/fs/cgroup/job/cpu.max" in b.quota_source
    if quota is not None and quota < 4:
        assert "quota" in b.reason and "rounded down" in b.reason and f"{quota:g} CPUs" in b.reason
    else:
        assert "physical core" in b.reason


def test_cgroup_v2_parent_limit_applies(tmp_path):
    """A limit set on an ancestor of the process's cgroup binds it too; the smallest wins."""
    topology(tmp_path, HT_8_4)
    cgroup_v2(tmp_path, {"/": "max 100000", "/slice": "300000 100000", "/slice/job": "max 100000"},
              path="/slice/job")
    b = cpu_budget(str(tmp_path), affinity=range(8))
    assert b.quota == 3.0 and b.chosen == 3 and b.quota_source.endswith("/sys/fs/cgroup/slice/cpu.max")


def test_cgroup_v2_namespaced_path_falls_back_to_the_mount(tmp_path):
    """In a container with its own cgroup namespace, /proc/self/cgroup may name a path that is not
    under the mount: the mount's own directory is the container's cgroup."""
    topology(tmp_path, HT_8_4)
    cgroup_v2(tmp_path, {"/": "200000 100000"}, path="/")
    write(tmp_path, "proc/self/cgroup", "0::/../../host/elsewhere")
    assert cpu_budget(str(tmp_path), affinity=range(8)).quota == 2.0


@pytest.mark.parametrize("quota, period, expected, chosen", [
    (150000, 100000, 1.5, 1),
    (-1, 100000, None, 4),
    (400000, 50000, 8.0, 4),
])
def test_cgroup_v1_quota(tmp_path, quota, period, expected, chosen):
    topology(tmp_path, HT_8_4)
    cgroup_v1(tmp_path, {"/": (quota, period)}, path="/")
    b = cpu_budget(str(tmp_path), affinity=range(8))
    assert (b.quota, b.chosen) == (expected, chosen)
    assert b.quota_source is not None and "cpu,cpuacct/cpu.cfs_quota_us" in b.quota_source


def test_cgroup_v1_mount_rooted_at_the_container(tmp_path):
    """Docker without a cgroup namespace: /proc/self/cgroup says /docker/abc, and the hierarchy is
    mounted with that directory as its root at /sys/fs/cgroup/cpu,cpuacct."""
    topology(tmp_path, HT_8_4)
    write(tmp_path, "proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n0::/")
    write(tmp_path, "proc/self/mountinfo",
          "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,relatime - cgroup cgroup rw,cpu,cpuacct")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000")
    b = cpu_budget(str(tmp_path), affinity=range(8))
    assert b.quota == 2.0 and b.chosen == 2


def test_cgroup_v1_nested_and_hybrid(tmp_path):
    """v1 with a limit on the process's own cgroup below the mount; a v2 hierarchy beside it
    (hybrid mode) without the cpu controller changes nothing."""
    topology(tmp_path, HT_8_4)
    cgroup_v1(tmp_path, {"/": (-1, 100000), "/docker": (-1, 100000), "/docker/abc": (300000, 100000)})
    with open(tmp_path / "proc/self/mountinfo", "a") as f:
        f.write("41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    (tmp_path / "sys/fs/cgroup/unified").mkdir(parents=True)
    b = cpu_budget(str(tmp_path), affinity=range(8))
    assert b.quota == 3.0 and b.chosen == 3


def test_no_mountinfo_guesses_the_usual_place(tmp_path):
    topology(tmp_path, [[0], [1], [2], [3]])
    write(tmp_path, "proc/self/cgroup", "0::/")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "200000 100000")
    b = cpu_budget(str(tmp_path), affinity=range(4))
    assert b.quota == 2.0 and b.chosen == 2


@pytest.mark.parametrize("bad", ["", "garbage", "abc 100000"])
def test_unreadable_quota_is_no_quota(tmp_path, bad):
    topology(tmp_path, [[0], [1]])
    cgroup_v2(tmp_path, {"/job": bad})
    b = cpu_budget(str(tmp_path), affinity=[0, 1])
    assert b.quota is None and b.chosen == 2


def test_budget_is_frozen_and_describes_itself(tmp_path):
    topology(tmp_path, HT_8_4)
    cgroup_v2(tmp_path, {"/job": "250000 100000"})
    b = cpu_budget(str(tmp_path), affinity=range(8))
    with pytest.raises(AttributeError):
        b.chosen = 8  # type: ignore[misc]
    text = b.describe()
    for part in ("8 CPUs in this process's affinity (of 8 online)", "4 physical cores", "quota of 2.5 CPUs",
                 "default n_workers 2", "rounded down"):
        assert part in text, text
    assert isinstance(b, CpuBudget)


def test_this_machine():
    """On the machine running the tests: within the affinity mask, at least one."""
    b = cpu_budget()
    assert 1 <= b.chosen <= b.affinity == len(os.sched_getaffinity(0)) <= b.logical
    assert b.physical is None or b.chosen <= b.physical
    assert M.usable_cores() == b.chosen


def test_defaults_follow_the_budget(monkeypatch):
    """ShmVecEnv's n_workers default and the parent's spin read the same budget: the parent spins
    only with fewer workers than the budget (a core left for it)."""
    from shmvec import _options

    monkeypatch.setattr(_options, "usable_cores", lambda: 3)
    # An idle machine: the other processes of a loaded one would take cores from the default.
    monkeypatch.setattr(_options, "cores_taken", lambda: _options.Taken(0, None, ""))
    assert _options.default_n_workers(64) == 3
    assert _options.default_n_workers(2) == 2
    fns = [int] * 8  # callables; never called by the checks
    options, _ = _options.Options.build(fns, start_method="fork")
    assert options.n_workers == 3 and options.parent_spin_s == 0.0
    options, _ = _options.Options.build(fns, n_workers=2, start_method="fork")
    assert options.parent_spin_s == _options.DEFAULT_PARENT_SPIN_US * 1e-6


def _proc_stat_line(pid: int, state: str, utime: int, stime: int, cpu: int) -> str:
    after = [state, "1", str(pid), str(pid), "0", "-1", "0"] + ["0"] * 4 + [str(utime), str(stime)] + ["0"] * 23 + [str(cpu)]
    return f"{pid} (a (strange) name) " + " ".join(after + ["0"] * 10) + "\n"


def test_read_load_parses_proc(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(
        "cpu  100 0 0 900 0 0 0 0 0 0\n"
        "cpu0 10 1 2 300 5 3 4 7 0 0\n"   # busy: user nice system irq softirq = 10+1+2+3+4
        "cpu1 20 0 5 300 0 0 0 0 0 0\n"
        "cpu2 999 0 0 0 0 0 0 0 0 0\n"    # not one of the cores read
        "intr 5\n")
    me, worker, gone = os.getpid(), 4242, 4343
    for pid, line in ((me, _proc_stat_line(me, "R", 50, 7, 1)), (worker, _proc_stat_line(worker, "S", 30, 2, 0))):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(line)
    (proc / str(worker) / "schedstat").write_text("123456 789000 42\n")
    load = M.read_load([0, 1], [worker, gone], root=str(tmp_path))
    assert load is not None and load.busy == 20 + 25 and load.cpus == {0: 20, 1: 25}
    assert load.own == {me: 57, worker: 32}  # a process that is gone is left out
    assert load.waits == {worker: (789000, 0, 123456)}
    assert M.read_load([0], [], root=str(tmp_path / "nowhere")) is None


def test_read_load_on_this_machine_sees_a_busy_worker():
    import subprocess
    import sys
    import time

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"])
    try:
        first = M.read_load(cpus, [busy.pid])
        time.sleep(0.5)
        second = M.read_load(cpus, [busy.pid])
    finally:
        busy.wait()
    if first is None or busy.pid not in first.waits:
        pytest.skip("/proc/<pid>/schedstat cannot be read here")
    assert second.busy - first.busy >= 0.3 * M.TICKS_PER_S  # the child's half second shows
    assert second.own[busy.pid] - first.own[busy.pid] >= 0.3 * M.TICKS_PER_S
    assert second.waits[busy.pid][1] in cpus
