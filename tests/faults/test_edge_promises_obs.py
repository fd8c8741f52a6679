"""Observations at the edges (issue 36, items 1-4): what the caller holds, and what shmvec reports.

What must hold:

1. zero_copy, the caller writes into an observation it got, then a masked reset
   (``reset(options={"reset_mask": m})``): the envs not reset show their own last observation,
   as SyncVectorEnv shows it, never the caller's writes (the workers write them again,
   shmvec._leases);
2. zero_copy across a fork: what a forked child holds never changes when the parent steps on,
   and what either writes into an observation they both hold stays its own (the child's pages
   of the blocks it holds become private, shmvec._leases "Forks"), also after ``close()``;
3. ``on_failure="restart"``: the terminal observation reported for a restarted env is what the
   env last returned, never the caller's writes into the array it got (shmvec._restarts);
4. multi-agent restarts: ``terminal_observation`` (ShmMultiAgentVecEnv) and ``final_obs``
   (ShmParallelEnv) hold the last observation the caller received, not the new episode's first.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import agentenvs
import faultenvs
import testenvs
from helpers import assert_same, close_all
from shmvec import ShmMultiAgentVecEnv, ShmParallelEnv, ShmVecEnv, ShmVectorEnv, WorkerRestartWarning


def _leaves(obs) -> list[np.ndarray]:
    if isinstance(obs, dict):
        return [leaf for value in obs.values() for leaf in _leaves(value)]
    if isinstance(obs, tuple):
        return [leaf for value in obs for leaf in _leaves(value)]
    return [obs]


def _scribble(obs) -> None:
    """What a caller does to an observation it got: writes into it in place (``obs *= 0.5`` and the like)."""
    for leaf in _leaves(obs):
        np.copyto(leaf, 7, casting="unsafe")


def _copy(obs):
    if isinstance(obs, dict):
        return {key: _copy(value) for key, value in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_copy(value) for value in obs)
    return np.array(obs, copy=True)


# ---- 1. zero_copy: in-place writes, then a masked reset ------------------------------------------------

@pytest.mark.parametrize("method, obs_kind, after, autoreset, drop", [
    ("fork", "image", "step", AutoresetMode.NEXT_STEP, False),
    ("fork", "image", "step", AutoresetMode.SAME_STEP, True),  # written into, then let go: the block is free
    ("fork", "dict", "reset", AutoresetMode.NEXT_STEP, False),
    ("fork", "tuple", "step", AutoresetMode.DISABLED, False),
    ("forkserver", "image", "reset", AutoresetMode.SAME_STEP, False),
    ("spawn", "dict", "step", AutoresetMode.NEXT_STEP, True),
])
def test_a_masked_reset_shows_the_envs_own_observations_not_the_callers_writes(method, obs_kind, after,
                                                                               autoreset, drop):
    fns = testenvs.spaces_env_fns(obs_kind, "discrete", 4)
    ref = SyncVectorEnv(fns, autoreset_mode=autoreset)
    env = ShmVectorEnv(fns, autoreset_mode=autoreset, n_workers=2, start_method=method, zero_copy=True)
    try:
        obs, _ = env.reset(seed=11)
        want, _ = ref.reset(seed=11)
        act = np.array([1, 0, 1, 0])
        for _ in range(3 if after == "step" else 0):
            obs = env.step(act)[0]
            want = ref.step(act)[0]
        assert_same(obs, want, "before the writes", strict_dtype=True)
        _scribble(obs)
        if drop:
            del obs
        for mask in (np.array([True, False, False, True]), np.array([False, True, False, False])):
            out, _ = env.reset(options={"reset_mask": mask})
            ref_out, _ = ref.reset(options={"reset_mask": mask})
            assert_same(out, ref_out, f"masked reset {mask.tolist()}", strict_dtype=True)
            _scribble(out)  # and again: written into, then reset with another mask
        out = env.step(act)[0]
        assert_same(out, ref.step(act)[0], "the step after", strict_dtype=True)
    finally:
        close_all(env, ref)


# ---- 2. zero_copy across a fork -----------------------------------------------------------------------

def _image_venv(face: str, method: str = "fork"):
    if face == "multi_agent":
        fns = [functools.partial(agentenvs.DyingAgents, 2, 50, 50)] * 2
        return ShmMultiAgentVecEnv(fns, n_workers=2, start_method=method, zero_copy=True)
    fns = testenvs.spaces_env_fns("image", "discrete", 4, term_prob=0.0)
    if face == "gymnasium":
        return ShmVectorEnv(fns, n_workers=2, start_method=method, zero_copy=True)
    return ShmVecEnv(fns, n_workers=2, start_method=method, zero_copy=True)


def _first_obs(env):
    out = env.reset()
    return out[0] if isinstance(out, tuple) else out


def _step(env) -> None:
    env.step(np.zeros(env.num_envs, dtype=np.int64))


def _child_checks(obs, want, go: int, how: str) -> None:
    """In the forked child: waits for the parent's word, then exits 0 if ``obs`` still equals ``want``."""
    ok = False
    try:
        os.read(go, 1)
        ok = bool(np.array_equal(obs, want))
    finally:
        if how == "os.fork":
            os._exit(0 if ok else 1)
    raise SystemExit(0 if ok else 1)


