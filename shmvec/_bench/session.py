"""What every benchmark run shares: the machine it runs on, a progress line, a backend opened as a stepper.

- :func:`machine`: the CPU, its budget (:func:`shmvec._machine.cpu_budget`), Python and the
  libraries' versions, recorded with every result;
- :class:`Progress`: the progress line on stderr;
- :class:`LocalBackend`: a backend built in this interpreter, with the stepper interface
  (``chunk(seconds)``) that :func:`shmvec._bench.measures.side_by_side` measures;
- :func:`describe_error`: an exception in one line, for the notes of skipped backends.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict
from typing import Any

from shmvec._bench import backends as B
from shmvec._bench.measures import ACTION_BATCHES, Stepper
from shmvec._machine import cpu_budget


def machine() -> dict[str, Any]:
    """The machine a run measured: ``cores`` (the CPU budget's choice, the default number of
    workers), ``cpu_budget`` (what it was chosen from), the CPU model, Python and library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for mod in ("numpy", "gymnasium", "stable_baselines3", "envpool"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing or broken optional package is just not listed
            pass
    budget = cpu_budget()
    return {"cores": budget.chosen, "cpu_budget": asdict(budget), "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions}


class Progress:
    """A progress line on stderr: ``[k/n] pct elapsed what``; redrawn in place on a terminal."""

    def __init__(self, total: int, enabled: bool = True, stream: Any = None) -> None:
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()

    def show(self, what: str) -> None:
        if not self.enabled or not (what or self.tty):
            return
        pct = 100 * self.done / self.total
        line = f"[{self.done:>3}/{self.total}] {pct:3.0f}% {time.monotonic() - self.t0:5.0f}s  {what}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:120])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def advance(self, what: str = "") -> None:
        self.done += 1
        self.show(what)

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def describe_error(e: BaseException) -> str:
    """``Type: first line of the message``."""
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


class LocalBackend:
    """A backend built in this interpreter, reset, and stepped ``warmup_steps`` vec steps; then a
    stepper (``chunk``, ``latency_us``) for :func:`shmvec._bench.measures.side_by_side`."""

    def __init__(self, name: str, spec: B.BuildSpec, warmup_steps: int = 20) -> None:
        self.handle = B.build(name, spec)
        try:
            self.handle.reset()
            self.stepper = Stepper(self.handle.step, self.handle.sample_actions(ACTION_BATCHES),
                                   self.handle.envs_per_step or spec.n_envs, warmup_steps=warmup_steps)
        except BaseException:
            self.handle.close()
            raise
        self.workers = self.handle.workers

    def chunk(self, seconds: float) -> float:
        return self.stepper.chunk(seconds)

    def latency_us(self, n: int) -> list[float]:
        return self.stepper.latency_us(n)

    def close(self) -> None:
        self.handle.close()
