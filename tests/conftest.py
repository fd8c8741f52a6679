"""Leak checks shared by every test.

The autouse fixture :func:`no_leaks` fails any test that leaves behind
(a) a shared-memory segment ``/dev/shm/shmvec*``, (b) a child process, or
(c) an open file descriptor.  The checks are plain functions
(:func:`take_snapshot`, :func:`find_leaks`) so that ``test_conftest.py`` can
check that they do detect leaks.

multiprocessing's long-lived helpers are not leaks: the resource tracker and
the forkserver are started lazily, once per test session, and keep a process
and a file descriptor each.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import re
import sys
import time
from dataclasses import dataclass, field

import psutil
import pytest

# Test modules that import another directory's test helpers (test_ray.py takes test_equivalence's
# lockstep): those directories on the path, so that any test file also runs alone.
for _sub in ("frontends", "integration"):
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), _sub))

# Import the heavy libraries once, before any test takes a snapshot, so that
# descriptors they open lazily on first import are not taken for leaks.
import gymnasium  # noqa: F401

try:  # Stable-Baselines3 and torch are optional (shmvec[sb3]); without them their tests skip, see below.
    import stable_baselines3  # noqa: F401
except ModuleNotFoundError:
    pass
try:
    import torch
except ModuleNotFoundError:
    torch = None
else:
    # The policies in these tests are tiny MLPs: more torch threads would only contend, on a
    # 2-core machine, with the vec env's worker processes (and make PPO tests 30x slower).
    torch.set_num_threads(1)

# Libraries some tests need that a working install of shmvec may lack (the suite runs without
# SB3 and torch on Python versions with no CPU build of torch here).  A test module that imports
# one of them, or a test that does, is skipped with the missing module named; any other import
# error fails as usual.
OPTIONAL_MODULES = frozenset({"stable_baselines3", "torch", "sb3_contrib", "pettingzoo", "ray", "torchrl",
                              "tianshou", "rl_zoo3", "supersuit", "mpe2", "ale_py", "cv2", "matplotlib",
                              "pytest_benchmark", "envpool", "moviepy", "pygame", "pymunk"})


def missing_optional(exc: BaseException | None) -> str | None:
    """The optional module whose absence raised ``exc`` (or one of its causes), if that is what it was."""
    import importlib.util

    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            top = exc.name.split(".")[0]
            if top in OPTIONAL_MODULES and importlib.util.find_spec(top) is None:
                return top
        exc = exc.__cause__ or exc.__context__
    return None


def _skip_reason(name: str) -> str:
    return f"needs {name}, which is not installed here (the suite's full run installs it: pip install -e '.[test]')"


class OptionalModule(pytest.Module):
    """A test module that skips, with the reason, when it imports an optional library that is not installed."""

    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as err:
            name = missing_optional(err.__cause__)
            if name is None:
                raise
            pytest.skip(f"{self.path.name} {_skip_reason(name)}", allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name != "__init__.py":
        return OptionalModule.from_parent(parent, path=module_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that imports an optional library in its body skips the same way."""
    try:
        return (yield)
    except ModuleNotFoundError as exc:
        name = missing_optional(exc)
        if name is None:
            raise
        pytest.skip(_skip_reason(name))


@pytest.fixture
def one_torch_thread():
    """One torch thread for this test even if an earlier one changed it (see above), restored after."""
    if torch is None:
        pytest.skip(_skip_reason("torch"))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SHM_DIR = "/dev/shm"
SHM_PREFIX = "shmvec"
GRACE_S = 2.0


@dataclass
class Snapshot:
    shm: set[str] = field(default_factory=set)
    fds: dict[int, str] = field(default_factory=dict)
    children: dict[int, str] = field(default_factory=dict)


_LIBRARY_NAME = re.compile(rf"{SHM_PREFIX}_(\d+)_")


def shm_segments() -> set[str]:
    """Names of the ``shmvec*`` segments in /dev/shm that this process or its children may own.

    ShmVecEnv names its segments ``shmvec_<creator pid>_<random>``: segments of other
    processes on the machine (a benchmark running beside the tests) are not ours to report.
    """
    try:
        names = {name for name in os.listdir(SHM_DIR) if name.startswith(SHM_PREFIX)}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm
        return set()
    foreign = set()
    ours = None
    for name in names:
        match = _LIBRARY_NAME.match(name)
        if match:
            if ours is None:
                ours = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
            if int(match.group(1)) not in ours:
                foreign.add(name)
    return names - foreign


