"""Per-env action lists: ``step([{"move": ..., "fire": ...}, ...])``, as ``DummyVecEnv`` and
``SubprocVecEnv`` take them, beside the batched form, for every kind of action space.

The envs (tests/actionenvs.py) echo the action they were given in their next observation, so a
vec env that hands an env another env's action, or a value cast wrongly, differs from
``DummyVecEnv`` at once.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

import actionenvs
from helpers import TESTS_DIR, assert_same, close_all, pythonpath
from shmvec import ShmVecEnv
from shmvec.env_pool import ShmEnvPool


def echo_fns(kind: str, n_envs: int) -> list:
    return [functools.partial(actionenvs.make_echo_env, kind, 5 + i) for i in range(n_envs)]


def per_env_actions(space, n_envs: int, rng: np.random.Generator) -> list:
    return [actionenvs.sample_action(space, rng) for _ in range(n_envs)]


@pytest.mark.parametrize("kind", actionenvs.ACTION_KINDS)
@pytest.mark.parametrize("n_envs, method", [(2, "fork"), (3, "fork"), (3, "forkserver")])
def test_per_env_action_lists_step_as_in_dummy_vec_env(kind, n_envs, method):
    """Two envs with a two-subspace Tuple ("tuple", "pair"): a list of n_envs tuples is per-env actions."""
    fns = echo_fns(kind, n_envs)
    ref, env = DummyVecEnv(fns), None
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method=method)
        ref.seed(11)
        env.seed(11)
        assert_same(env.reset(), ref.reset(), "reset")
        rng = np.random.default_rng(5)
        dones = 0
        for t in range(25):
            actions = per_env_actions(env.action_space, n_envs, rng)
            got = env.step(actions)
            assert_same(got, ref.step(actions), f"step {t}")
            dones += int(got[2].sum())
        assert dones > 0
    finally:
        close_all(env, ref)


def batched(space, actions: list):
    """The batched form of per-env ``actions``: nested like the space, one array per leaf."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {key: batched(sub, [a[key] for a in actions]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(batched(sub, [a[k] for a in actions]) for k, sub in enumerate(space.spaces))
    return np.stack([np.asarray(a) for a in actions])


@pytest.mark.parametrize("kind, n_envs", [("dict", 3), ("nested", 3), ("tuple", 2), ("pair", 2), ("pair", 3)])
def test_the_batched_form_and_the_per_env_list_give_each_env_the_same_action(kind, n_envs):
    """Gymnasium's batched Tuple value is a tuple: with as many subspaces as envs it stays the batched form."""
    env = ShmVecEnv(echo_fns(kind, n_envs), n_workers=1, start_method="fork")
    try:
        env.reset()
        rng = np.random.default_rng(2)
        for _ in range(4):
            actions = per_env_actions(env.action_space, n_envs, rng)
            seen_list = [info["seen"] for info in env.step(actions)[3]]
            env.reset()
            seen_batch = [info["seen"] for info in env.step(batched(env.action_space, actions))[3]]
            env.reset()
            assert seen_list == seen_batch
            from gymnasium import spaces

            assert seen_list == [spaces.flatten(env.action_space, a).tolist() for a in actions]
    finally:
        env.close()


@pytest.mark.parametrize("kind, actions, says", [
    ("dict", 3, "got 3 per-env actions for 2 envs: pass one action per env, in a list of 2, or the batched form "
                "(a dict of batches, one per key)"),
    ("dict", 1, "got 1 per-env actions for 2 envs"),
    ("tuple", 3, "got 3 per-env actions for 2 envs: pass one action per env, in a list of 2, or the batched form "
                 "(a tuple of 2 batches, one per subspace)"),
    ("nested", 1, "got 1 per-env actions for 2 envs"),
    ("box", 3, "got a list of 3 per-env actions for 2 envs"),
    ("discrete", 1, "got a list of 1 per-env actions for 2 envs"),
    ("multidiscrete", 3, "got a list of 3 per-env actions for 2 envs"),
])
def test_a_wrong_number_of_per_env_actions_names_the_counts_and_sends_nothing(kind, actions, says):
    env = ShmVecEnv(echo_fns(kind, 2), n_workers=1, start_method="fork")
    try:
        env.reset()
        rng = np.random.default_rng(0)
        with pytest.raises(ValueError) as info:
            env.step(per_env_actions(env.action_space, actions, rng))
        assert says in str(info.value)
        assert not env.waiting
        env.step(per_env_actions(env.action_space, 2, rng))  # still usable
    finally:
        env.close()


