"""Envs registered at run time, in the user's script, work in spawn and forkserver workers.

``gym.register("MyEnv-v0", ...)`` under ``if __name__ == "__main__":`` registers the env in the
parent only; the parent's registrations that a fresh worker lacks reach it before any factory
runs (shmvec._registrations).  Each pattern runs as users write it, in a script of its own run by
``python train.py``, and every step is compared with the reference on the same seeds
(``DummyVecEnv``, or ``SyncVectorEnv`` for ``shmvec.make_vec``).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import pytest

from helpers import TESTS_DIR, assert_same, pythonpath
from shmvec import ShmVecEnv
from shmvec._registrations import gymnasium_own_ids, pack_registrations, register_missing

TESTS = Path(TESTS_DIR)
METHODS = ("spawn", "forkserver")

# The user's script: an env class and a factory function defined in it (they reach spawned
# workers by value), the registration and the vec env under the main guard.  {entry}, {build}
# and {reference} are filled in per case.
SCRIPT = '''
import json
import sys

import gymnasium as gym
import numpy as np


class WalkEnv(gym.Env):
    """A seeded random walk, defined in the user's script."""

    metadata = {{"render_modes": ["rgb_array"]}}

    def __init__(self, size=2, render_mode=None):
        self.size = size
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.pos = np.zeros(size, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.normal(size=self.size).astype(np.float32)
        return self.pos.copy(), {{}}

    def step(self, action):
        self.pos += (int(action) - 1) + 0.1 * self.np_random.normal(size=self.size).astype(np.float32)
        terminated = bool(self.np_random.random() < 0.05)
        return self.pos.copy(), float(self.pos.sum()), terminated, False, {{"size": self.size}}


def make_walk(size=2, render_mode=None):
    return WalkEnv(size, render_mode)


def plain(x):
    """JSON for the comparison in the test."""
    if isinstance(x, dict):
        return {{str(k): plain(v) for k, v in x.items()}}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def run(env, gymnasium_api):
    """20 steps of fixed actions from a reset seeded 7."""
    rng = np.random.default_rng(0)
    if gymnasium_api:
        out = [plain(env.reset(seed=7))]
    else:
        env.seed(7)
        out = [plain(env.reset())]
    for _ in range(20):
        out.append(plain(env.step(rng.integers(0, 3, size=env.num_envs))))
    env.close()
    return out


if __name__ == "__main__":
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    import shmvec
    from shmvec import ShmVecEnv

    method = sys.argv[1]
    gym.register("MyEnv-v0", entry_point={entry}, max_episode_steps=6, kwargs={{"size": 3}})
    got = run({build}, {gymnasium_api})
    want = run({reference}, {gymnasium_api})
    print(json.dumps({{"got": got, "want": want}}))
'''

ENTRIES = {
    "class": "WalkEnv",  # a class in __main__
    "function": "make_walk",  # a function in __main__
    "module_string": '"regenvs:ModuleWalkEnv"',  # "module:Class", a module the worker can import
    "main_string": '"__main__:WalkEnv"',  # the tutorials' string form
}
BUILDS = {
    "make_vec_env": ('make_vec_env("MyEnv-v0", n_envs=4, vec_env_cls=ShmVecEnv, '
                     'vec_env_kwargs={"start_method": method})',
                     'make_vec_env("MyEnv-v0", n_envs=4, vec_env_cls=DummyVecEnv)', False),
    "lambda": ('ShmVecEnv([lambda: gym.make("MyEnv-v0")] * 4, start_method=method)',
               'DummyVecEnv([lambda: gym.make("MyEnv-v0")] * 4)', False),
    "make_vec": ('shmvec.make_vec("MyEnv-v0", num_envs=4, vector_kwargs={"start_method": method})',
                 'gym.make_vec("MyEnv-v0", num_envs=4, vectorization_mode="sync")', True),
}

REGENVS = '''
"""An env module of the user's, importable by the workers; registered in the script only."""
import gymnasium as gym
import numpy as np


class ModuleWalkEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size=2, render_mode=None):
        self.size = size
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.normal(size=self.size).astype(np.float32)
        return self.pos.copy(), {}

    def step(self, action):
        self.pos += (int(action) - 1) + 0.1 * self.np_random.normal(size=self.size).astype(np.float32)
        terminated = bool(self.np_random.random() < 0.05)
        return self.pos.copy(), float(self.pos.sum()), terminated, False, {"size": self.size}
