"""Registrations that name ``__main__`` travel to every worker (issue 36, item 10).

A script, a notebook or ``python -c`` registers an env whose entry point is ``"__main__:MainEnv"``
and whose ``additional_wrappers`` name a wrapper of ``__main__``.  A spawn or forkserver worker of
``python -c`` (or a notebook, or stdin) has a ``__main__`` of its own, without those names; a
worker of a script file imports the script as ``__mp_main__`` and has them.  Each way of using
the registration must build the envs, with the wrapper applied, under every start method, from
``python -c`` and from a script file:

- ``shmvec.make_vec("X-v0")``, whose factory carries the spec itself;
- ``ShmVecEnv([lambda: gym.make("X-v0")])``: the worker looks the id up in the registrations it
  was sent;
- ``ShmVecEnv([shmvec.make_env("X-v0")])``: an ``EnvFactory`` holding the spec's fields.

Each case runs in a fresh interpreter (the registrations are made in its ``__main__``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, pythonpath

SCRIPT = '''
import json
import sys

import gymnasium as gym
import numpy as np

import shmvec


class MainEnv(gym.Env):
    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, level=0):
        self.level = level

    def reset(self, *, seed=None, options=None):
        return np.full(2, self.level, np.float32), {}

    def step(self, action):
        return np.full(2, self.level, np.float32), 1.0, False, False, {}


class MainWrapper(gym.ObservationWrapper):
    def __init__(self, env, add=0.0):
        super().__init__(env)
        self.add = add

    def observation(self, obs):
        return obs + np.float32(self.add)


gym.register("MainPlain-v0", entry_point="__main__:MainEnv", kwargs={"level": 2})
gym.register("MainWrapped-v0", entry_point="__main__:MainEnv", kwargs={"level": 1}, max_episode_steps=7,
             additional_wrappers=(gym.envs.registration.WrapperSpec("MainWrapper", "__main__:MainWrapper",
                                                                     {"add": 0.5}),))


def first_obs(venv):
    try:
        obs = venv.reset()
        obs = obs[0] if isinstance(obs, tuple) else obs
        return [float(x) for x in np.asarray(obs)[:, 0]]
    finally:
        venv.close()


def run(method):
    import importlib.util

    # ShmVecEnv where SB3 is installed, else the Gymnasium face: the same factories, the same workers.
    face = shmvec.ShmVecEnv if importlib.util.find_spec("stable_baselines3") else shmvec.ShmVectorEnv
    out = {}
    for env_id in ("MainPlain-v0", "MainWrapped-v0"):
        for how in ("make_vec", "lambda", "make_env"):
            try:
                if how == "make_vec":
                    venv = shmvec.make_vec(env_id, num_envs=2, vector_kwargs={"start_method": method})
                elif how == "lambda":
                    venv = face([lambda: gym.make(env_id)] * 2, start_method=method)
                else:
                    venv = face([shmvec.make_env(env_id)] * 2, start_method=method)
                out[f"{env_id} {how}"] = first_obs(venv)
            except Exception as exc:
                out[f"{env_id} {how}"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    run(sys.argv[-1])
'''

EXPECTED = {"MainPlain-v0": [2.0, 2.0], "MainWrapped-v0": [1.5, 1.5]}


@pytest.mark.parametrize("source", ["python -c", "script file"])
@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_main_registrations_travel(tmp_path, source, start_method):
    env = dict(os.environ, PYTHONPATH=pythonpath(TESTS_DIR))
    if source == "python -c":
        cmd = [sys.executable, "-c", SCRIPT, start_method]
    else:
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        cmd = [sys.executable, str(script), start_method]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    wanted = {f"{env_id} {how}": obs for env_id, obs in EXPECTED.items() for how in ("make_vec", "lambda", "make_env")}
    assert found == wanted
