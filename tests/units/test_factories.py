"""Spawn-safe factories, picklability checks, plain-data descriptions, start-up options, isolation.

Scripts that must run in a fresh interpreter (a user's ``__main__`` under spawn, a forkserver
that no earlier test started) run as real subprocesses: ``python script.py``.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor

import factory_envs
import testenvs
from helpers import TESTS_DIR, assert_same, pythonpath
import shmvec
from shmvec import ShmVecEnv
from shmvec.factories import (
    DescriptionError,
    EnvFactory,
    UnpicklableFactoryError,
    describe_factory,
    factory_from_description,
    find_unpicklable,
    make_env,
)

TESTS = Path(TESTS_DIR)
HEAVY = ("torch", "stable_baselines3")


def run_script(path: Path, timeout: float = 150.0) -> subprocess.CompletedProcess:
    """Runs ``python path`` in a fresh interpreter that imports this checkout of shmvec."""
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath(TESTS)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(path.parent), env=env)


def last_json(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line in the script's output:\n{out}"
    return json.loads(lines[-1])


def rollout(env, n_steps: int, seed=0) -> list:
    """Observations, rewards and dones of ``n_steps`` fixed actions from a seeded reset."""
    env.seed(seed)
    out = [env.reset()]
    rng = np.random.default_rng(1)
    for _ in range(n_steps):
        actions = rng.integers(0, 2, size=env.num_envs)
        obs, rew, dones, _ = env.step(actions)
        out.append((obs, rew, dones))
    return out


# ---------------------------------------------------------------------------------------------
# make_env
# ---------------------------------------------------------------------------------------------

def test_make_env_builds_what_gym_make_builds():
    factory = make_env("CartPole-v1", max_episode_steps=7, render_mode="rgb_array",
                       wrappers=[gym.wrappers.RecordEpisodeStatistics])
    assert isinstance(factory, EnvFactory)
    assert factory.env_id == "CartPole-v1"
    assert "CartPole-v1" in repr(factory) and "RecordEpisodeStatistics" in repr(factory)
    env = factory()
    ref = gym.make("CartPole-v1", max_episode_steps=7, render_mode="rgb_array")
    try:
        assert isinstance(env, gym.wrappers.RecordEpisodeStatistics)
        assert env.unwrapped.spec.kwargs == ref.unwrapped.spec.kwargs
        assert env.spec.max_episode_steps == 7 and env.render_mode == "rgb_array"
        assert_same(env.reset(seed=3), ref.reset(seed=3))
        for _ in range(7):
            got, want = env.step(1), ref.step(1)
            assert_same(got[:4], want[:4])
        assert got[3] and want[3]  # truncated by the TimeLimit of max_episode_steps=7
    finally:
        env.close()
        ref.close()
    # Each call builds a new env; the factory survives plain pickle (it is plain data).
    again = pickle.loads(pickle.dumps(factory))
    assert again == factory
    a, b = again(), again()
    assert a is not b
    a.close()
    b.close()


def test_make_env_of_an_env_spec():
    spec = gym.spec("CartPole-v1")
    factory = make_env(spec, max_episode_steps=3)
    assert factory.env_id == "CartPole-v1" and factory.module is None
    env = factory()
    try:
        env.reset(seed=0)
        assert [env.step(0)[3] for _ in range(3)] == [False, False, True]
    finally:
        env.close()


def test_make_env_of_a_callable_carries_an_import_string():
    factory = make_env(factory_envs.ProbeEnv, size=5, wrappers=[(gym.wrappers.TimeLimit, {"max_episode_steps": 4})])
    assert factory.entry == "factory_envs:ProbeEnv"
    assert factory.to_dict()["wrappers"] == [{"entry": "gymnasium.wrappers.common:TimeLimit",
                                             "kwargs": {"max_episode_steps": 4}}]
    env = factory()
    assert env.observation_space.shape == (5,) and isinstance(env, gym.wrappers.TimeLimit)
    env.close()


def test_make_env_errors_in_the_parent():
    with pytest.raises(gym.error.Error):
        make_env("NoSuchEnvAnywhere-v0")
    with pytest.raises(ModuleNotFoundError):
        make_env("no_such_module_xyz:FactoryProbe-v0")
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="callable that returns a new env"):
        make_env(env)
    env.close()


def test_module_id_imports_its_module_in_spawned_workers():
    factory = make_env("factory_envs:FactoryProbe-v0", size=2)
    assert factory.module == "factory_envs"
    env = ShmVecEnv([factory] * 2, n_workers=2, start_method="spawn")
    try:
        assert env.reset().shape == (2, 2)
        assert env.get_attr("size") == [2, 2]
    finally:
        env.close()


# Heavy imports stay under the main guard: spawned workers re-run this script's top level.
_REGISTER_SCRIPT = '''
import json, sys, traceback
import gymnasium as gym


class LocalEnv(gym.Env):
    """Defined in __main__: a spawned worker gets it by value (cloudpickle)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,))
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, False, {}


def outcome(build):
    try:
        venv = build()
    except BaseException as exc:
        return {"error": type(exc).__name__, "notes": getattr(exc, "__notes__", [])}
    try:
        venv.reset()
        venv.step([0] * venv.num_envs)
        return {"ok": venv.num_envs}
    finally:
        venv.close()


