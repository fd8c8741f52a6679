"""ShmVecEnv and SB3's DummyVecEnv agree step for step on the same seeds.

Everything is compared exactly: observations (every leaf, dtype included),
rewards, dones, infos (``terminal_observation`` and ``TimeLimit.truncated``
included) and ``reset_infos``.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

import testenvs
from helpers import assert_same, close_all, type_tree
from shmvec import ShmVecEnv
from shmvec import _protocol as P

N_STEPS = 120

# One action kind per observation kind (every action kind is also run against "box", below).
ACT_FOR_OBS = {
    "box": "box",
    "image": "discrete",
    "discrete": "multidiscrete",
    "multidiscrete": "multibinary",
    "multibinary": "box",
    "dict": "discrete",
    "tuple": "multibinary",
}
# (n_envs, n_workers): uneven slices, many envs per worker, one env per worker.
SHAPES = [(3, 2), (13, 2), (5, 5)]

FORK_CASES = [
    pytest.param("fork", obs, ACT_FOR_OBS[obs], n_envs, n_workers, id=f"fork-{obs}-{ACT_FOR_OBS[obs]}-{n_envs}x{n_workers}")
    for obs in testenvs.OBS_KINDS
    for n_envs, n_workers in SHAPES
] + [
    pytest.param("fork", "box", act, 4, 2, id=f"fork-box-{act}-4x2")
    for act in testenvs.ACT_KINDS if act != ACT_FOR_OBS["box"]
]
# forkserver and spawn start slowly: a representative subset.
SLOW_CASES = [
    pytest.param(method, obs, ACT_FOR_OBS[obs], 3, 2, id=f"{method}-{obs}-{ACT_FOR_OBS[obs]}-3x2")
    for method in ("forkserver", "spawn")
    for obs in ("box", "dict", "tuple", "discrete")
] + [
    pytest.param(method, "dict", "discrete", 5, 5, id=f"{method}-dict-discrete-5x5")
    for method in ("forkserver", "spawn")
]


class Stats:
    def __init__(self) -> None:
        self.terminated = 0
        self.truncated = 0
        self.nonempty_infos = 0
        self.nonempty_reset_infos = 0


def _actions(action_space: spaces.Space, n_envs: int, n_steps: int, seed: int) -> list:
    action_space.seed(seed)
    return [np.stack([np.asarray(action_space.sample()) for _ in range(n_envs)]) for _ in range(n_steps)]


def _options(n_envs: int) -> list[dict]:
    # some envs get options, some not (an empty dict means "no options")
    return [{"offset": 0.5 * i} if i % 3 != 1 else {} for i in range(n_envs)]


def _compare_step(i: int, ref, out, ref_env, env, stats: Stats) -> None:
    obs_r, rew_r, done_r, infos_r = ref
    obs_s, rew_s, done_s, infos_s = out
    where = f"step {i}"
    assert_same(obs_s, obs_r, f"{where} obs", strict_dtype=True)
    assert_same(rew_s, rew_r, f"{where} rewards", strict_dtype=True)
    assert_same(done_s, done_r, f"{where} dones", strict_dtype=True)
    assert isinstance(infos_s, list) and len(infos_s) == len(infos_r)
    assert_same(infos_s, infos_r, f"{where} infos")
    assert_same(env.reset_infos, ref_env.reset_infos, f"{where} reset_infos")
    for k, info in enumerate(infos_r):
        if done_r[k]:
            assert "terminal_observation" in infos_s[k]
            if info["TimeLimit.truncated"]:
                stats.truncated += 1
            else:
                stats.terminated += 1
            if ref_env.reset_infos[k]:
                stats.nonempty_reset_infos += 1
        if set(info) - {"TimeLimit.truncated", "terminal_observation"}:
            stats.nonempty_infos += 1


def run_lockstep(ref_env, env, n_steps: int = N_STEPS, seed: int = 123, options: list[dict] | None = None) -> Stats:
    """Runs both vec envs on the same seeds and actions; asserts every output is equal."""
    stats = Stats()
    assert env.num_envs == ref_env.num_envs
    assert env.observation_space == ref_env.observation_space
    assert env.action_space == ref_env.action_space
    n = env.num_envs
    for venv in (ref_env, env):
        venv.seed(seed)
        if options is not None:
            venv.set_options(options)
    assert_same(env.reset(), ref_env.reset(), "first reset obs", strict_dtype=True)
    assert_same(env.reset_infos, ref_env.reset_infos, "first reset_infos")
    if options is not None:  # the options reached the envs
        assert [info["offset"] for info in env.reset_infos] == [o.get("offset", 0.0) for o in options]

    actions = _actions(env.action_space, n, n_steps + 20, seed)
    for i in range(n_steps):
        ref = ref_env.step(actions[i])
        env.step_async(actions[i])
        out = env.step_wait()
        _compare_step(i, ref, out, ref_env, env, stats)

    # a second reset: without seeds (the generators go on), then a few more steps
    assert_same(env.reset(), ref_env.reset(), "second reset obs", strict_dtype=True)
    assert_same(env.reset_infos, ref_env.reset_infos, "second reset_infos")
    assert all(info["offset"] == 0.0 for info in env.reset_infos)  # options are used once
    for i in range(n_steps, n_steps + 20):
        _compare_step(i, ref_env.step(actions[i]), env.step(actions[i]), ref_env, env, stats)
    return stats


def _check_coverage(stats: Stats) -> None:
    """The run exercised what it claims to: both kinds of episode end, infos, reset infos."""
    assert stats.terminated > 0
    assert stats.truncated > 0
    assert stats.nonempty_infos > 0
    assert stats.nonempty_reset_infos > 0


@pytest.mark.parametrize("method, obs_kind, act_kind, n_envs, n_workers", FORK_CASES + SLOW_CASES)
def test_matches_dummy_vec_env(method, obs_kind, act_kind, n_envs, n_workers):
    fns = testenvs.spaces_env_fns(obs_kind, act_kind, n_envs)
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = ShmVecEnv(fns, n_workers=n_workers, start_method=method)
        assert env.n_workers == n_workers
        options = _options(n_envs) if n_envs != 13 else None
        stats = run_lockstep(ref, env, options=options)
        _check_coverage(stats)
    finally:
        close_all(env, ref)


def _record_early_wakes(env: ShmVecEnv) -> list[int]:
    """After each step_wait, the early-wake flag: 1 when a worker on the parent's core woke it early."""
    flags: list[int] = []
    step_wait = env.step_wait

    def recording_step_wait():
        out = step_wait()
        flags.append(env._engine.words.load(P.EARLY_WAKE))
        return out

    env.step_wait = recording_step_wait
    return flags


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("parent_spin_us, expect_early", [(0.0, True), (1000.0, False)])
def test_matches_dummy_vec_env_through_early_wakes(parent_spin_us, expect_early):
    """Worker 0 shares the parent's core (both pinned) and finishes first (worker 1's envs are
    slow): with a sleeping parent it wakes the parent early and sleeps, the parent spins until
    worker 1 is done (protocol, "Early wake").  Every step still equals DummyVecEnv's; a
    spinning parent is never woken early."""
    here, other = sorted(os.sched_getaffinity(0))[:2]
    fns = [functools.partial(testenvs.make_slow_spaces_env, 0.0 if i < 3 else 0.0005, i) for i in range(6)]
    ref = DummyVecEnv(fns)
    env = None
    allowed = os.sched_getaffinity(0)
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method="fork", cpu_affinity=[[here], [other]],
                        spin_us=(parent_spin_us, 5000.0))
        os.sched_setaffinity(0, {here})
        flags = _record_early_wakes(env)
        stats = run_lockstep(ref, env, n_steps=60, options=_options(6))
        assert stats.terminated and stats.truncated
        if expect_early:
            assert sum(flags) >= len(flags) // 2, f"early wakes in {sum(flags)} of {len(flags)} steps"
        else:
            assert sum(flags) == 0
    finally:
        os.sched_setaffinity(0, allowed)
        close_all(env, ref)