def helper_fds() -> set[int]:
    """Descriptors multiprocessing keeps for its lazily started, long-lived helpers."""
    fds = set()
    tracker_fd = getattr(multiprocessing.resource_tracker._resource_tracker, "_fd", None)
    if tracker_fd is not None:
        fds.add(tracker_fd)
    alive_fd = getattr(multiprocessing.forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        fds.add(alive_fd)
    return fds


def open_fds() -> dict[int, str]:
    """Open descriptors of this process (number -> target), without the helpers' ones."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor of the directory listing itself, closed by now
    for fd in helper_fds():
        out.pop(fd, None)
    return out


def helper_pids() -> set[int]:
    pids = set()
    tracker_pid = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    if tracker_pid is not None:
        pids.add(tracker_pid)
    server_pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if server_pid is not None:
        pids.add(server_pid)
    return pids


def child_processes() -> dict[int, str]:
    """Descendants of this process (pid -> description), without multiprocessing's helpers.

    The resource tracker and the forkserver are recognised by pid or, as a direct
    child, by a command line naming them.  The forkserver's own children (workers
    started with the ``forkserver`` method) have the same command line but are
    grandchildren, so they are still reported.
    """
    me = psutil.Process()
    skip = helper_pids()
    out = {}
    for proc in me.children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            status = proc.status()
            ppid = proc.ppid()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            cmdline, status, ppid = "?", "zombie", -1
        except psutil.AccessDenied:  # pragma: no cover
            cmdline, status, ppid = "?", "?", -1
        if proc.pid in skip:
            continue
        if ppid == me.pid and ("resource_tracker" in cmdline or "forkserver" in cmdline):
            continue
        out[proc.pid] = f"pid {proc.pid} ({status}): {cmdline[:200]}"
    return out


def take_snapshot() -> Snapshot:
    return Snapshot(shm=shm_segments(), fds=open_fds(), children=child_processes())


def leaks_since(before: Snapshot) -> list[str]:
    """What is open now that was not in ``before`` (one line per leak)."""
    problems = []
    for name in sorted(shm_segments() - before.shm):
        problems.append(f"shared-memory segment {SHM_DIR}/{name} left behind")
    now_fds = open_fds()
    for fd in sorted(set(now_fds) - set(before.fds)):
        problems.append(f"file descriptor {fd} -> {now_fds[fd]} left open")
    now_children = child_processes()
    for pid in sorted(set(now_children) - set(before.children)):
        problems.append(f"child process left behind: {now_children[pid]}")
    return problems


def find_leaks(before: Snapshot, grace_s: float = GRACE_S) -> list[str]:
    """:func:`leaks_since`, polled for up to ``grace_s`` so that exiting processes can be reaped."""
    deadline = time.monotonic() + grace_s
    while True:
        problems = leaks_since(before)
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(0.05)


@pytest.fixture(scope="session", autouse=True)
def session_tempdir(tmp_path_factory):
    """Every ``model.learn()`` makes an (empty) ``SB3-<date>`` logger folder in the temp dir;
    thousands of runs of the suite left thousands in /tmp.  They go to pytest's own temp
    folder instead, which pytest prunes (it keeps the last three runs).  ``SB3_LOGDIR`` (SB3's own
    variable for that folder) sends the scripts that tests run in subprocesses there too."""
    import tempfile

    before, before_env = tempfile.tempdir, os.environ.get("SB3_LOGDIR")
    tempfile.tempdir = str(tmp_path_factory.mktemp("tempdir"))
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    yield
    tempfile.tempdir = before
    if before_env is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = before_env


@pytest.fixture(autouse=True)
def no_leaks(request):
    before = take_snapshot()
    yield
    if request.node.get_closest_marker("allow_leaks"):
        return
    problems = find_leaks(before)
    if problems:
        pytest.fail("test leaked resources:\n  " + "\n  ".join(problems), pytrace=False)


def pytest_collection_modifyitems(session, config, items):
    """The Ray tests run last.  Ray's driver leaves native threads (gRPC) in this process after
    ray.shutdown(), and a worker forked from a process with such threads can crash before it
    runs a line of ours (a SIGSEGV in env construction was seen once, in a fork-based test
    that ran after them)."""
    items.sort(key=lambda item: item.nodeid.startswith("tests/integration/test_ray.py"))


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_leaks: the test checks the leak detector itself")