if __name__ == "__main__":
    from stable_baselines3.common.vec_env import SubprocVecEnv
    from shmvec import ShmVecEnv, make_env

    gym.register(id="RuntimeRegistered-v0", entry_point="mymodule:MyEnv", max_episode_steps=5)
    gym.register(id="MainDefined-v0", entry_point=LocalEnv)
    result = {}
    result["sb3_lambda"] = outcome(lambda: SubprocVecEnv([lambda: gym.make("RuntimeRegistered-v0")],
                                                         start_method="spawn"))
    result["shm_lambda"] = outcome(lambda: ShmVecEnv([lambda: gym.make("RuntimeRegistered-v0")] * 2,
                                                     start_method="spawn"))
    result["shm_make_env_spawn"] = outcome(lambda: ShmVecEnv([make_env("RuntimeRegistered-v0")] * 2,
                                                             start_method="spawn"))
    result["shm_make_env_forkserver"] = outcome(lambda: ShmVecEnv([make_env("RuntimeRegistered-v0")] * 3,
                                                                  n_workers=2, start_method="forkserver"))
    result["shm_main_class_spawn"] = outcome(lambda: ShmVecEnv([make_env("MainDefined-v0")] * 2,
                                                               start_method="spawn"))
    try:
        make_env("MainDefined-v0").to_dict()
    except Exception as exc:
        result["describe_main_class"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result))
'''

_MYMODULE = '''
import gymnasium as gym
import numpy as np