def test_matches_dummy_vec_env_with_copy_false():
    """copy=False returns views, but each step's values are still the right ones."""
    fns = testenvs.spaces_env_fns("dict", "box", 6)
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method="fork", copy=False)
        _check_coverage(run_lockstep(ref, env, options=_options(6)))
    finally:
        close_all(env, ref)


def test_matches_dummy_vec_env_when_infos_overflow_the_mailbox():
    """Infos too large for the mailbox travel through the pipe and still arrive intact."""
    fns = [functools.partial(testenvs.make_big_info_env, i) for i in range(4)]
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method="fork", mailbox_bytes=1024)
        stats = run_lockstep(ref, env, n_steps=40)
        assert stats.truncated > 0
    finally:
        close_all(env, ref)


def test_step_takes_the_short_way_and_still_matches_dummy(monkeypatch):
    """``step()`` skips ``step_async``/``step_wait`` for the usual spaces; every output (terminal
    observations and Monitor's episode infos included) still equals DummyVecEnv's (as in
    test_make_vec_env_cartpole_matches_dummy, for every start method).  Anything the short way
    does not take (an action out of range) goes the long way and raises as before, and so does a
    step_async replaced on the object itself."""
    kwargs = {"n_workers": 2, "start_method": "fork"}
    ref = make_vec_env("CartPole-v1", n_envs=6, vec_env_cls=DummyVecEnv, seed=5)
    env = None
    try:
        env = make_vec_env("CartPole-v1", n_envs=6, vec_env_cls=ShmVecEnv, vec_env_kwargs=kwargs, seed=5)
        assert env._fast is not None
        long_way: list[str] = []
        original = ShmVecEnv.step_async

        def counting(self, actions):
            long_way.append("class")
            return original(self, actions)

        monkeypatch.setattr(ShmVecEnv, "step_async", counting)  # after construction: counts, changes nothing
        assert_same(env.reset(), ref.reset(), "reset", strict_dtype=True)
        actions = np.random.default_rng(5).integers(0, 2, size=(150, 6))
        episodes = 0
        for i, a in enumerate(actions):
            out, expected = env.step(a), ref.step(a)
            for k, what in enumerate(("obs", "rewards", "dones")):
                assert_same(out[k], expected[k], f"step {i} {what}", strict_dtype=True)
            # Monitor's "t" is wall-clock time: the only field that may differ
            assert_same(out[3], expected[3], f"step {i} infos", ignore=frozenset({"t"}))
            assert_same(env.reset_infos, ref.reset_infos, f"step {i} reset_infos")
            episodes += sum("episode" in info for info in out[3])
        assert episodes > 0 and long_way == []
        with pytest.raises(ValueError, match="env"):
            env.step(np.full(6, 7))
        assert long_way == ["class"]
        env.step_async = lambda a: (long_way.append("object"), original(env, a))[1]
        env.step(actions[0])
        assert long_way == ["class", "object"]
        del env.step_async
    finally:
        close_all(env, ref)


