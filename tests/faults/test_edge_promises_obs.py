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
import multiprocessing.connection
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


def _child_checks(obs, want, go: tuple[int, int], how: str) -> None:
    """In the forked child: waits for the parent's word (or its end), then exits 0 if ``obs`` still equals ``want``."""
    ok = False
    try:
        os.close(go[1])  # (else a parent that fails before its word would leave the child waiting)
        os.read(go[0], 1)
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
        child = _fork(_child_checks, (obs, want, (go_r, go_w)), how)
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
    mp.connection.wait([proc.sentinel], 10)  # (not join(): a forkserver's sentinel would be read empty)


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

SEED = 0  # every agent of env 0 and env 1 lives 10 steps or more: no env ends on its own in these tests


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
        venv.seed(SEED)
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
        assert dones[2:].all()  # (env 0's agents live a random number of steps: it may end too)
        for row in (2, 3):
            assert "shmvec_restarted" in infos[row]
            assert_same(infos[row]["terminal_observation"], want[row], f"row {row}'s terminal observation")
    finally:
        close_all(venv)


@pytest.mark.parametrize("how", ["raise", "kill", "between"])
def test_parallel_env_restart_reports_the_last_observation_as_final_obs(how, tmp_path):
    env = ShmParallelEnv(_agents_fns(how, tmp_path), n_workers=2, start_method="fork", on_failure="restart")
    try:
        env.reset(seed=SEED)
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
            assert truncations[agent][1] and infos[agent]["_final_obs"][1]  # (env 0 may end too: random lives)
            assert_same(infos[agent]["final_obs"][1], want[agent][1], f"{agent}'s final_obs")
    finally:
        close_all(env)


# ---- the fault fuzz's events for observations --------------------------------------------------------
# Longer runs: SHMVEC_OBS_FUZZ_CONFIGS=100 (and SHMVEC_FAULT_FUZZ_SEED).
FUZZ_FIRST_SEED = int(os.environ.get("SHMVEC_FAULT_FUZZ_SEED", "100"))
FUZZ_CASES = int(os.environ.get("SHMVEC_OBS_FUZZ_CONFIGS", "6"))


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


def _draw_events(seed: int) -> dict:
    """A random face, spaces, envs, workers, start method and run of events; at least one fork
    whose observation the parent then lets go and steps past."""
    rng = np.random.default_rng(seed)
    face = str(rng.choice(["sb3", "gymnasium"]))
    events = [str(e) for e in rng.choice(["step", "write", "fork", "mask" if face == "gymnasium" else "step"], 10)]
    events.insert(int(rng.integers(0, 6)), "fork")
    return {"face": face, "obs_kind": str(rng.choice(["image", "dict", "tuple"])),
            "n_envs": int(rng.integers(2, 5)), "n_workers": int(rng.integers(1, 3)),
            "method": str(rng.choice(["fork", "fork", "forkserver"])),
            "autoreset": [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED][rng.integers(3)],
            "events": events + ["step", "step"], "rng": rng}


def _child_waits_and_compares(obs, want, go: tuple[int, int]) -> None:
    ok = False
    try:
        os.close(go[1])
        os.read(go[0], 1)
        ok = _same(obs, want)
    finally:
        os._exit(0 if ok else 1)


@pytest.mark.parametrize("seed", range(FUZZ_FIRST_SEED, FUZZ_FIRST_SEED + FUZZ_CASES))
def test_fuzzed_in_place_writes_masked_resets_and_forks_change_nothing_held(seed):
    """Random runs of steps, in-place writes into the observation just returned, masked resets
    (Gymnasium) and forks whose child holds that observation, the parent holding only its last
    one (as SB3 does): every observation equals the reference's (DummyVecEnv, SyncVectorEnv), and
    every child's is at the end what it was at its fork."""
    case = _draw_events(seed)
    rng, n = case["rng"], case["n_envs"]
    fns = testenvs.spaces_env_fns(case["obs_kind"], "discrete", n)
    if case["face"] == "gymnasium":
        ref = SyncVectorEnv(fns, autoreset_mode=case["autoreset"])
        env = ShmVectorEnv(fns, autoreset_mode=case["autoreset"], n_workers=case["n_workers"],
                           start_method=case["method"], zero_copy=True)
        obs, want = env.reset(seed=seed)[0], ref.reset(seed=seed)[0]
    else:
        from stable_baselines3.common.vec_env import DummyVecEnv

        ref = DummyVecEnv(fns)
        env = ShmVecEnv(fns, n_workers=case["n_workers"], start_method=case["method"], zero_copy=True)
        env.seed(seed)
        ref.seed(seed)
        obs, want = env.reset(), ref.reset()
    go_r, go_w = os.pipe()
    children = []
    try:
        for t, event in enumerate(case["events"]):
            where = f"seed {seed}, event {t} ({event}) of {case}"
            if event == "write":
                _scribble(obs)
            elif event == "fork":
                held = _copy(obs)  # (taken in the child, it would race with the parent's next step)
                pid = os.fork()
                if pid == 0:
                    _child_waits_and_compares(obs, held, (go_r, go_w))
                children.append(pid)
            elif event == "mask":
                mask = rng.random(n) < 0.5
                mask[rng.integers(n)] = True
                obs, want = env.reset(options={"reset_mask": mask})[0], ref.reset(options={"reset_mask": mask})[0]
                assert_same(obs, want, where, strict_dtype=True)
            else:
                act = rng.integers(0, 3, n)
                out = env.step(act)
                obs, want = out[0], ref.step(act)[0]
                assert_same(obs, want, where, strict_dtype=True)
                if case["face"] == "gymnasium" and case["autoreset"] == AutoresetMode.DISABLED and (
                        ended := out[2] | out[3]).any():  # (the user resets the envs that ended)
                    obs, want = (env.reset(options={"reset_mask": ended})[0],
                                 ref.reset(options={"reset_mask": ended})[0])
                    assert_same(obs, want, where + ", resetting the envs that ended", strict_dtype=True)
                del out
        os.write(go_w, b"!" * len(children))
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        children = []
        assert codes == [0] * len(codes), f"a forked child's observation changed (seed {seed}, {case})"
    finally:
        os.close(go_w)  # (a child still waiting reads EOF, compares and exits)
        os.close(go_r)
        for pid in children:
            os.waitpid(pid, 0)
        close_all(env, ref)