'''


def run_script(path: Path, *args: str, timeout: float = 240.0) -> dict:
    """``python path args`` in a fresh interpreter that imports this shmvec; its last JSON line."""
    env = dict(os.environ, PYTHONPATH=pythonpath(TESTS))
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=str(path.parent), env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout
    return json.loads(lines[-1])


def write_script(tmp_path: Path, entry: str, build: str) -> Path:
    (tmp_path / "regenvs.py").write_text(REGENVS)
    code, reference, gymnasium_api = BUILDS[build]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(entry=ENTRIES[entry], build=code, reference=reference,
                                    gymnasium_api=gymnasium_api))
    return script


def check_same_run(result: dict, gymnasium_api: bool) -> None:
    got, want = result["got"], result["want"]
    assert_same(got, want, ignore=frozenset({"t"}))  # Monitor's episode["t"]: wall-clock time
    first_obs = got[0][0] if gymnasium_api else got[0]  # reset() returns (obs, infos) or obs
    assert len(first_obs) == 4 and len(first_obs[0]) == 3  # 4 envs; the spec's kwargs: size 3
    if gymnasium_api:
        truncations = sum(sum(step[3]) for step in got[1:])
    else:  # max_episode_steps=6: SB3's TimeLimit.truncated
        truncations = sum(info.get("TimeLimit.truncated", False) for step in got[1:] for info in step[3])
    assert truncations > 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("entry, build", [
    ("class", "make_vec_env"),
    ("module_string", "make_vec_env"),
    ("function", "lambda"),
    ("main_string", "lambda"),
    ("class", "make_vec"),
    ("module_string", "make_vec"),
])
def test_an_env_registered_in_the_users_script_runs_as_with_the_reference(tmp_path, entry, build, method):
    """Was: NameNotFound in the worker, with a note to use shmvec.make_env."""
    script = write_script(tmp_path, entry, build)
    check_same_run(run_script(script, method), BUILDS[build][2])


RESTART_SCRIPT = '''
import json
import os
import sys

import gymnasium as gym
import numpy as np


class CrashOnceEnv(gym.Env):
    """Kills its worker at its third step, the first time any env gets there (a marker file)."""

    def __init__(self, marker):
        self.marker = marker
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 3:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # one env only
            except FileExistsError:
                pass
            else:
                os._exit(3)
        return np.full(2, 0.5, np.float32), 1.0, False, False, {}


if __name__ == "__main__":
    import warnings

    from shmvec import ShmVecEnv

    gym.register("CrashOnce-v0", entry_point=CrashOnceEnv, kwargs={"marker": sys.argv[2]})
    env = ShmVecEnv([lambda: gym.make("CrashOnce-v0")] * 4, n_workers=2, start_method=sys.argv[1],
                    on_failure="restart")
    env.reset()
    restarted = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(6):
            _, rewards, _, infos = env.step(np.zeros(4, dtype=np.int64))
            restarted += [i for i, info in enumerate(infos) if "shmvec_restarted" in info]
    print(json.dumps({"restarts": env.restarts, "restarted": restarted, "rewards": rewards.tolist()}))
    env.close()