class _CountingShmVecEnv(ShmVecEnv):
    def step_wait(self):
        self.waits = getattr(self, "waits", 0) + 1
        return super().step_wait()


def test_step_goes_the_long_way_where_a_subclass_overrides_step_wait():
    env = _CountingShmVecEnv(testenvs.spaces_env_fns("box", "discrete", 2), n_workers=2, start_method="fork")
    try:
        assert env._fast is None
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        assert env.waits == 1
    finally:
        close_all(env)


def test_infos_of_every_type_arrive_as_the_same_types():
    """Infos travel in the info codec where it carries every value and pickled where it does not
    (an OrderedDict every fourth step): either way each value arrives with its own type."""
    fns = [functools.partial(testenvs.make_mixed_info_env, i) for i in range(5)]
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method="fork")
        for venv in (ref, env):
            venv.seed(7)
        env.reset(), ref.reset()
        actions = _actions(env.action_space, 5, 24, 7)
        kinds = set()
        for a in actions:
            _, _, _, infos_r = ref.step(a)
            _, _, _, infos_s = env.step(a)
            assert_same(infos_s, infos_r, "infos")
            assert [type_tree(i) for i in infos_s] == [type_tree(i) for i in infos_r]
            kinds.update("odd" in i for i in infos_s)
        assert kinds == {True, False}  # both paths ran
    finally:
        close_all(env, ref)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_make_vec_env_cartpole_matches_dummy(method):
    kwargs = {"start_method": method, "n_workers": 2}
    env = ref = None
    try:
        ref = make_vec_env("CartPole-v1", n_envs=8, seed=0, vec_env_cls=DummyVecEnv)
        env = make_vec_env("CartPole-v1", n_envs=8, seed=0, vec_env_cls=ShmVecEnv, vec_env_kwargs=kwargs)
        assert isinstance(env, ShmVecEnv)
        assert_same(env.reset(), ref.reset(), "reset obs", strict_dtype=True)
        assert_same(env.reset_infos, ref.reset_infos, "reset_infos")
        actions = _actions(env.action_space, 8, 300, seed=0)
        episodes = 0
        for i, act in enumerate(actions):
            obs_r, rew_r, done_r, infos_r = ref.step(act)
            obs_s, rew_s, done_s, infos_s = env.step(act)
            assert_same(obs_s, obs_r, f"step {i} obs", strict_dtype=True)
            assert_same(rew_s, rew_r, f"step {i} rewards", strict_dtype=True)
            assert_same(done_s, done_r, f"step {i} dones", strict_dtype=True)
            # Monitor's "t" is wall-clock time: the only field that may differ
            assert_same(infos_s, infos_r, f"step {i} infos", ignore=frozenset({"t"}))
            for k in np.flatnonzero(done_r):
                ep = infos_s[k]["episode"]
                assert ep["l"] == infos_r[k]["episode"]["l"] and ep["r"] == infos_r[k]["episode"]["r"]
                assert isinstance(ep["t"], float)
                episodes += 1
        assert episodes >= 8
    finally:
        close_all(env, ref)


