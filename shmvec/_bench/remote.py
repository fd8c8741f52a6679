"""A benchmark helper process: builds one backend in a fresh interpreter and measures it there.

Used for two things:

- start-up time and memory (``--mode footprint``): a fresh interpreter, so that what one backend
  leaves behind (imports, freed memory the allocator keeps) does not count against the next;
- backends that need an interpreter of their own (PufferLib pins numpy<2 and gymnasium<=0.29),
  stepped from the benchmark's process in the same alternating rounds as the others
  (``--mode serve``: one JSON request per line on stdin, one JSON answer per line on stdout).

Run by :class:`RemoteBackend`; ``python -m shmvec._bench.remote --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from shmvec._bench import backends as B
from shmvec._bench.measures import ACTION_BATCHES, Stepper, tree_memory

#: Vec steps taken before memory is read (buffers touched, first episodes reset).
FOOTPRINT_STEPS = 100


def _build(args: argparse.Namespace) -> tuple[B.Handle, float]:
    B.import_modules(args.backend)
    spec = B.BuildSpec(args.env, args.n_envs, args.workers, args.start_method)
    t0 = time.perf_counter()
    handle = B.build(args.backend, spec)
    handle.reset()
    return handle, time.perf_counter() - t0


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmvec._bench.remote")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--n-envs", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--start-method", default="fork")
    parser.add_argument("--mode", choices=["footprint", "serve"], required=True)
    args = parser.parse_args(argv)

    B.import_modules(args.backend)
    before = tree_memory()
    handle, startup_s = _build(args)
    paused: list[int] = []
    try:
        stepper = Stepper(handle.step, handle.sample_actions(ACTION_BATCHES), handle.envs_per_step or args.n_envs,
                          warmup_steps=FOOTPRINT_STEPS)
        after = tree_memory()
        ready = {
            "startup_s": startup_s, "workers": handle.workers, "memory_bytes": after["bytes"],
            "memory_added_bytes": after["bytes"] - before["bytes"], "memory_kind": after["kind"],
            "processes": after["processes"], "pid": os.getpid(),
        }
        _answer(ready)
        if args.mode == "footprint":
            return 0
        for line in sys.stdin:
            req = json.loads(line)
            cmd = req["cmd"]
            _signal(paused, signal.SIGCONT)
            if cmd == "chunk":
                answer = {"sps": stepper.chunk(float(req["seconds"]))}
            elif cmd == "latency":
                answer = {"us": stepper.latency_us(int(req["steps"]))}
            elif cmd == "close":
                break
            else:
                answer = {"error": f"unknown command {cmd!r}"}
            # Stopped until the next request: PufferLib's workers busy-wait for half a second after
            # their last step, on the cores the backend measured next needs.
            paused = children()
            _signal(paused, signal.SIGSTOP)
            _answer(answer)
        return 0
    finally:
        _signal(paused, signal.SIGCONT)
        handle.close()


def children(pid: int | None = None) -> list[int]:
    """The processes ``pid`` (this one) started (its backend's workers), from ``/proc``."""
    if not os.path.isdir("/proc"):
        return []
    me, out = str(os.getpid() if pid is None else pid), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rpartition(")")[2].split()[1] == me:
                        out.append(int(entry))
            except (OSError, IndexError):
                continue
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class RemoteError(RuntimeError):
    """The helper process failed: the message carries the end of its stderr."""


class RemoteBackend:
    """A backend built and stepped in a helper process (``python`` is its interpreter).

    Has the stepper interface (``chunk``, ``latency_us``) so that it joins the alternating rounds;
    use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, python: str, backend: str, spec: B.BuildSpec, mode: str = "serve",
                 timeout: float = 120.0) -> None:
        self.timeout = timeout
        self.num_envs = spec.n_envs
        self._pathdir = tempfile.TemporaryDirectory(prefix="shmvec-bench-")
        # The helper imports this package and nothing else of ours: a link to it on PYTHONPATH keeps
        # the rest of this interpreter's site-packages (numpy 2, ...) out of a foreign interpreter.
        pkg = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        os.symlink(os.path.join(pkg, "shmvec"), os.path.join(self._pathdir.name, "shmvec"))
        env = dict(os.environ)
        env["PYTHONPATH"] = self._pathdir.name
        env.setdefault("PYTHONWARNINGS", "ignore")
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, "-m", "shmvec._bench.remote", "--backend", backend, "--env", spec.env,
             "--n-envs", str(spec.n_envs), "--workers", str(spec.workers), "--start-method", spec.start_method,
             "--mode", mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True,
            cwd=self._pathdir.name,  # PufferLib's import links a `resources` folder into the working directory
        )
        try:
            self.ready = self._read()
        except BaseException:
            self.close()
            raise
        self.workers = self.ready.get("workers")

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return "\n".join(lines[-8:])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            _signal(children(self.proc.pid), signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
            what = "no answer within %.0f s" % self.timeout if not ready else f"exit code {self.proc.returncode}"
            raise RemoteError(f"benchmark helper failed ({what}):\n{self._stderr_tail()}")
        return json.loads(line)

    def request(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise RemoteError(answer["error"])
        return answer

    def chunk(self, seconds: float) -> float:
        return float(self.request(cmd="chunk", seconds=seconds)["sps"])

    def latency_us(self, n: int) -> list[float]:
        return list(self.request(cmd="latency", steps=n)["us"])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal(children(self.proc.pid), signal.SIGKILL)  # (stopped between requests, they would stay)
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stdin):
            if f is not None and not f.closed:
                f.close()
        self._stderr.close()
        self._pathdir.cleanup()

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def footprint(python: str, backend: str, spec: B.BuildSpec, timeout: float = 120.0) -> dict[str, Any]:
    """Start-up time (construct + first reset) and memory of ``backend`` in a fresh interpreter."""
    with RemoteBackend(python, backend, spec, mode="footprint", timeout=timeout) as r:
        return dict(r.ready)


if __name__ == "__main__":
    sys.exit(main())