def _fork(target, args, how: str):
    """Runs ``target(*args, how)`` in a forked child; returns what ``_join`` waits for."""
    if how == "os.fork":
        pid = os.fork()
        if pid == 0:
            try:
                target(*args, how)
            finally:
                os._exit(2)
        return pid
    proc = mp.get_context("fork").Process(target=target, args=(*args, how))
    proc.start()
    return proc


def _join(child) -> int:
    if isinstance(child, int):
        _, status = os.waitpid(child, 0)
        return os.waitstatus_to_exitcode(status)
    child.join(30)
    code = child.exitcode
    child.close()
    return code


@pytest.mark.parametrize("face, method, how", [
    ("sb3", "fork", "os.fork"),
    ("sb3", "forkserver", "mp.fork"),
    ("sb3", "spawn", "os.fork"),
    ("gymnasium", "fork", "mp.fork"),
    ("multi_agent", "fork", "os.fork"),
])
def test_what_a_forked_child_holds_never_changes_when_the_parent_steps_on(face, method, how):
    """The child holds an observation, the parent drops it and steps (its blocks are reused)."""
    env = _image_venv(face, method)
    go_r, go_w = os.pipe()
    child = None
    try:
        obs = _first_obs(env)
        want = obs.copy()
        child = _fork(_child_checks, (obs, want, go_r), how)
        del obs
        for _ in range(4):
            _step(env)
        os.write(go_w, b"!")
        code, child = _join(child), None
        assert code == 0, "the child's observation changed when the parent stepped"
    finally:
        os.close(go_r)
        os.close(go_w)
        if child is not None:
            _join(child)
        close_all(env)


def _child_writes(obs, how: str) -> None:
    np.copyto(obs, 7, casting="unsafe")
    if how == "os.fork":
        os._exit(0)


@pytest.mark.parametrize("face, how, closed", [
    ("sb3", "os.fork", False),
    ("gymnasium", "mp.fork", False),
    ("multi_agent", "os.fork", False),
    ("sb3", "os.fork", True),  # the vec env closed before the fork: the caller's block outlives it
    ("gymnasium", "mp.fork", True),
])
def test_what_a_forked_child_writes_into_an_observation_stays_its_own(face, how, closed):
    """Parent and child both hold an observation; the child writes into it: the parent's is unchanged."""
    env = _image_venv(face)
    try:
        obs = _first_obs(env)
        want = obs.copy()
        if closed:
            env.close()
        assert _join(_fork(_child_writes, (obs,), how)) == 0
        assert_same(obs, want, "the parent's observation after the child wrote into its own")
        if not closed:
            _step(env)
            assert_same(obs, want, "the parent's observation after the next step")
    finally:
        close_all(env)


# ---- 3. restarts report what the env returned, not the caller's writes -----------------------------------

def _kill_worker_of(env, i: int) -> None:
    engine = env._engine
    proc = engine.workers.processes[engine.owner[i]]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