class ReferenceVecEnv:
    """The SB3 auto-reset semantics written out plainly, for spaces DummyVecEnv refuses (nested Dict)."""

    def __init__(self, fns):
        self.envs = [fn() for fn in fns]
        self.num_envs = len(self.envs)

    def reset(self, seed):
        return [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]

    def step(self, actions):
        out = []
        for env, action in zip(self.envs, actions):
            obs, rew, term, trunc, info = env.step(action)
            terminal = None
            if term or trunc:
                terminal = obs
                obs, _ = env.reset()
            out.append((obs, np.float32(rew), term or trunc, terminal))
        return out

    def close(self):
        for env in self.envs:
            env.close()


def _leaf(value, path):
    for key in path:
        value = value[key]
    return value


def _paths(space, path=()):
    if isinstance(space, spaces.Dict):
        return [p for key, sub in space.spaces.items() for p in _paths(sub, path + (key,))]
    if isinstance(space, spaces.Tuple):
        return [p for k, sub in enumerate(space.spaces) for p in _paths(sub, path + (k,))]
    return [(path, space)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_nested_dict_matches_reference(method):
    fns = testenvs.spaces_env_fns("nested", "multidiscrete", 5)
    ref = ReferenceVecEnv(fns)
    env = None
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method=method)
        assert env.observation_space == testenvs.make_obs_space("nested")
        leaves = _paths(env.observation_space)
        assert len(leaves) == 5

        def check(batch, singles, what):
            # same nesting as the space, one batch array per leaf, equal to each env's own value
            assert isinstance(batch, dict) and set(batch) == {"inner", "pair", "flag"}
            assert isinstance(batch["pair"], tuple)
            for path, sub in leaves:
                arr = _leaf(batch, path)
                assert isinstance(arr, np.ndarray), (what, path)
                assert arr.shape == (5, *sub.shape), (what, path)
                assert arr.dtype == sub.dtype, (what, path)
                for k, single in enumerate(singles):
                    if single is not None:
                        assert np.array_equal(arr[k], _leaf(single, path)), (what, path, k)

        env.seed(7)
        check(env.reset(), ref.reset(7), "reset")
        actions = _actions(env.action_space, 5, 60, seed=7)
        ends = 0
        for i, act in enumerate(actions):
            expected = ref.step(act)
            obs, rew, dones, infos = env.step(act)
            check(obs, [e[0] for e in expected], f"step {i}")
            assert np.array_equal(rew, np.array([e[1] for e in expected], dtype=np.float32))
            assert dones.tolist() == [e[2] for e in expected]
            for k, e in enumerate(expected):
                if e[2]:
                    ends += 1
                    term = infos[k]["terminal_observation"]
                    for path, _ in leaves:
                        assert np.array_equal(_leaf(term, path), _leaf(e[3], path))
        assert ends > 0
    finally:
        close_all(env, ref)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_dict_spaces_whose_keys_come_in_another_order_in_some_envs_match_dummy(method):
    """Envs 2 and 3 (worker 1's) list their Dict keys the other way round: equal spaces, so the vec env takes
    them, and each process built its buffer layout from its own env's space (the leaves landed
    at other offsets: other envs' bytes in the observations, garbage in the actions)."""
    from gymnasium.vector import SyncVectorEnv

    from shmvec import ShmVectorEnv

    fns = [functools.partial(testenvs.make_key_order_env, i, dict_actions=False) for i in range(4)]
    ref, env = DummyVecEnv(fns), ShmVecEnv(fns, n_workers=2, start_method=method, timeout=30.0)
    try:
        assert_same(env.reset(), ref.reset(), "reset")
        for t in range(10):
            act = np.arange(4) + t
            assert_same(env.step(act), ref.step(act), f"step {t}")
    finally:
        close_all(env, ref)
    # Dict actions (Gymnasium's API): each env gets its own action's values under each key.
    fns = [functools.partial(testenvs.make_key_order_env, i) for i in range(4)]
    gref, genv = SyncVectorEnv(fns), ShmVectorEnv(fns, n_workers=2, start_method=method, timeout=30.0)
    try:
        assert_same(genv.reset(seed=1), gref.reset(seed=1), "reset")
        rng = np.random.default_rng(0)
        for t in range(10):
            act = {"x": rng.integers(0, 50, size=4), "y": rng.uniform(-1, 1, size=(4, 2)).astype(np.float32)}
            got = genv.step(act)
            assert_same(got, gref.step(act), f"step {t}")
            if "x" in got[4]:  # not on the step that resets every env (NEXT_STEP autoreset)
                mask = got[4]["_x"]
                assert got[4]["x"][mask].tolist() == act["x"][mask].tolist()
    finally:
        close_all(genv, gref)


