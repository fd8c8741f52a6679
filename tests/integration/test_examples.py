"""Each script in examples/ runs to the end with a tiny setting (in a subprocess, as a user runs it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT, pythonpath, SB3

ROOT = Path(REPO_ROOT)
EXAMPLES = ROOT / "examples"
HAVE_ATARI = all(importlib.util.find_spec(name) is not None for name in ("ale_py", "cv2"))


def run_example(name: str, *args: str, timeout: float = 150.0) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath()
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@SB3
def test_ppo_cartpole_many_envs():
    out = run_example("ppo_cartpole_many_envs.py", "--n-envs", "4", "--n-workers", "2", "--steps", "256",
                      "--n-steps", "16")
    assert "DummyVecEnv  4 envs, 256 steps" in out
    assert "ShmVecEnv    4 envs, 256 steps" in out
    assert "same episodes and weights: True" in out


@pytest.mark.parametrize("kind", ["frames", pytest.param("atari", marks=pytest.mark.skipif(
    not HAVE_ATARI, reason="needs ale-py and OpenCV"))])
@SB3
def test_image_env(kind):
    out = run_example("image_env.py", "--env", kind, "--n-envs", "2", "--steps", "32", "--n-steps", "16")
    assert ("PongNoFrameskip-v4" if kind == "atari" else "SquareEnv") in out
    assert "(84, 84, 4) uint8" in out if kind == "atari" else "(84, 84, 1) uint8" in out
    assert "PPO CnnPolicy: 32 steps" in out


@SB3
def test_custom_registered_env_spawn():
    out = run_example("custom_registered_env_spawn.py", "--n-envs", "4", "--steps", "256")
    # the default n_workers: the cores, less those other processes keep busy (a loaded machine has fewer)
    assert re.search(r"4 x GridWalk-v0 \(size 8\) in \d+ spawned workers", out), out
    assert "PPO, 256 steps" in out


@pytest.mark.skipif(not all(importlib.util.find_spec(name) for name in ("pettingzoo", "mpe2")),
                    reason="needs pettingzoo and mpe2")
@SB3
def test_multi_agent_ppo():
    out = run_example("multi_agent_ppo.py", "--n-envs", "4", "--n-workers", "2", "--steps", "6144",
                      "--n-steps", "64", "--eval-episodes", "1")
    assert "4 x simple_spread_v3 (agents agent_0, agent_1, agent_2): 12 rows" in out
    assert "before training: mean episode reward per agent" in out
    assert "after 6144 agent steps" in out and "improvement:" in out
