"""Workers never outlive a program killed while they start (issue 37, item 4).

A script builds a vec env whose workers take 30 s to start: in an env factory (our code runs
already) or, under spawn and forkserver, in the import of the script itself as ``__mp_main__``
(before any of our code runs in a spawned worker; in the fork server, which imports the script
once).  The test kills the script with SIGKILL while they are in it, and finds no process of it
alive 2 s later: workers, fork server, whatever it started.  The processes are found by a marker
in their environment, which every one of them inherits; leftovers are killed in the end, so
that a failure leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from helpers import TESTS_DIR, pythonpath

MARK = "SHMVEC_ORPHAN_TEST"
WORKERS = 2

SCRIPT = '''
import os
import sys

if __name__ == "__mp_main__" and os.environ.get("SLOW_MAIN"):
    import slowimport  # noqa: F401  (30 s, in a worker or the fork server importing this script)

import shmvec
import startupenvs

if __name__ == "__main__":
    method, where = sys.argv[1], sys.argv[2]
    factory = startupenvs.slow_cartpole if where == "factory" else startupenvs.cartpole
    shmvec.ShmVectorEnv([factory] * {workers}, n_workers={workers}, start_method=method)
'''


def _marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    continue
        except OSError:
            continue
        out.append(int(name))
    return out


def _notes(log) -> list[str]:
    try:
        return log.read_text().split()
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("start_method,where", [
    ("fork", "factory"), ("forkserver", "factory"), ("spawn", "factory"),
    ("forkserver", "main"), ("spawn", "main"),
])
def test_no_worker_outlives_a_parent_killed_during_start_up(tmp_path, start_method, where):
    mark = uuid.uuid4().hex
    log = tmp_path / "startup.log"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(workers=WORKERS))
    env = dict(os.environ, PYTHONPATH=pythonpath(TESTS_DIR), SHMVEC_STARTUP_LOG=str(log), **{MARK: mark})
    if where == "main":
        env["SLOW_MAIN"] = "1"
    # The slow step runs in each worker, or once in the fork server (which imports the script once).
    expected = 1 if (start_method, where) == ("forkserver", "main") else WORKERS
    parent = subprocess.Popen([sys.executable, str(script), start_method, where], env=env, cwd=str(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _notes(log).count("factory" if where == "factory" else "import") < expected:
            assert parent.poll() is None, parent.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the workers never reached their slow start-up"
            time.sleep(0.1)
        assert _marked(mark), "no process of the script found"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        killed = time.monotonic()
        while _marked(mark) and time.monotonic() - killed < 2.0:
            time.sleep(0.05)
        left = _marked(mark)
        assert not left, f"{len(left)} processes outlived the parent by 2 s: " + "; ".join(
            open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
            for pid in left if os.path.exists(f"/proc/{pid}/cmdline"))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stderr.close()
        for pid in _marked(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_workers_outlive_the_thread_that_started_them(start_method):
    """The parent-death signal follows the thread that started a worker: it is cleared once the
    worker is READY, so a vec env built in a thread that has ended keeps its workers."""
    import threading

    import numpy as np

    import startupenvs
    from shmvec import ShmVectorEnv

    built = []
    thread = threading.Thread(target=lambda: built.append(
        ShmVectorEnv([startupenvs.cartpole] * 2, n_workers=2, start_method=start_method)))
    thread.start()
    thread.join()
    env = built[0]
    try:
        time.sleep(0.5)  # a worker killed when the thread ended would be dead by now
        env.reset()
        for _ in range(5):
            env.step(np.zeros(2, dtype=np.int64))
        assert all(p.is_alive() for p in env._engine.workers.processes)
    finally:
        env.close()
