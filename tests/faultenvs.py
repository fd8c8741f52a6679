"""Envs that fail in the ways a real simulator does, for tests/faults/test_faults.py.

Module level, so that ``spawn`` and ``forkserver`` workers can import them.  An
env that must fail only once (so that its restarted copy carries on) leaves a
marker file: the new process sees it and behaves.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import threading
import time

import gymnasium as gym
import numpy as np

import testenvs


class UnpicklableError(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def _end_process(how: str) -> None:
    """Ends the calling process the way a crash would."""
    # (A worker's faulthandler writes to shmvec's crash pipe, not to stderr: no stack dump shows up
    # in the test output for a crash on purpose, and the tests read the one shmvec attaches.)
    if how == "segv":
        ctypes.string_at(0)  # reads address 0: SIGSEGV in native code
    elif how == "abort":
        os.abort()  # SIGABRT, as a failed C assert
    elif how == "exit":
        os._exit(3)
    elif how == "kill":  # what the OOM killer sends
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "raise":
        raise testenvs.EnvBoom("crashed on purpose")
    elif how == "raise_unpicklable":
        raise UnpicklableError("holds a lock")
    elif how == "hang":
        time.sleep(600)
    elif how == "nap":  # a slow step, that ends
        time.sleep(1.5)
        return
    elif how == "oom":
        exhaust_memory()
    else:
        raise ValueError(how)
    time.sleep(10)  # a signal may take a moment to land


def exhaust_memory() -> None:
    """Caps this process's address space a little above its current size, then allocates past it.

    Python raises MemoryError, as it does when a machine runs out of memory without an OOM killer.
    """
    with open("/proc/self/status") as f:
        vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = vm_kb * 1024 + (64 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    np.ones(1 << 30, dtype=np.uint8)  # 1 GiB


class CrashEnv(testenvs.SpacesEnv):
    """A deterministic SpacesEnv that crashes (``how``) in ``step`` after ``at`` steps, or in ``where``.

    ``once``: a path; the env crashes only if that file does not exist yet, and creates it
    first, so that the restarted env carries on.  ``where`` is ``"step"``, ``"reset"`` (the
    ``at``-th reset), ``"close"``, or ``"attr"`` (reading the attribute ``explode``).
    """

    def __init__(self, index: int = 0, at: int | None = None, how: str = "kill", where: str = "step",
                 once: str | None = None, obs_kind: str = "box") -> None:
        super().__init__(obs_kind, "discrete", term_prob=0.0, info_every=10**9, tag=index)
        self.at = at
        self.how = how
        self.where = where
        self.once = once
        self.steps = 0
        self.resets = 0
        self.nap_s = 0.0  # a slow step, to kill a worker in the middle of one

    def _maybe_crash(self, where: str, count: int) -> None:
        if self.at is None or where != self.where or count < self.at:
            return
        if self.once is not None:
            if os.path.exists(self.once):
                return
            with open(self.once, "w"):
                pass
        _end_process(self.how)

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        self._maybe_crash("reset", self.resets)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        self._maybe_crash("step", self.steps)
        if self.nap_s:
            time.sleep(self.nap_s)
        return super().step(action)

    def set_nap(self, seconds: float) -> None:
        """Through env_method (set_attr would set the attribute on the TimeLimit wrapper)."""
        self.nap_s = seconds

    @property
    def explode(self) -> int:
        self._maybe_crash("attr", self.at or 0)
        return self.tag

    def close(self):
        self._maybe_crash("close", self.at or 0)


def make_crash_env(index: int = 0, at: int | None = None, how: str = "kill", where: str = "step",
                   once: str | None = None, max_steps: int = 25, obs_kind: str = "box") -> gym.Env:
    return gym.wrappers.TimeLimit(CrashEnv(index, at, how, where, once, obs_kind), max_episode_steps=max_steps)


def crashing_factory(how: str = "segv") -> gym.Env:
    """A factory that ends its worker (``how``, as ``_end_process``) before it returns an env."""
    _end_process(how)
    raise AssertionError("unreachable")


class DumpSignalTakerEnv(CrashEnv):
    """A CrashEnv that puts the default action back on shmvec's DUMP_SIGNAL (which would kill the
    process), as an env that takes a signal for itself may: shmvec must not send it then."""

    def __init__(self, index: int = 0, **kwargs) -> None:
        from shmvec._crash import DUMP_SIGNAL

        super().__init__(index, **kwargs)
        signal.signal(DUMP_SIGNAL, signal.SIG_DFL)


def make_dump_signal_taker_env(index: int = 0, **kwargs) -> gym.Env:
    return DumpSignalTakerEnv(index, **kwargs)


class FlakyFactoryError(Exception):
    pass


def flaky_factory(marker: str, index: int = 0) -> gym.Env:
    """Builds an env the first time (leaving ``marker``), raises every time after: a restart cannot succeed."""
    if os.path.exists(marker):
        raise FlakyFactoryError("the simulator's licence server is gone")
    with open(marker, "w"):
        pass
    return make_crash_env(index, at=2, how="kill")


class RebuiltDiffersEnv(CrashEnv):
    """A CrashEnv whose rebuilt copy (built once the ``once`` marker exists) resets differently:
    ``rebuilt="slow"`` naps 0.3 s in each reset, ``"raise"`` raises there; ``reset_blob`` bytes of
    reset info (more than a small mailbox: the pipe)."""

    def __init__(self, index: int = 0, rebuilt: str = "slow", reset_blob: int = 0, **kwargs) -> None:
        super().__init__(index, **kwargs)
        self.rebuilt = rebuilt if self.once is not None and os.path.exists(self.once) else None
        self.reset_blob = reset_blob

    def reset(self, *, seed=None, options=None):
        if self.rebuilt == "slow":
            time.sleep(0.3)
        elif self.rebuilt == "raise":
            raise testenvs.EnvBoom("the rebuilt env fails to reset")
        obs, info = super().reset(seed=seed, options=options)
        if self.reset_blob:
            info = dict(info, blob=np.zeros(self.reset_blob, dtype=np.uint8))
        return obs, info


def make_rebuilt_differs_env(index: int = 0, **kwargs) -> gym.Env:
    return gym.wrappers.TimeLimit(RebuiltDiffersEnv(index, **kwargs), max_episode_steps=25)


class StuckBeforeSendingEnv(CrashEnv):
    """At step ``at``, returns an info larger than a small mailbox (so that it goes through the
    pipe once the step is complete, protocol step 6b) and leaves its worker stuck before sending
    it, as a worker stopped (SIGSTOP) or caught in native code right then.  Only once (``once``)."""

    def __init__(self, index: int = 0, at: int = 2, once: str = "", blob: int = 20_000) -> None:
        super().__init__(index)
        self.stuck_at, self.marker, self.blob = at, once, blob

    def step(self, action):
        obs, rew, term, trunc, info = super().step(action)
        if self.steps == self.stuck_at and not os.path.exists(self.marker):
            with open(self.marker, "w"):
                pass
            from multiprocessing.connection import Connection
            Connection.send_bytes = lambda *args, **kwargs: time.sleep(600)  # this process only
            info = dict(info, blob=np.zeros(self.blob, dtype=np.uint8))
        return obs, rew, term, trunc, info


def make_stuck_before_sending_env(index: int = 0, **kwargs) -> gym.Env:
    return gym.wrappers.TimeLimit(StuckBeforeSendingEnv(index, **kwargs), max_episode_steps=25)
