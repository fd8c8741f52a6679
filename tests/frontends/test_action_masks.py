"""Action masks from shared memory (``ShmVecEnv(action_masks=...)``) and sb3-contrib's MaskablePPO."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

import sb3envs
from helpers import assert_same, close_all
from shmvec import ObservationError, ShmVecEnv, ShmVecEnvError, SpaceError

sb3_contrib = pytest.importorskip("sb3_contrib")
from sb3_contrib import MaskablePPO  # noqa: E402
from sb3_contrib.common.maskable.utils import get_action_masks  # noqa: E402
from sb3_contrib.common.wrappers import ActionMasker  # noqa: E402


def _pair(fns, **kwargs):
    return DummyVecEnv(fns), ShmVecEnv(fns, start_method="fork", **kwargs)


def _valid_actions(masks: np.ndarray, n: int, rng: np.random.Generator, multi: bool) -> np.ndarray:
    first = np.array([rng.choice(np.flatnonzero(m[:n])) for m in masks])
    if multi:
        return np.stack([first, rng.integers(0, 2, size=len(first))], axis=1)
    return first


@pytest.mark.parametrize("multi", [False, True], ids=["discrete", "multidiscrete"])
@pytest.mark.parametrize("n_workers", [1, 2])
def test_masks_equal_dummy_vec_env_step_by_step(multi, n_workers):
    fns = sb3envs.masked_env_fns(5, multi=multi)
    ref, env = _pair(fns, n_workers=n_workers)
    try:
        assert env.masks_in_shm
        ref.seed(3)
        env.seed(3)
        assert_same(env.reset(), ref.reset())
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(80):
            masks_ref = get_action_masks(ref)
            masks = get_action_masks(env)  # the path MaskablePPO takes: env_method("action_masks")
            assert masks.dtype == np.bool_
            assert_same(masks, masks_ref)
            assert_same(env.action_masks(), masks_ref)
            assert_same(env.action_masks(indices=[4, 0]), masks_ref[[4, 0]])
            actions = _valid_actions(masks, 5, rng, multi)
            obs, rew, dones, infos = env.step(actions)
            obs_ref, rew_ref, dones_ref, infos_ref = ref.step(actions)
            assert_same((obs, rew, dones, infos), (obs_ref, rew_ref, dones_ref, infos_ref), ignore=frozenset({"t"}))
            ends += int(dones.sum())
        assert ends > 5  # masks after automatic resets were compared too
    finally:
        close_all(env, ref)


def test_no_mask_is_computed_until_masks_are_asked_for():
    """A plain PPO never asks: with the default option no action_masks() runs (one that draws from
    np_random would otherwise change every episode); from the first ask on they come from the buffer,
    called as often, and in the same places, as DummyVecEnv calls them."""
    fns = [functools.partial(sb3envs.make_drawing_masked_env, i) for i in range(5)]
    ref, env = _pair(fns, n_workers=2)
    try:
        assert env.masks_in_shm
        ref.seed(4)
        env.seed(4)
        assert_same(env.reset(), ref.reset())
        rng = np.random.default_rng(1)
        for t in range(40):
            if t >= 20:  # MaskablePPO's loop from here on
                masks = get_action_masks(env)
                assert_same(masks, get_action_masks(ref), f"step {t} masks")
                actions = _valid_actions(masks, 5, rng, False)
            else:
                actions = rng.integers(0, 5, size=5)
            assert_same(env.step(actions), ref.step(actions), f"step {t}")
            if t == 19:
                assert env.get_attr("mask_calls") == [0] * 5
        # The workers wrote the masks after the last step already; DummyVecEnv calls at the ask.
        assert_same(get_action_masks(env), get_action_masks(ref), "masks after the last step")
        assert env.get_attr("mask_calls") == ref.get_attr("mask_calls") == [21] * 5
    finally:
        close_all(env, ref)


def test_set_attr_and_env_method_refresh_the_masks():
    fns = sb3envs.masked_env_fns(4)
    ref, env = _pair(fns, n_workers=2)
    try:
        ref.seed(1)
        env.seed(1)
        env.reset()
        ref.reset()
        for venv in (env, ref):
            venv.set_attr("blocked", 2, indices=[1, 3])
        assert_same(get_action_masks(env), get_action_masks(ref))
        assert not get_action_masks(env)[[1, 3], 2].any()
        for venv in (env, ref):
            venv.env_method("reset", indices=[0])  # the env draws a new mask
        assert_same(get_action_masks(env), get_action_masks(ref))
    finally:
        close_all(env, ref)


def test_masks_off_go_through_the_pipe_and_agree():
    fns = sb3envs.masked_env_fns(3)
    ref, env = _pair(fns, action_masks=False)
    try:
        assert not env.masks_in_shm
        with pytest.raises(ShmVecEnvError, match="action masks are off"):
            env.action_masks()
        ref.seed(5)
        env.seed(5)
        env.reset()
        ref.reset()
        assert_same(get_action_masks(env), get_action_masks(ref))
    finally:
        close_all(env, ref)


def _mask_from_obs(env) -> np.ndarray:
    return env.unwrapped._mask.copy()


def test_action_masker_wrapper_is_detected():
    fns = [functools.partial(_masker_env, i) for i in range(3)]
    ref, env = _pair(fns)
    try:
        assert env.masks_in_shm
        ref.seed(2)
        env.seed(2)
        env.reset()
        ref.reset()
        assert_same(get_action_masks(env), get_action_masks(ref))
    finally:
        close_all(env, ref)


def _masker_env(i: int):
    return ActionMasker(sb3envs.MaskedEnv(index=i), _mask_from_obs)


def test_action_masks_true_without_a_method_or_maskable_space_raises():
    with pytest.raises(SpaceError, match="no action_masks"):
        ShmVecEnv([sb3envs.make_nan_env], start_method="fork", action_masks=True)
    with pytest.raises(SpaceError, match="cannot be masked"):
        ShmVecEnv([_box_masked_env], start_method="fork", action_masks=True)
    env = ShmVecEnv([_box_masked_env], start_method="fork")  # None: silently off
    try:
        assert not env.masks_in_shm
    finally:
        env.close()


def _box_masked_env():
    return ActionMasker(sb3envs.make_point_goal_env(), lambda env: np.ones(2, dtype=bool))


class _WrongSizeMask(sb3envs.MaskedEnv):
    def action_masks(self):
        return np.ones(self.n + 1, dtype=bool)


def _wrong_size_env(i: int):
    return _WrongSizeMask(index=i)


def _wrong_size_env_from(first_bad: int, i: int):
    return _WrongSizeMask(index=i) if i >= first_bad else sb3envs.MaskedEnv(index=i)


def test_a_failed_first_ask_leaves_masks_off_in_every_worker():
    """Worker 1's envs return masks of the wrong size: the first ask raises, and worker 0, whose
    envs answered, must not go on calling action_masks() after every step."""
    env = ShmVecEnv([functools.partial(_wrong_size_env_from, 2, i) for i in range(4)], n_workers=2,
                    start_method="fork")
    try:
        env.reset()
        with pytest.raises(ObservationError, match="raised by env 2"):
            env.action_masks()
        calls = env.get_attr("mask_calls")
        for _ in range(5):
            env.step(np.zeros(4, dtype=np.int64))
        assert env.get_attr("mask_calls") == calls  # nobody asked since
    finally:
        env.close()


@pytest.mark.parametrize("option", [None, True])
def test_wrong_mask_size_names_the_env(option):
    """With masks on from the start the reset raises; by default the first ask does, and every ask
    after it (the masks are not turned on half way)."""
    env = ShmVecEnv([functools.partial(_wrong_size_env, i) for i in range(3)], n_workers=1, start_method="fork",
                    action_masks=option)
    try:
        if option:
            with pytest.raises(ObservationError, match=r"(?s)needs 5.*raised by env 0.*during reset") as info:
                env.reset()
        else:
            env.reset()
            for _ in range(2):
                with pytest.raises(ObservationError, match=r"(?s)needs 5.*raised by env 0.*during action_masks") as info:
                    get_action_masks(env)
        assert "action_masks()" in str(info.value)
    finally:
        env.close()


def _maskable_ppo(venv, seed=0):
    return MaskablePPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=2, seed=seed,
                       policy_kwargs={"net_arch": [32]}, verbose=0)


def test_maskable_ppo_trains_and_matches_dummy_vec_env(one_torch_thread):
    """Same seeds: MaskablePPO collects the same rollouts through both, so ends with the same weights."""
    results = []
    for cls, kwargs in ((DummyVecEnv, {}), (ShmVecEnv, {"start_method": "fork", "n_workers": 2})):
        venv = cls(sb3envs.masked_env_fns(4), **kwargs)
        try:
            model = _maskable_ppo(venv)
            model.learn(256)
            results.append(([p.detach().clone() for p in model.policy.parameters()],
                            [(ep["r"], ep["l"]) for ep in model.ep_info_buffer]))
        finally:
            venv.close()
    (params_ref, eps_ref), (params, eps) = results
    assert len(eps_ref) > 3
    assert eps == eps_ref
    assert all(torch.equal(a, b) for a, b in zip(params, params_ref))


def test_maskable_ppo_never_takes_a_masked_action():
    venv = ShmVecEnv(sb3envs.masked_env_fns(4), start_method="fork", n_workers=2)
    try:
        model = _maskable_ppo(venv)
        obs = venv.reset()
        for _ in range(50):
            masks = get_action_masks(venv)
            actions, _ = model.predict(obs, action_masks=masks)
            assert masks[np.arange(4), actions].all()
            obs, *_ = venv.step(actions)
    finally:
        venv.close()


def test_masks_of_a_restarted_worker_are_rewritten():
    """on_failure="restart": the new worker resets its envs and writes their masks before the step returns."""
    from shmvec import WorkerRestartWarning

    fns = [functools.partial(sb3envs.make_masked_env_with_crash, i, 3 if i == 3 else None) for i in range(4)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart")
    try:
        env.seed(0)
        env.reset()
        restarted = []
        with pytest.warns(WorkerRestartWarning):
            for _ in range(3):
                masks = env.action_masks()
                assert_same(masks, np.stack(env.env_method("current_mask")))
                _, _, dones, infos = env.step(masks.argmax(axis=1))
                restarted += [i for i, info in enumerate(infos) if "shmvec_restarted" in info]
        assert restarted == [2, 3]
        assert env.restarts == 1
        assert_same(env.action_masks(), np.stack(env.env_method("current_mask")))
        assert env.action_masks().any(axis=1).all()
    finally:
        env.close()