def _draw_restart(seed: int) -> dict:
    """A random face, failure, moment, start method and space; the SB3 face's caller always writes
    into what it got (the class of item 3), the multi-agent faces' at random (item 4 either way)."""
    rng = np.random.default_rng(seed)
    face = str(rng.choice(["sb3", "multi_agent", "parallel"]))
    return {"face": face, "how": str(rng.choice(["raise", "kill", "between"])), "at": int(rng.integers(2, 5)),
            "scribble": face == "sb3" or bool(rng.integers(2)), "method": str(rng.choice(["fork", "fork", "forkserver"])),
            "obs_kind": str(rng.choice(["box", "image", "dict", "tuple"]))}


@pytest.mark.parametrize("seed", range(FUZZ_FIRST_SEED, FUZZ_FIRST_SEED + FUZZ_CASES))
def test_fuzzed_restarts_report_the_last_observation_returned(seed, tmp_path):
    """A random face, failure, moment and start method, the caller writing into what it got or
    not: the restarted env's terminal observation (final_obs) is the last one it returned."""
    case = _draw_restart(seed)
    face, how, at = case["face"], case["how"], case["at"]
    crash_at = None if how == "between" else at + 1
    if face == "sb3":
        crash = "kill" if how == "between" else how
        fns = [functools.partial(faultenvs.make_crash_env, i, crash_at if i == 1 else None, crash, "step",
                                 str(tmp_path / "once"), 50, case["obs_kind"]) for i in range(2)]
        env = ShmVecEnv(fns, n_workers=2, start_method=case["method"], on_failure="restart")
        step = lambda: env.step(np.zeros(2, dtype=np.int64))  # noqa: E731
        env.reset()
    else:
        fail = crash_at or 99
        fns = [functools.partial(agentenvs.Faulty, 99, "raise"),
               functools.partial(agentenvs.Faulty, fail, "raise" if how == "raise" else "kill", str(tmp_path / "k"))]
        cls = ShmMultiAgentVecEnv if face == "multi_agent" else ShmParallelEnv
        env = cls(fns, n_workers=2, start_method=case["method"], on_failure="restart")
        if face == "multi_agent":
            step = lambda: env.step(np.ones(env.num_envs, dtype=np.int64))  # noqa: E731
            env.seed(SEED)
            env.reset()
        else:
            step = lambda: env.step({a: np.ones(2, dtype=np.int64) for a in env.agents})  # noqa: E731
            env.reset(seed=SEED)
    try:
        for _ in range(at):
            obs = step()[0]
        want = _copy(obs)
        if case["scribble"]:
            _scribble(obs)
        with pytest.warns(WorkerRestartWarning):
            if how == "between":
                _kill_worker_of(env, 1)
                env.get_attr("tag" if face == "sb3" else "possible_agents")
            else:
                out = step()
        if how == "between":
            out = step()
        where = f"seed {seed}, {case}"
        if face == "parallel":
            for agent in env.agents:
                assert out[4][agent]["_final_obs"][1], where
                assert_same(out[4][agent]["final_obs"][1], want[agent][1], where)
        elif face == "multi_agent":
            for row in (2, 3):
                assert_same(out[3][row]["terminal_observation"], want[row], where)
        else:
            got = out[3][1]["terminal_observation"]
            assert_same(got, {k: v[1] for k, v in want.items()} if isinstance(want, dict) else
                        tuple(v[1] for v in want) if isinstance(want, tuple) else want[1], where)
    finally:
        close_all(env)


@pytest.mark.parametrize("batch_size", [2, 4])
def test_a_pool_transition_keeps_the_observation_returned_not_the_callers_writes(batch_size):
    """ShmVecEnvPool's ``pool_obs`` (what PoolReplayBuffer stores) is the env's observation, even when
    the caller wrote into the array it was handed (as VecNormalize or a frame-stack in place would)."""
    from shmvec import ShmVecEnvPool, make_env

    pool = ShmVecEnvPool([make_env("CartPole-v1")] * 4, batch_size=batch_size, n_workers=2, start_method="fork")
    try:
        obs = pool.reset()
        handed: list[np.ndarray] = []  # every row returned so far, as returned
        checked = 0
        for _ in range(6):
            handed += [row.copy() for row in obs]
            obs *= 0.0  # the caller's own business
            obs, _, _, infos = pool.step(np.zeros(batch_size, dtype=np.int64))
            for info in infos:  # the very row returned for that env, not the zeros written since
                if "pool_obs" in info:
                    assert any(np.array_equal(info["pool_obs"], row) for row in handed), info["pool_obs"]
                    checked += 1
        assert checked
    finally:
        pool.close()