@pytest.mark.parametrize("method, how, obs_kind", [
    ("fork", "kill", "box"),
    ("fork", "raise", "dict"),
    ("fork", "hang", "box"),  # killed past the timeout
    ("fork", "between", "image"),  # killed between steps, restarted before get_attr, reported at the next step
    ("spawn", "kill", "tuple"),
])
def test_a_restarted_env_reports_what_it_returned_not_the_callers_writes(method, how, obs_kind, tmp_path):
    at = 3 if how != "between" else None
    crash = "kill" if how == "between" else how
    fns = [functools.partial(faultenvs.make_crash_env, i, at if i == 2 else None, crash, "step",
                             str(tmp_path / "once"), 50, obs_kind) for i in range(4)]
    env = ShmVecEnv(fns, n_workers=2, start_method=method, on_failure="restart",
                    timeout=2 if how == "hang" else None)
    try:
        env.reset()
        for _ in range(2):
            obs = env.step(np.zeros(4, dtype=np.int64))[0]
        want = _copy(obs)
        _scribble(obs)
        if how == "between":
            _kill_worker_of(env, 2)
            with pytest.warns(WorkerRestartWarning):
                env.get_attr("tag")
            _, _, dones, infos = env.step(np.zeros(4, dtype=np.int64))
        else:
            with pytest.warns(WorkerRestartWarning):
                _, _, dones, infos = env.step(np.zeros(4, dtype=np.int64))
        assert dones.tolist() == [False, False, True, True]
        for i in (2, 3):
            assert "shmvec_restarted" in infos[i]
            want_i = {k: v[i] for k, v in want.items()} if isinstance(want, dict) else \
                tuple(v[i] for v in want) if isinstance(want, tuple) else want[i]
            assert_same(infos[i]["terminal_observation"], want_i, f"env {i}'s terminal observation", strict_dtype=True)
    finally:
        close_all(env)


# ---- 4. multi-agent restarts report the last observation the caller received ------------------------------

def _agents_fns(how: str, tmp_path) -> list:
    if how == "raise":
        return [functools.partial(agentenvs.Faulty, 99, "raise"), functools.partial(agentenvs.Faulty, 3, "raise")]
    at = 3 if how == "kill" else 99
    return [functools.partial(agentenvs.Faulty, 99, "raise"),
            functools.partial(agentenvs.Faulty, at, "kill", str(tmp_path / "killed"))]


@pytest.mark.parametrize("how, scribble", [("raise", False), ("kill", True), ("between", False)])
def test_multi_agent_vec_env_restart_reports_the_last_observation(how, scribble, tmp_path):
    venv = ShmMultiAgentVecEnv(_agents_fns(how, tmp_path), n_workers=2, start_method="fork", on_failure="restart")
    try:
        venv.reset()
        for _ in range(2):
            obs = venv.step(np.ones(venv.num_envs, dtype=np.int64))[0]
        want = obs.copy()
        if scribble:
            _scribble(obs)
        if how == "between":
            _kill_worker_of(venv, 1)
            with pytest.warns(WorkerRestartWarning):
                venv.get_attr("possible_agents")
            _, _, dones, infos = venv.step(np.ones(venv.num_envs, dtype=np.int64))
        else:
            with pytest.warns(WorkerRestartWarning):
                _, _, dones, infos = venv.step(np.ones(venv.num_envs, dtype=np.int64))
        assert dones.tolist() == [False, False, True, True]
        for row in (2, 3):
            assert "shmvec_restarted" in infos[row]
            assert_same(infos[row]["terminal_observation"], want[row], f"row {row}'s terminal observation")
    finally:
        close_all(venv)


@pytest.mark.parametrize("how", ["raise", "kill", "between"])
def test_parallel_env_restart_reports_the_last_observation_as_final_obs(how, tmp_path):
    env = ShmParallelEnv(_agents_fns(how, tmp_path), n_workers=2, start_method="fork", on_failure="restart")
    try:
        env.reset()
        acts = {a: np.ones(2, dtype=np.int64) for a in env.agents}
        for _ in range(2):
            obs = env.step(acts)[0]
        want = {a: o.copy() for a, o in obs.items()}
        _scribble(obs)
        if how == "between":
            _kill_worker_of(env, 1)
            with pytest.warns(WorkerRestartWarning):
                env.get_attr("possible_agents")
            _, _, _, truncations, infos = env.step(acts)
        else:
            with pytest.warns(WorkerRestartWarning):
                _, _, _, truncations, infos = env.step(acts)
        for agent in env.agents:
            assert truncations[agent].tolist() == [False, True]
            assert infos[agent]["_final_obs"].tolist() == [False, True]
            assert_same(infos[agent]["final_obs"][1], want[agent][1], f"{agent}'s final_obs")
    finally:
        close_all(env)
