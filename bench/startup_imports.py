"""Start-up of a vec env whose script imports torch and SB3 at top level, per start method.

Answers: what does each start method cost a training script that begins, as most do, with
``import torch`` and ``from stable_baselines3 import PPO``, when it builds a ``ShmVecEnv`` of
``--workers`` workers (one CartPole env each)?  Under ``spawn`` every worker imports the script
as ``__mp_main__`` (so torch and SB3 too); under ``forkserver`` shmvec has multiprocessing's
fork server import the script once and forks the workers from it; ``fork`` copies the parent.

Each point runs such a script, written to a temporary folder, in a fresh interpreter: no
forkserver, import cache or page cache of one point helps another beyond what the OS shares.
The timer starts after the script's imports and stops after the first ``reset()`` returns
(construction, every worker's start-up and imports, the handshakes).  The CPUs are recorded:
on a machine with fewer cores than workers, start-up that each worker pays (its imports) adds
up over the cores, and start-up paid once does not.

    python bench/startup_imports.py --workers 16,64 --start-methods fork,forkserver,spawn
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

SCRIPT = '''
import time
import torch  # noqa: F401  (as a training script begins)
from stable_baselines3 import PPO  # noqa: F401

import shmvec
from shmvec import ShmVecEnv


def main(n, method):
    start = time.perf_counter()
    venv = ShmVecEnv([shmvec.make_env("CartPole-v1")] * n, n_workers=n, start_method=method)
    venv.reset()
    seconds = time.perf_counter() - start
    venv.close()
    print("SECONDS", seconds)


if __name__ == "__main__":
    import sys
    main(int(sys.argv[1]), sys.argv[2])
'''


def measure(workers: int, method: str, folder: str, timeout: float) -> float:
    """Seconds to construct and first-reset the vec env, in a fresh interpreter."""
    script = os.path.join(folder, "train.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    proc = subprocess.run([sys.executable, script, str(workers), method], capture_output=True, text=True,
                          timeout=timeout, cwd=folder)
    if proc.returncode != 0:
        raise RuntimeError(f"{workers} workers, {method}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return float(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("SECONDS")))


def machine() -> dict:
    return {"cpus": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(), "platform": platform.platform(),
            "load1": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="16,64", help="comma-separated worker counts")
    parser.add_argument("--start-methods", default="fork,forkserver,spawn")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    print(f"machine: {machine()}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="shmvec-startup-") as folder:
        for n in (int(x) for x in args.workers.split(",")):
            for method in args.start_methods.split(","):
                seconds = measure(n, method, folder, args.timeout)
                rows.append({"workers": n, "start_method": method, "seconds": round(seconds, 2)})
                print(f"  {n:3d} workers {method:10s} {seconds:7.2f} s", file=sys.stderr, flush=True)
    out = {"machine": machine(), "rows": rows}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"construct + first reset, script importing torch and SB3 at top level; {out['machine']}")
    print("| workers | start method | seconds |")
    print("|---:|---|---:|")
    for r in rows:
        print(f"| {r['workers']} | {r['start_method']} | {r['seconds']:.2f} |")


if __name__ == "__main__":
    main()