def test_a_per_env_action_that_lacks_a_key_names_the_env_and_the_key():
    env = ShmVecEnv(echo_fns("dict", 2), n_workers=1, start_method="fork")
    try:
        env.reset()
        actions = per_env_actions(env.action_space, 2, np.random.default_rng(0))
        del actions[1]["fire"]
        with pytest.raises(ValueError, match=r"actions\[1\] has no value at \['fire'\]"):
            env.step(actions)
        actions = per_env_actions(env.action_space, 2, np.random.default_rng(0))
        actions[0]["move"] = np.zeros(3, dtype=np.float32)
        with pytest.raises(ValueError, match=r"actions\[0\]\['move'\] has shape \(3,\), the action space's is \(2,\)"):
            env.step(actions)
        with pytest.raises(ValueError, match="have no batch at"):
            env.step(5)
        assert not env.waiting
    finally:
        env.close()


def test_the_pool_takes_one_action_per_env_id():
    """ShmEnvPool.send: a list of per-env Dict actions, one per env id, as the batched form."""
    fns = echo_fns("dict", 4)
    pool = ShmEnvPool(fns, batch_size=4, n_workers=2, start_method="fork")
    try:
        pool.reset(seed=3)
        rng = np.random.default_rng(1)
        ids = np.array([3, 0, 2, 1])
        actions = per_env_actions(pool.single_action_space, 4, rng)
        pool.send(actions, ids)
        _, _, _, _, infos = pool.recv()
        seen = {int(i): s for i, s in zip(infos["env_id"], infos["seen"])}
        from gymnasium import spaces

        assert seen == {int(i): spaces.flatten(pool.single_action_space, a).tolist() for i, a in zip(ids, actions)}
        with pytest.raises(ValueError, match="got 3 per-env actions for 2 env ids"):
            pool.send(actions[:3], [0, 1])
    finally:
        pool.close()


# The SubprocVecEnv script with Dict actions that users write (SB3's multiprocessing example),
# run once as it is and once with ShmVecEnv in its place.
SCRIPT = '''
import json

import numpy as np
{import_line}

import actionenvs


def make_env(rank, seed=0):
    def _init():
        env = actionenvs.EchoActionEnv("dict", limit=6 + rank)
        env.reset(seed=seed + rank)
        return env
    return _init


if __name__ == "__main__":
    vec_env = {cls}([make_env(i) for i in range(4)])
    vec_env.seed(0)
    vec_env.action_space.seed(0)
    obs = vec_env.reset()
    out = []
    for _ in range(30):
        actions = [vec_env.action_space.sample() for _ in range(vec_env.num_envs)]
        obs, rewards, dones, infos = vec_env.step(actions)
        out.append([obs.tolist(), rewards.tolist(), dones.tolist(), [info["seen"] for info in infos],
                    [info["terminal_observation"].tolist() for info in infos if "terminal_observation" in info]])
    vec_env.close()
    print(json.dumps(out))
'''


def test_a_subproc_vec_env_script_with_dict_actions_runs_with_only_the_class_changed(tmp_path):
    outputs = {}
    for cls, import_line in (("SubprocVecEnv", "from stable_baselines3.common.vec_env import SubprocVecEnv"),
                             ("ShmVecEnv", "from shmvec import ShmVecEnv")):
        script = tmp_path / f"train_{cls}.py"
        script.write_text(SCRIPT.format(import_line=import_line, cls=cls))
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                              cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=pythonpath(Path(TESTS_DIR))))
        assert proc.returncode == 0, proc.stderr[-4000:]
        outputs[cls] = json.loads(proc.stdout.strip().splitlines()[-1])
    for steps in outputs.values():  # SubprocVecEnv's rewards are float64, DummyVecEnv's and ShmVecEnv's float32
        for step in steps:
            step[1] = np.float32(step[1]).tolist()
    assert_same(outputs["ShmVecEnv"], outputs["SubprocVecEnv"])
    assert sum(sum(step[2]) for step in outputs["ShmVecEnv"]) > 0  # episodes ended on the way
