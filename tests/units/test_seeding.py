"""Seeds: ``seed(int)`` as SB3, one seed per env, ``SeedSequence``; same seeds, same episodes everywhere."""

from __future__ import annotations

import json

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

import testenvs
from helpers import assert_same
from shmvec import ShmVecEnv, spawn_seeds
from shmvec.factories import per_env_seeds, seed_from_plain

N_ENVS = 6
N_STEPS = 40


def _fns() -> list:
    # Random episode ends, different TimeLimits per env, infos drawn from np_random.
    return testenvs.spaces_env_fns("box", "discrete", N_ENVS, term_prob=0.08)


def _rollout(env, seed) -> list:
    env.seed(seed)
    out = [env.reset()]
    rng = np.random.default_rng(7)
    for _ in range(N_STEPS):
        obs, rew, dones, infos = env.step(rng.integers(0, 3, size=env.num_envs))
        out.append((obs, rew, dones, [info.get("x") for info in infos]))
    return out


def test_seed_int_gives_env_i_seed_plus_i():
    assert per_env_seeds(10, 4)[0] == [10, 11, 12, 13]
    assert per_env_seeds(np.int64(3), 2)[0] == [3, 4]
    seeds, plain = per_env_seeds(None, 3)
    assert seeds == [plain, plain + 1, plain + 2]


def test_seed_list_is_one_per_env_and_length_checked():
    assert per_env_seeds([5, None, 9], 3)[0] == [5, None, 9]
    with pytest.raises(ValueError, match="2 seeds for 3 envs"):
        per_env_seeds([1, 2], 3)
    with pytest.raises(TypeError, match=r"seed\[1\]"):
        per_env_seeds([1, "two", 3], 3)
    with pytest.raises(TypeError, match="SeedSequence"):
        per_env_seeds(1.5, 3)


def test_seed_sequence_gives_independent_reproducible_seeds():
    ss = np.random.SeedSequence(1234)
    seeds, plain = per_env_seeds(ss, 5)
    assert seeds == per_env_seeds(np.random.SeedSequence(1234), 5)[0]  # no hidden state
    assert seeds == spawn_seeds(1234, 5)
    assert seeds == [int(child.generate_state(1, np.uint64)[0]) for child in np.random.SeedSequence(1234).spawn(5)]
    assert len(set(seeds)) == 5
    # Nearby run seeds share no env seed (with seed + i, runs 1234 and 1235 share four of five).
    assert not set(seeds) & set(spawn_seeds(1235, 5))
    # Round trip through plain data (describe()).
    again = seed_from_plain(json.loads(json.dumps(plain)))
    assert per_env_seeds(again, 5)[0] == seeds
    child = np.random.SeedSequence(99).spawn(2)[1]
    assert per_env_seeds(seed_from_plain(per_env_seeds(child, 3)[1]), 3)[0] == spawn_seeds(child, 3)


def test_vec_env_seed_accepts_each_form():
    env = ShmVecEnv(_fns()[:3], n_workers=2, start_method="fork")
    try:
        assert env.seed(4) == [4, 5, 6]
        assert env.seed([7, 8, 9]) == [7, 8, 9]
        assert env.seed(np.random.SeedSequence(3)) == spawn_seeds(3, 3)
        with pytest.raises(ValueError):
            env.seed([1, 2])
        env.seed([1, 2, 3])
        first = env.reset()
        env.seed([1, 20, 3])
        second = env.reset()
        assert_same(first[[0, 2]], second[[0, 2]])
        assert not np.array_equal(first[1], second[1])
    finally:
        env.close()


@pytest.fixture(scope="module")
def reference():
    """DummyVecEnv's rollouts for an int seed, and ShmVecEnv's (1 worker, fork) for the other forms."""
    dummy = DummyVecEnv(_fns())
    try:
        out = {"int": _rollout(dummy, 100)}
    finally:
        dummy.close()
    env = ShmVecEnv(_fns(), n_workers=1, start_method="fork")
    try:
        out["list"] = _rollout(env, [11, 5, 3, 99, 0, 7])
        out["seedseq"] = _rollout(env, np.random.SeedSequence(42))
    finally:
        env.close()
    return out


SPLITS = [
    ("fork", {"n_workers": 1}),
    ("fork", {"n_workers": 2}),
    ("fork", {"n_workers": 3}),
    ("spawn", {"n_workers": 2}),
    ("forkserver", {"n_workers": 3}),
    ("forkserver", {"envs_per_worker": 1}),
]


@pytest.mark.parametrize("start_method, split", SPLITS, ids=[f"{m}-{next(iter(s))}{next(iter(s.values()))}"
                                                             for m, s in SPLITS])
def test_same_seeds_same_episodes_whatever_the_start_method_and_split(reference, start_method, split):
    env = ShmVecEnv(_fns(), start_method=start_method, **split)
    try:
        assert_same(_rollout(env, 100), reference["int"])
        assert_same(_rollout(env, [11, 5, 3, 99, 0, 7]), reference["list"])
        assert_same(_rollout(env, np.random.SeedSequence(42)), reference["seedseq"])
    finally:
        env.close()
    # The three seedings differ from each other (the comparison above is not vacuous).
    assert not np.array_equal(reference["int"][0], reference["seedseq"][0])
    assert not np.array_equal(reference["list"][0], reference["seedseq"][0])
