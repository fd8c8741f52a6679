"""Envs and modules whose start-up is slow, for ``tests/faults/test_startup_orphans.py``.

Each slow step first appends ``"<what> <pid>"`` to the file named by ``SHMVEC_STARTUP_LOG``, so
that a test knows the processes are in it, then sleeps 30 s (the import of torch in a worker of
a loaded machine, the build of a simulator).
"""

from __future__ import annotations

import os
import time

import gymnasium as gym

SLOW_S = 30.0


def note(what: str) -> None:
    with open(os.environ["SHMVEC_STARTUP_LOG"], "a") as f:
        f.write(f"{what} {os.getpid()}\n")


def slow_cartpole() -> gym.Env:
    """A CartPole whose construction takes 30 s."""
    note("factory")
    time.sleep(SLOW_S)
    return gym.make("CartPole-v1")


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")