def test_flags_returned_as_one_element_arrays_match_dummy():
    """DummyVecEnv stores each env's flags as numpy takes them; the workers' batch write refused a
    list of (1,) arrays and broke the vec env."""
    import warnings

    fns = [functools.partial(testenvs.make_array_flags_env, i) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy: an array of ndim 1 taken as a scalar
        ref = DummyVecEnv(fns)
        env = ShmVecEnv(fns, n_workers=2, start_method="fork", timeout=30.0)
        try:
            ref.seed(4)
            env.seed(4)
            assert_same(env.reset(), ref.reset(), "reset")
            dones = 0
            for t in range(30):
                act = np.full(4, t % 3)
                got, want = env.step(act), ref.step(act)
                # DummyVecEnv's TimeLimit.truncated is `truncated and not terminated`: a (1,) array here
                assert_same(got, want, f"step {t}", ignore=frozenset({"TimeLimit.truncated"}))
                assert [info["TimeLimit.truncated"] for info in got[3]] == [bool(i["TimeLimit.truncated"]) for i in want[3]]
                dones += int(got[2].sum())
            assert dones > 0
        finally:
            close_all(env, ref)


@pytest.mark.parametrize("kind", ["dict", "tuple"])  # DummyVecEnv refuses nested spaces
def test_structured_observation_batches_have_the_references_container_types(kind):
    """A Dict batch is an OrderedDict for SB3's face (DummyVecEnv's, and SubprocVecEnv's);
    Gymnasium's face returns a plain dict (SyncVectorEnv's)."""
    from gymnasium.vector import SyncVectorEnv

    from shmvec import ShmVecEnvPool, ShmVectorEnv

    fns = testenvs.spaces_env_fns(kind, "discrete", 3)
    envs = [DummyVecEnv(fns), ShmVecEnv(fns, n_workers=2, start_method="fork"),
            ShmVecEnvPool(fns, n_workers=2, start_method="fork"),
            SyncVectorEnv(fns), ShmVectorEnv(fns, n_workers=2, start_method="fork")]
    try:
        containers = []
        for env in envs:
            sb3 = not hasattr(env, "single_observation_space") or isinstance(env, ShmVecEnvPool)
            obs = env.reset() if sb3 else env.reset(seed=1)[0]
            step = env.step(np.zeros(3, dtype=np.int64))[0]
            containers.append((type_tree(obs), type_tree(step)))
        assert containers[1] == containers[0] and containers[2] == containers[0]
        assert containers[4] == containers[3]
    finally:
        close_all(*envs)


@pytest.mark.parametrize("obs_kind", ["box", "image", "discrete", "dict", "tuple"])
def test_matches_dummy_vec_env_with_zero_copy(obs_kind):
    """zero_copy=True: observations handed out from lease blocks, still DummyVecEnv's step for step."""
    act_kind = ACT_FOR_OBS.get(obs_kind, "discrete")
    fns = testenvs.spaces_env_fns(obs_kind, act_kind, 5)
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = ShmVecEnv(fns, n_workers=2, start_method="fork", zero_copy=True)
        _check_coverage(run_lockstep(ref, env, options=_options(5)))
        assert env._engine.leases.grown >= 2
    finally:
        close_all(env, ref)