'''


@pytest.mark.parametrize("method", METHODS)
def test_a_restarted_worker_gets_the_registrations_too(tmp_path, method):
    """on_failure="restart" launches a new worker from the same payload: it finds the id as well."""
    script = tmp_path / "train.py"
    script.write_text(RESTART_SCRIPT)
    result = run_script(script, method, str(tmp_path / "crashed"))
    assert result["restarts"] == 1, result
    assert sorted(set(result["restarted"])) in ([0, 1], [2, 3]), result  # the envs of the worker that died
    assert result["rewards"] == [1.0] * 4


# ---------------------------------------------------------------------------------------------
# What is sent, in this process
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def registered():
    """Registers ids for one test, and removes them after."""
    ids = []

    def register(env_id, **kwargs):
        gym.register(env_id, **kwargs)
        ids.append(env_id)

    yield register
    for env_id in ids:
        gym.registry.pop(env_id, None)


def sent_specs(registrations) -> dict:
    return {env_id: pickle.loads(blob) for env_id, blob in pickle.loads(registrations.data or pickle.dumps([]))}


def test_gymnasiums_own_registrations_are_not_sent(registered):
    own = [env_id for env_id in gym.registry if env_id in gymnasium_own_ids()]
    assert "CartPole-v1" in own and "phys2d/CartPole-v1" in own and len(own) >= 60
    registered("ShmvecOwnCheck-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
               max_episode_steps=9)
    registrations = pack_registrations("spawn")
    assert not set(registrations.ids) & set(own)
    # A new id for one of Gymnasium's classes is the user's: sent, as registered.
    assert sent_specs(registrations)["ShmvecOwnCheck-v0"] == gym.spec("ShmvecOwnCheck-v0")
    assert pack_registrations("fork").data is None  # fork workers inherit the registry


def test_a_main_string_entry_point_is_sent_by_value(registered, monkeypatch):
    import testenvs

    class ScriptEnv(testenvs.SpacesEnv):
        pass

    monkeypatch.setattr(sys.modules["__main__"], "ShmvecScriptEnv", ScriptEnv, raising=False)
    registered("ShmvecMainString-v0", entry_point="__main__:ShmvecScriptEnv", kwargs={"obs_kind": "dict"})
    spec = sent_specs(pack_registrations("forkserver"))["ShmvecMainString-v0"]
    assert spec.entry_point.__name__ == "ScriptEnv" and spec.kwargs == {"obs_kind": "dict"}
    assert gym.spec("ShmvecMainString-v0").entry_point == "__main__:ShmvecScriptEnv"  # the parent's is unchanged


def test_a_worker_registers_the_ids_it_lacks_and_keeps_those_it_has(registered):
    registered("ShmvecLacked-v0", entry_point="testenvs:SpacesEnv", max_episode_steps=4, kwargs={"tag": 2})
    registered("ShmvecHad-v0", entry_point="testenvs:SpacesEnv")
    data = pack_registrations("spawn").data
    lacked, had = gym.registry.pop("ShmvecLacked-v0"), gym.registry["ShmvecHad-v0"]
    gym.registry["ShmvecHad-v0"] = mine = gym.envs.registration.EnvSpec("ShmvecHad-v0", "testenvs:SpacesEnv",
                                                                        kwargs={"tag": 5})
    assert register_missing(data) == {}
    assert gym.spec("ShmvecLacked-v0") == lacked and gym.spec("ShmvecHad-v0") is mine and mine != had
    env = gym.make("ShmvecLacked-v0")
    assert env.spec.max_episode_steps == 4 and env.unwrapped.tag == 2
    env.close()


def test_a_registration_that_cannot_be_pickled_leaves_the_others_and_says_why(registered):
    registered("ShmvecLocked-v0", entry_point="testenvs:SpacesEnv", kwargs={"lock": threading.Lock()})
    registered("ShmvecPlain-v0", entry_point="testenvs:SpacesEnv")
    registrations = pack_registrations("spawn")
    assert "ShmvecPlain-v0" in registrations.ids and "ShmvecLocked-v0" not in registrations.ids
    assert "could not be pickled (TypeError" in registrations.left_out["ShmvecLocked-v0"]
    with pytest.raises(gym.error.NameNotFound) as info:
        ShmVecEnv([lambda: gym.make("ShmvecLocked-v0")], start_method="spawn")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "'ShmvecLocked-v0' is registered in the parent process" in notes and "could not be pickled" in notes
    assert "kwargs" in notes


def test_a_registration_that_does_not_unpickle_in_the_worker_says_why(registered):
    """The parent imports a module the worker cannot (it was put on sys.path by the script)."""
    import testenvs

    registered("ShmvecGone-v0", entry_point=testenvs.SpacesEnv)  # pickled by reference: module testenvs
    data = pack_registrations("spawn").data
    spec = gym.registry.pop("ShmvecGone-v0")
    parts = [(i, blob if i != "ShmvecGone-v0" else blob.replace(b"testenvs", b"nomodule"))
             for i, blob in pickle.loads(data)]
    try:
        failed = register_missing(pickle.dumps(parts))
    finally:
        gym.registry["ShmvecGone-v0"] = spec
    assert "ShmvecGone-v0" in failed and "could not be unpickled in the worker (ModuleNotFoundError" in \
        failed["ShmvecGone-v0"]