class MyEnv(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(3, dtype=np.float32), 1.0, False, False, {}
'''


def test_env_registered_at_run_time_in_main_works_under_spawn_and_forkserver(tmp_path):
    """The case SB3's SubprocVecEnv fails with NameNotFound: gymnasium.register() in the user's script."""
    (tmp_path / "mymodule.py").write_text(_MYMODULE)
    script = tmp_path / "train.py"
    script.write_text(_REGISTER_SCRIPT)
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    # SB3: the spawned worker raises NameNotFound (printed on its stderr); the parent sees a dead pipe.
    assert "error" in result["sb3_lambda"], result
    assert "NameNotFound" in proc.stderr
    # shmvec with the same lambda: the parent's registrations reach the workers (test_registration.py).
    assert result["shm_lambda"] == {"ok": 2}, result
    # shmvec.make_env carries the resolved spec: it works.
    assert result["shm_make_env_spawn"] == {"ok": 2}, result
    assert result["shm_make_env_forkserver"] == {"ok": 3}, result
    # An entry point defined in __main__ travels by value (cloudpickle) but is not plain data.
    assert result["shm_main_class_spawn"] == {"ok": 2}, result
    assert result["describe_main_class"].startswith("DescriptionError") and "import string" in \
        result["describe_main_class"]


_INTERACTIVE_MAIN_ENTRY = """
import json
import numpy as np, gymnasium as gym
from gymnasium import spaces
from shmvec import ShmVecEnv, make_env

class MyEnv(gym.Env):
    observation_space = spaces.Box(0, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}
    def step(self, a):
        return np.ones(2, np.float32), 1.0, False, False, {}

gym.register(id="MainString-v0", entry_point="__main__:MyEnv", max_episode_steps=5)
out = {}
for method in ("spawn", "forkserver"):
    env = ShmVecEnv([make_env("MainString-v0")] * 2, start_method=method)
    try:
        env.reset()
        out[method] = env.step(np.zeros(2, dtype=np.int64))[1].tolist()
    finally:
        env.close()
print(json.dumps(out))
"""


def test_a_main_string_entry_point_registered_in_an_interactive_session_works_under_spawn():
    """``gym.register(entry_point="__main__:MyEnv")`` (the tutorials' string form) in ``python -c``,
    a notebook or stdin: a spawned worker's ``__main__`` has no ``MyEnv``; make_env resolves the
    string in the parent and sends the class by value (was: AttributeError in the worker)."""
    proc = subprocess.run([sys.executable, "-c", _INTERACTIVE_MAIN_ENTRY], capture_output=True, text=True,
                          timeout=150, env=dict(os.environ, PYTHONPATH=pythonpath(TESTS)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout) == {"spawn": [1.0, 1.0], "forkserver": [1.0, 1.0]}


def test_a_script_piped_through_stdin_under_spawn_gets_an_error_that_says_why():
    """``python - < train.py``: a spawned worker re-imports ``__main__`` from "<stdin>", which is no
    file; the error says so (it used to blame a missing ``__main__`` guard, which is there)."""
    script = ("import numpy as np\nfrom shmvec import ShmVecEnv, make_env\n"
              "if __name__ == '__main__':\n    ShmVecEnv([make_env('CartPole-v1')] * 2, start_method='spawn')\n")
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=150,
                          env=dict(os.environ, PYTHONPATH=pythonpath(TESTS)))
    assert proc.returncode != 0
    assert "WorkerDiedError" in proc.stderr and "'<stdin>'" in proc.stderr and "Save the script" in proc.stderr
    assert "__main__\":`" not in proc.stderr.splitlines()[-1]


def test_closures_partials_and_make_vec_env_keep_working_under_spawn():
    scale = 3

    def closure():
        return testenvs.make_bare_env(index=scale)

    fns = [closure, lambda: testenvs.make_bare_env(index=4), functools.partial(testenvs.make_bare_env, index=5)]
    env = ShmVecEnv(fns, n_workers=2, start_method="spawn")
    try:
        env.reset()
        assert env.get_attr("tag") == [3, 4, 5]
    finally:
        env.close()
    env = make_vec_env("CartPole-v1", n_envs=3, vec_env_cls=ShmVecEnv, vec_env_kwargs={"start_method": "spawn"})
    try:
        assert env.reset().shape == (3, 4)
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# Picklability, checked before any worker starts
# ---------------------------------------------------------------------------------------------

def _children_now() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_unpicklable_socket_in_a_closure_is_named_with_its_path():
    server = socket.socket()
    try:
        def make_client_env():
            server.getsockname()
            return testenvs.make_bare_env()

        fns = [testenvs.make_bare_env] * 3 + [make_client_env]
        before = _children_now()
        with pytest.raises(UnpicklableFactoryError) as info:
            ShmVecEnv(fns, n_workers=2, start_method="fork")
        assert _children_now() <= before  # raised before any worker started
        msg = str(info.value)
        assert "env_fns[3] -> closure variable 'server' -> socket.socket" in msg, msg
        assert "inside the env or inside its factory" in msg and "host and port" in msg
        assert isinstance(info.value, TypeError)  # as before: an UnpicklableFactoryError is a TypeError
    finally:
        server.close()


def test_unpicklable_lock_in_a_partial_is_named_with_its_path():
    lock = threading.Lock()
    fns = [functools.partial(testenvs.make_bare_env, 0), functools.partial(testenvs.make_bare_env, 1, lock=lock)]
    with pytest.raises(UnpicklableFactoryError, match=r"env_fns\[1\] -> partial keyword 'lock' -> _thread\.lock"):
        ShmVecEnv(fns, n_workers=1, start_method="spawn")


class _SimClient:
    """Holds a C-extension handle (an sqlite3 connection); its bound method is the factory."""

    def __init__(self) -> None:
        self.config = {"size": 3}
        self.db = sqlite3.connect(":memory:")

    def build(self) -> gym.Env:
        return factory_envs.ProbeEnv(self.config["size"])


def test_unpicklable_c_extension_handle_behind_a_bound_method_is_named():
    client = _SimClient()
    try:
        with pytest.raises(UnpicklableFactoryError) as info:
            ShmVecEnv([client.build, client.build], start_method="fork")
        assert ("env_fns[0] -> self of bound method '_SimClient.build' -> attribute 'db' -> sqlite3.Connection"
                in str(info.value)), str(info.value)
    finally:
        client.db.close()


def test_find_unpicklable_walks_containers_and_nested_closures():
    lock = threading.Lock()
    settings = {"hosts": ["a", "b"], "guard": [1, lock]}

    def inner():
        return settings

    def outer():
        return inner()

    path, error = find_unpicklable(outer, "fn")
    assert path == ["fn", "closure variable 'inner'", "closure variable 'settings'", "['guard']", "[1]",
                    "_thread.lock"]
    assert isinstance(error, TypeError)


def test_env_instance_instead_of_factory_says_to_pass_a_callable():
    env = testenvs.make_bare_env()
    try:
        with pytest.raises(TypeError, match=r"env_fns\[0\] is a SpacesEnv instance.*callable that returns a new env"):
            ShmVecEnv([env] * 4, start_method="fork")
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# Plain-data descriptions
# ---------------------------------------------------------------------------------------------

def test_describe_and_rebuild_give_the_same_vec_env():
    fns = ([make_env("factory_envs:FactoryProbe-v0", size=4)] * 3
           + [functools.partial(factory_envs.make_probe, 4)] + [factory_envs.make_probe_4])
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", worker_threads=None, spin_us=(0.0, 10.0))
    try:
        env.seed(np.random.SeedSequence(2024))
        env.set_options({"unused": 1})
        description = env.describe()
        text = json.dumps(description)  # plain data: JSON round trip
        env.seed(np.random.SeedSequence(2024))
        want = rollout_no_seed(env, 30)
    finally:
        env.close()
    loaded = json.loads(text)
    assert loaded["n_envs"] == 5 and loaded["n_workers"] == 2
    assert loaded["env_fns"][0]["repeat"] == 3
    assert loaded["options"]["spin_us"] == [0.0, 10.0]
    rebuilt = ShmVecEnv.from_description(loaded, start_method="spawn")
    try:
        assert rebuilt.start_method == "spawn" and rebuilt.n_workers == 2
        assert rebuilt._options_arg == {"unused": 1}
        got = rollout_no_seed(rebuilt, 30)  # seeds come from the description
    finally:
        rebuilt.close()
    assert_same(got, want)


def test_shmvec_rebuild_builds_a_shm_vec_env_by_default():
    """``shmvec.rebuild(d)`` is ``ShmVecEnv.from_description(d)``; ``cls`` picks another class."""
    env = ShmVecEnv([make_env("factory_envs:FactoryProbe-v0", size=2)] * 2, n_workers=1, start_method="fork")
    try:
        env.seed(7)
        description = json.loads(json.dumps(env.describe()))
        env.seed(7)
        want = rollout_no_seed(env, 10)
    finally:
        env.close()
    rebuilt = shmvec.rebuild(description)
    try:
        assert type(rebuilt) is ShmVecEnv and rebuilt.num_envs == 2 and rebuilt.n_workers == 1
        assert_same(rollout_no_seed(rebuilt, 10), want)  # the seed comes from the description
    finally:
        rebuilt.close()

    class Probe(ShmVecEnv):
        pass

    rebuilt = shmvec.rebuild(description, Probe, n_workers=2)
    try:
        assert type(rebuilt) is Probe and rebuilt.n_workers == 2
    finally:
        rebuilt.close()
    with pytest.raises(DescriptionError, match="not a ShmVecEnv description"):
        shmvec.rebuild({"env_fns": []})


def rollout_no_seed(env, n_steps: int) -> list:
    out = [env.reset()]
    rng = np.random.default_rng(1)
    for _ in range(n_steps):
        obs, rew, dones, _ = env.step(rng.integers(0, 2, size=env.num_envs))
        out.append((obs, rew, dones))
    return out


def test_make_vec_env_factories_are_described_and_rebuilt_by_sb3():
    env = make_vec_env("CartPole-v1", n_envs=3, seed=11, vec_env_cls=ShmVecEnv,
                       vec_env_kwargs={"start_method": "fork", "n_workers": 2})
    try:
        description = json.loads(json.dumps(env.describe()))
        want = rollout_no_seed(env, 40)
    finally:
        env.close()
    factories = [run["factory"] for run in description["env_fns"]]
    assert [f["type"] for f in factories] == ["sb3_make_vec_env"] * 3
    assert [f["rank"] for f in factories] == [0, 1, 2] and factories[0]["env_id"] == "CartPole-v1"
    assert description["seed"] == 11
    rebuilt = ShmVecEnv.from_description(description)
    try:
        got = rollout_no_seed(rebuilt, 40)
        assert rebuilt.env_is_wrapped(Monitor) == [True] * 3
    finally:
        rebuilt.close()
    assert_same(got, want)


def test_make_vec_env_of_a_make_env_factory_is_described():
    """make_vec_env(make_env(id), ...): SB3's Monitor and seeding, shmvec's spawn-safe spec."""
    env = make_vec_env(make_env("factory_envs:FactoryProbe-v0", size=2), n_envs=2, seed=3, vec_env_cls=ShmVecEnv,
                       vec_env_kwargs={"start_method": "fork"})
    try:
        description = json.loads(json.dumps(env.describe()))
        want = rollout_no_seed(env, 25)
    finally:
        env.close()
    factory = description["env_fns"][0]["factory"]
    assert factory["type"] == "sb3_make_vec_env" and factory["env_factory"]["spec"]["id"] == "FactoryProbe-v0"
    rebuilt = ShmVecEnv.from_description(description)
    try:
        assert_same(rollout_no_seed(rebuilt, 25), want)
        assert rebuilt.env_is_wrapped(Monitor) == [True, True]
    finally:
        rebuilt.close()


def test_describe_names_the_factory_that_is_not_plain_data():
    fns = [make_env("CartPole-v1"), lambda: gym.make("CartPole-v1")]
    env = ShmVecEnv(fns, n_workers=1, start_method="fork")
    try:
        with pytest.raises(DescriptionError, match=r"env_fns\[1\].*lambda.*shmvec.make_env.*decided\(\) still says"):
            env.describe()
        decided = json.loads(json.dumps(env.decided()))  # what the defaults became, the factories aside
        assert decided["n_workers"]["value"] == 1 and "given" in decided["n_workers"]["why"]
        assert set(decided) == {"n_workers", "spin_us", "parent_threads", "placement"}
    finally:
        env.close()
    env = ShmVecEnv([make_env("CartPole-v1")] * 2, n_workers=1, start_method="fork")
    try:
        assert env.decided() == env.describe()["decided"]
    finally:
        env.close()
    with pytest.raises(DescriptionError, match="kwargs"):
        describe_factory(make_env("CartPole-v1", render_mode=object()))
    with pytest.raises(DescriptionError, match="not a ShmVecEnv description"):
        ShmVecEnv.from_description({"env_fns": []})
    with pytest.raises(DescriptionError, match="unknown factory description"):
        factory_from_description({"type": "teleport"})


# Heavy imports stay under the main guard: spawned workers re-run this script's top level.
_CONTINUE_SCRIPT = '''
import json, sys

if __name__ == "__main__":
    import multiprocessing
    import torch
    from shmvec import ShmVecEnv
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor

    torch.set_num_threads(1)  # a tiny MLP: more threads only contend for the cores with the workers
    assert multiprocessing.parent_process() is None  # a fresh interpreter, not a fork of the trainer
    with open(sys.argv[1] if len(sys.argv) > 1 else "run/vec_env.json") as f:
        description = json.load(f)
    venv = VecMonitor(ShmVecEnv.from_description(description))
    try:
        model = PPO.load("run/model.zip", env=venv, device="cpu")
        before = model.num_timesteps
        model.learn(512, reset_num_timesteps=False)
        print(json.dumps({"before": before, "after": model.num_timesteps, "n_envs": venv.num_envs,
                          "start_method": venv.venv.start_method}))
    finally:
        venv.close()
'''


def test_ppo_trained_saved_and_continued_in_a_fresh_spawned_interpreter(tmp_path, one_torch_thread):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor

    venv = VecMonitor(ShmVecEnv([make_env("CartPole-v1")] * 4, n_workers=2, start_method="spawn"))
    try:
        venv.seed(5)
        model = PPO("MlpPolicy", venv, n_steps=128, batch_size=128, n_epochs=2, seed=0, device="cpu")
        model.learn(2500)
        (tmp_path / "run").mkdir()
        model.save(tmp_path / "run" / "model.zip")
        (tmp_path / "run" / "vec_env.json").write_text(json.dumps(venv.venv.describe(), indent=1))
        trained = model.num_timesteps
    finally:
        venv.close()
    script = tmp_path / "resume.py"
    script.write_text(_CONTINUE_SCRIPT)
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["before"] == trained >= 2500
    assert result["after"] >= trained + 512
    assert result["n_envs"] == 4 and result["start_method"] == "spawn"


# ---------------------------------------------------------------------------------------------
# Start-up: parallel workers, nothing heavy, affinity, forkserver preload
# ---------------------------------------------------------------------------------------------

def test_workers_build_their_envs_in_parallel():
    """Each env takes 1.5 s to build; the construction windows of the three workers overlap."""
    env = ShmVecEnv([functools.partial(factory_envs.make_probe, 2, 1.5)] * 3, n_workers=3, start_method="fork")
    try:
        windows = env.get_attr("built")
    finally:
        env.close()
    latest_start = max(start for start, _ in windows)
    earliest_end = min(end for _, end in windows)
    assert latest_start < earliest_end, f"workers built their envs one after another: {windows}"


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_workers_import_nothing_heavy_for_cartpole(start_method):
    factory = make_env("CartPole-v1", wrappers=[factory_envs.ReportProcess])
    env = ShmVecEnv([factory] * 2, n_workers=2, start_method=start_method)
    try:
        modules = env.env_method("loaded_modules")
    finally:
        env.close()
    for mods in modules:
        heavy = sorted({m.split(".")[0] for m in mods} & set(HEAVY))
        assert heavy == [], f"a {start_method} worker imported {heavy}"
        assert "gymnasium.envs.classic_control.cartpole" in mods


def test_cpu_affinity_pins_each_worker():
    cores = sorted(os.sched_getaffinity(0))
    factory = make_env(factory_envs.ProbeEnv)
    env = ShmVecEnv([factory] * 3, n_workers=3, start_method="spawn", cpu_affinity=True)
    try:
        assert env.env_method("cpus") == [[cores[w % len(cores)]] for w in range(3)]
    finally:
        env.close()
    env = ShmVecEnv([factory] * 2, n_workers=2, start_method="fork", cpu_affinity=[cores, [cores[-1]]])
    try:
        assert env.env_method("cpus") == [cores, [cores[-1]]]
    finally:
        env.close()
    with pytest.raises(ValueError, match="may run on cores"):
        ShmVecEnv([factory] * 2, start_method="fork", cpu_affinity=[[max(cores) + 1000]])


_PRELOAD_SCRIPT = '''
import json, warnings


def main():
    from shmvec import ShmVecEnv, make_env
    factory = make_env("CartPole-v1", wrappers=["factory_envs:ReportProcess"])
    result = {}
    venv = ShmVecEnv([factory] * 2, n_workers=2, start_method="forkserver", preload=["factory_envs"])
    try:
        result["pids"] = venv.env_method("pid")
        result["import_pids"] = venv.env_method("import_pid")
    finally:
        venv.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        venv = ShmVecEnv([factory], start_method="forkserver", preload=["xml.dom.minidom"])
        venv.close()
    with warnings.catch_warnings(record=True) as direct:
        warnings.simplefilter("always")
        from shmvec import set_forkserver_preload
        set_forkserver_preload(["xml.dom.pulldom"])
    result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    result["where"] = [w.filename.rsplit("/", 1)[-1] for w in caught + direct
                       if issubclass(w.category, RuntimeWarning)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
'''


def test_forkserver_preload_imports_once_and_warns_when_too_late(tmp_path):
    script = tmp_path / "preload.py"
    script.write_text(_PRELOAD_SCRIPT)
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    # Preloaded: the module was imported by the forkserver, not by the workers.
    assert all(ip != pid for ip, pid in zip(result["import_pids"], result["pids"])), result
    assert len(set(result["import_pids"])) == 1
    # The forkserver was running by then: preloading more cannot work, and says so.
    assert len(result["warnings"]) == 1 and "already running" in result["warnings"][0]
    # Each warning points at the user's call (through ShmVecEnv, or directly), not into shmvec.
    assert result["where"] == ["preload.py", "preload.py"], result


def test_preload_needs_forkserver():
    with pytest.raises(ValueError, match="forkserver"):
        ShmVecEnv([make_env("CartPole-v1")], start_method="spawn", preload=["json"])


# ---------------------------------------------------------------------------------------------
# One env per process
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_envs_per_worker_one_gives_each_env_its_own_process(start_method):
    fns = [functools.partial(factory_envs.make_singleton_sim, 3)] * 3
    env = ShmVecEnv(fns, envs_per_worker=1, start_method=start_method)
    try:
        assert env.n_workers == 3
        env.reset()
        env.step(np.zeros(3, dtype=np.int64))
        assert len(set(env.env_method("pid"))) == 3
    finally:
        env.close()


def test_a_second_instance_in_one_process_is_refused():
    fns = [functools.partial(factory_envs.make_singleton_sim, 3)] * 3
    with pytest.raises(RuntimeError, match="one per process"):
        ShmVecEnv(fns, n_workers=2, start_method="fork")
    env = ShmVecEnv(fns, n_workers=3, start_method="fork")  # n_workers=n_envs: the same as envs_per_worker=1
    env.close()


def test_envs_per_worker_arguments():
    fns = [factory_envs.make_probe] * 5
    env = ShmVecEnv(fns, envs_per_worker=2, start_method="fork")
    try:
        assert env.n_workers == 3
        assert [len(sl) for sl in env.slices] == [2, 2, 1]
    finally:
        env.close()
    with pytest.raises(ValueError, match="contradicts"):
        ShmVecEnv(fns, envs_per_worker=1, n_workers=2, start_method="fork")
    with pytest.raises(ValueError, match="envs_per_worker"):
        ShmVecEnv(fns, envs_per_worker=0, start_method="fork")


# ---------------------------------------------------------------------------------------------
# Classes of the user's script coming back from spawn/forkserver workers; argument checks
# ---------------------------------------------------------------------------------------------

MAIN_CLASSES_SCRIPT = '''
import dataclasses, json, sys
import numpy as np
import gymnasium as gym
from gymnasium import spaces


class MyBox(spaces.Box):
    """A space subclass of this script: it reaches the parent in the spaces handshake."""


@dataclasses.dataclass
class Contact:
    body: str
    force: float


class ContactEnv(gym.Env):
    def __init__(self):
        self.observation_space = MyBox(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {"contact": Contact("foot", 1.5)}

    def last_contact(self):
        return Contact("hand", 2.0)


if __name__ == "__main__":
    from shmvec import ShmVecEnv
    out = {}
    for method in ("spawn", "forkserver"):
        env = ShmVecEnv([ContactEnv] * 2, n_workers=2, start_method=method)
        try:
            env.reset()
            _, _, _, infos = env.step(np.zeros(2, dtype=np.int64))
            answers = env.env_method("last_contact")
            out[method] = [
                type(env.observation_space) is MyBox,
                all(type(i["contact"]) is Contact and i["contact"] == Contact("foot", 1.5) for i in infos),
                answers == [Contact("hand", 2.0)] * 2 and all(type(a) is Contact for a in answers),
            ]
        finally:
            env.close()
    print(json.dumps(out))
'''


def test_classes_of_the_users_script_come_back_from_spawn_and_forkserver_workers_as_themselves(tmp_path):
    """A class defined in __main__ reaches spawn/forkserver workers by value (cloudpickle); a
    space, an info or an answer holding one comes back as the parent's own class (pickle alone
    cannot name it there: "not the same object as __main__.X")."""
    script = tmp_path / "main_classes.py"
    script.write_text(MAIN_CLASSES_SCRIPT)
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout) == {"spawn": [True, True, True], "forkserver": [True, True, True]}, proc.stdout


@pytest.mark.parametrize("kwargs, error, match", [
    ({"worker_threads": 0}, ValueError, "worker_threads must be at least 1"),
    ({"worker_threads": 2.5}, TypeError, "worker_threads must be a whole number"),
    ({"n_workers": "2"}, TypeError, "n_workers must be a whole number"),
    ({"n_workers": 2.7}, TypeError, "n_workers must be a whole number"),
    ({"n_workers": True}, TypeError, "n_workers must be a whole number"),
    ({"envs_per_worker": "2"}, TypeError, "envs_per_worker must be a whole number"),
    ({"timeout": "5"}, TypeError, "timeout must be a number"),
    ({"mailbox_bytes": 0}, ValueError, "mailbox_bytes must be at least 1"),
    ({"cpu_affinity": 1}, TypeError, "cpu_affinity=1: pass True, or a list"),
    ({"cpu_affinity": "01"}, TypeError, "cpu_affinity='01'"),
    ({"cpu_affinity": [1.7]}, TypeError, "names cores by number"),
    ({"cpu_affinity": [True]}, TypeError, "names cores by number"),
    ({"preload": "torch", "start_method": "forkserver"}, TypeError, r"preload takes a list of module names, e.g. preload=\['torch'\]"),
])
def test_bad_option_types_are_refused_before_any_worker_starts(kwargs, error, match):
    kwargs.setdefault("start_method", "fork")
    with pytest.raises(error, match=match):
        ShmVecEnv(testenvs.bare_env_fns(2), **kwargs)


def test_whole_floats_and_infinite_max_restarts_are_taken():
    env = ShmVecEnv(testenvs.bare_env_fns(4), n_workers=4 / 2, worker_threads=1.0, max_restarts=float("inf"),
                    timeout=np.float64(30), start_method="fork")
    try:
        assert env.n_workers == 2 and env.max_restarts is None and env.timeout == 30.0
    finally:
        env.close()
    with pytest.raises(ValueError, match="nan"):
        ShmVecEnv(testenvs.bare_env_fns(2), timeout=float("nan"), start_method="fork")


def test_one_factory_instead_of_a_list_is_refused_saying_what_to_pass():
    with pytest.raises(TypeError, match=r"env_fns must be a list of factories, got one EnvFactory"):
        ShmVecEnv(make_env("CartPole-v1"), start_method="fork")


def test_numpy_integer_options_are_taken_and_described_as_plain_ints():
    env = ShmVecEnv([make_env("CartPole-v1")] * 2, n_workers=np.int64(2), start_method="fork")
    try:
        assert env.n_workers == 2
        d = env.describe()
        assert json.loads(json.dumps(d))["options"]["n_workers"] == 2
    finally:
        env.close()


def test_make_env_overrides_are_passed_as_they_are_not_copied():
    shared = {"lock": threading.Lock()}  # deepcopy would fail; SB3 passes env_kwargs as they are
    factory = make_env(testenvs.KwargsEnv, size=3)
    env = factory(shared=shared)
    try:
        assert env.unwrapped.kwargs["shared"] is shared and env.unwrapped.kwargs["size"] == 3
    finally:
        env.close()


def test_make_env_takes_sb3_env_kwargs_through_make_vec_env():
    env = make_vec_env(make_env("CartPole-v1"), n_envs=2, env_kwargs={"max_episode_steps": 3},
                       vec_env_cls=ShmVecEnv, vec_env_kwargs={"start_method": "fork"})
    try:
        env.reset()
        dones = [env.step(np.zeros(2, dtype=np.int64))[2] for _ in range(3)]
        assert not dones[0].any() and dones[2].all()  # the override reached gym.make
    finally:
        env.close()


def test_a_factory_that_raises_is_named_by_its_env_index_and_its_sys_exit_is_an_error():
    fns = [testenvs.make_cartpole] * 3 + [testenvs.exit_instead_of_building]
    with pytest.raises(BaseException) as info:
        ShmVecEnv(fns, n_workers=2, start_method="fork")
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "env 3" in text and "SystemExit" in text, text
    assert "was not built" in text and "call close()" not in text, text


def test_a_typo_in_an_env_id_gets_no_note_about_registering_in_the_script():
    """The note is for ids registered in this process whose registration did not reach the
    worker only: a misspelt id is a typo (Gymnasium's own "Did you mean" says so)."""
    from shmvec._registrations import explain_not_found

    not_sent = {"ShmvecTypoCheck-v0": "could not be pickled (TypeError: cannot pickle '_thread.lock' object)"}
    typo = gym.error.NameNotFound("Environment `CartPoel` doesn't exist. Did you mean: `CartPole`?")
    explain_not_found(typo, not_sent)
    assert not getattr(typo, "__notes__", [])
    missed = gym.error.NameNotFound("Environment `ShmvecTypoCheck` doesn't exist.")
    explain_not_found(missed, not_sent)
    assert "'ShmvecTypoCheck-v0' is registered in the parent process" in missed.__notes__[0]
    assert "could not be pickled (TypeError" in missed.__notes__[0] and "kwargs" in missed.__notes__[0]
    explain_not_found(missed := gym.error.NameNotFound("Environment `ShmvecTypoCheck` doesn't exist."), {})
    assert not getattr(missed, "__notes__", [])  # every registration was sent (or fork: none needed)


@pytest.mark.parametrize("env_id, message", [
    ("CartPole-v9", "Environment version `v9` for environment `CartPole` doesn't exist. It provides versioned "
                    "environments: [ `v0`, `v1` ]."),
    ("shmvecns/Probe-v0", "Environment `Probe` doesn't exist in namespace shmvecns."),
    ("shmvecns/Probe-v0", "Namespace shmvecns not found. Have you installed the proper package for shmvecns?"),
])
def test_the_register_note_names_a_new_version_or_a_namespaced_id(env_id, message):
    from shmvec._registrations import explain_not_found

    cls = gym.error.VersionNotFound if "version" in message else gym.error.NameNotFound
    exc = cls(message)
    explain_not_found(exc, {env_id: "could not be unpickled in the worker (ModuleNotFoundError: No module named 'x')"})
    assert f"{env_id!r} is registered in the parent process" in exc.__notes__[0]


def _build_in_daemon() -> str:
    try:
        ShmVecEnv(testenvs.bare_env_fns(2), n_workers=1, start_method="fork")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "built"


def test_a_vec_env_built_in_a_daemonic_process_says_what_to_do():
    """A multiprocessing.Pool worker may not start processes: multiprocessing's bare assertion."""
    import multiprocessing as mp

    if not __debug__:
        pytest.skip("python -O strips multiprocessing's assertion: the vec env is built")
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply(_build_in_daemon)
    assert got.startswith("ShmVecEnvError") and "DummyVecEnv" in got and "daemon=False" in got, got


# ---------------------------------------------------------------------------------------------
# Errors in the user's words: what was passed, and the fix that fits it
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    ((4,), ["env_fns is the number 4", "ShmVecEnv([make_env] * 4)", "SB3's make_vec_env(env_id, n_envs=4"]),
    ((4, testenvs.make_cartpole), ["env_fns is the number 4",
                                   "TorchRL's ParallelEnv(n, make_env); ShmVecEnv takes the factories first",
                                   "ShmVecEnv([make_env] * 4)"]),
    (([3, 3],), ["env_fns[0] is the number 3, not a factory", "one callable per env"]),
    (("CartPole-v1",), ["env_fns is the string 'CartPole-v1'", "[shmvec.make_env('CartPole-v1')] * n_envs"]),
    ((["CartPole-v1"] * 2,), ["env_fns[0] is the string 'CartPole-v1'", "[shmvec.make_env('CartPole-v1')] * n_envs",
                              "make_vec_env('CartPole-v1'"]),
    (([gym.make("CartPole-v1")] * 2,), ["env_fns[0] is a", "instance, not a factory", "not [env] * n"]),
    ((gym.make("CartPole-v1"),), ["env_fns is a", "instance, not a factory", "not [env] * n"]),
    ((testenvs.make_cartpole,), ["env_fns must be a list of factories, got one function", "[make_env] * n_envs"]),
    ((factory_envs.make_parallel_env(),), ["PettingZoo multi-agent env (UserParallelEnv)",
                                           "ShmVecEnv runs single-agent Gymnasium envs", "shmvec.ShmMultiAgentVecEnv(env_fns)",
                                           "supersuit.pettingzoo_env_to_vec_env_v1",
                                           "concat_vec_envs_v1"]),
    (([factory_envs.make_parallel_env()] * 2,), ["env_fns[0] is a PettingZoo multi-agent env", "SuperSuit"]),
    ((factory_envs.make_vector_env(),), ["env_fns is a vector env (SyncVectorEnv of 2 envs)",
                                         "factories that each build one env", "shmvec.make_vec(id, n)"]),
    ((object(),), ["env_fns (object) is not a list of factories", "ShmVecEnv([make_env] * n_envs)"]),
], ids=["number", "torchrl-order", "numbers", "id", "ids", "instances", "instance", "one-factory", "pettingzoo",
        "pettingzoos", "vector-env", "object"])
def test_constructor_errors_name_what_was_passed_and_the_fix(args, says):
    with pytest.raises(TypeError) as info:
        ShmVecEnv(*args)
    text = str(info.value)
    for phrase in says:
        assert phrase in text, text
    assert "shimmy" not in text and "VecCore" not in text, text
    for arg in args:  # the vector env built for the case
        if isinstance(arg, gym.vector.VectorEnv):
            arg.close()


def test_an_empty_list_of_factories_names_the_class():
    with pytest.raises(ValueError, match="ShmVecEnv needs at least one env factory"):
        ShmVecEnv([])


@pytest.mark.parametrize("factory, says, not_says", [
    (factory_envs.make_parallel_env, ["env_fns[1] returned a PettingZoo multi-agent env (UserParallelEnv)",
                                      "ShmVecEnv runs single-agent Gymnasium envs", "shmvec.ShmMultiAgentVecEnv",
                                      "supersuit.concat_vec_envs_v1(env, n_copies, base_class='stable_baselines3')",
                                      "aec_to_parallel"], ["shimmy"]),
    (factory_envs.make_vector_env, ["env_fns[1] returned a vector env (SyncVectorEnv of 2 envs)",
                                    "factories that each build one env", "shmvec.make_vec(id, n)"], ["shimmy"]),
    (factory_envs.make_old_gym_env, ["env_fns[1] returned an env of the old gym package (OldGymEnv)",
                                     "shimmy.GymV26CompatibilityV0(env=env)"], []),
    (factory_envs.make_nothing, ["env_fns[1] returned None", "`return` the env"], ["shimmy"]),
    (factory_envs.make_probe_class, ["env_fns[1] returned the class ProbeEnv itself", "lambda: ProbeEnv()"],
     ["shimmy"]),
    (functools.partial(int, 3), ["env_fns[1] returned a value of type int, not a gymnasium.Env",
                                 "gym.make('CartPole-v1')"], ["shimmy"]),
], ids=["pettingzoo", "vector-env", "old-gym", "none", "class", "int"])
def test_a_factory_that_returns_no_gymnasium_env_gets_the_hint_that_fits(factory, says, not_says):
    """The worker names the class the user called and what the factory returned (was: a hint about
    shimmy for anything that is not a gymnasium.Env)."""
    with pytest.raises(TypeError) as info:
        ShmVecEnv([factory_envs.make_probe, factory], n_workers=1, start_method="fork")
    text = str(info.value)
    for phrase in says:
        assert phrase in text, text
    for phrase in not_says:
        assert phrase not in text, text


def test_the_hints_name_the_gymnasium_face_and_its_own_way():
    from shmvec import ShmVectorEnv

    with pytest.raises(TypeError, match="ShmVectorEnv runs single-agent Gymnasium envs"):
        ShmVectorEnv([factory_envs.make_parallel_env] * 2, n_workers=1, start_method="fork")
    with pytest.raises(TypeError) as info:
        ShmVectorEnv(["CartPole-v1"] * 2)
    assert "[shmvec.make_env('CartPole-v1')] * n_envs (or shmvec.make_vec('CartPole-v1', n_envs))" in str(info.value)
