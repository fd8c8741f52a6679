"""zero_copy: observations handed out from lease blocks of shared memory (shmvec._leases).

What must hold: every observation equals DummyVecEnv's (SyncVectorEnv's) on the same seeds, and
stays so while the caller holds it, or any view of it, whatever later steps do; SB3 on top
(PPO's rollout buffer, VecFrameStack, VecNormalize) computes exactly what it computes over
DummyVecEnv; the blocks grow only as the caller keeps observations, up to the bound, then the
observations are copies; /dev/shm running out means copies, not a crash.
"""

from __future__ import annotations

import errno
import functools
import gc
import os

import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize

import testenvs
from helpers import assert_same, close_all
from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec._bench.envs import ImageEnv
from shmvec._errors import SpaceError
from shmvec._leases import AUTO_MIN_BYTES, MAX_BLOCKS

ACT_FOR_OBS = {"box": "box", "image": "discrete", "dict": "discrete", "tuple": "multibinary", "discrete": "box"}


def _pair(obs_kind: str, n_envs: int = 4, method: str = "fork", **kwargs):
    fns = testenvs.spaces_env_fns(obs_kind, ACT_FOR_OBS[obs_kind], n_envs)
    ref = DummyVecEnv(fns)
    env = ShmVecEnv(fns, n_workers=2, start_method=method, zero_copy=True, **kwargs)
    return ref, env


def _actions(env, n_steps: int, seed: int = 3) -> list:
    env.action_space.seed(seed)
    return [np.stack([np.asarray(env.action_space.sample()) for _ in range(env.num_envs)]) for _ in range(n_steps)]


def _leased(obs) -> bool:
    """Whether ``obs`` (every leaf) views shared memory rather than owning a copy."""
    leaves = obs.values() if isinstance(obs, dict) else obs if isinstance(obs, tuple) else [obs]
    return all(not leaf.flags.owndata for leaf in leaves)


@pytest.mark.parametrize("method, obs_kind", [
    ("fork", "image"), ("fork", "dict"), ("fork", "tuple"), ("fork", "discrete"),
    ("forkserver", "image"), ("spawn", "dict"),
])
def test_observations_kept_by_the_caller_are_never_overwritten(method, obs_kind):
    """The caller keeps every observation: the first MAX_BLOCKS - 1 come from lease blocks (one
    went to the reset), the rest are copies; at the end each still equals DummyVecEnv's."""
    ref, env = _pair(obs_kind, method=method)
    try:
        env.seed(5)
        ref.seed(5)
        kept, want = [env.reset()], [ref.reset()]
        assert _leased(kept[0])
        for t, act in enumerate(_actions(env, 2 * MAX_BLOCKS + 4)):
            obs, rew, done, infos = env.step(act)
            r_obs, r_rew, r_done, r_infos = ref.step(act)
            assert_same(obs, r_obs, f"step {t} obs", strict_dtype=True)
            assert_same(infos, r_infos, f"step {t} infos")
            kept.append(obs)
            want.append(r_obs)
        assert [_leased(o) for o in kept] == [True] * MAX_BLOCKS + [False] * (len(kept) - MAX_BLOCKS)
        for t, (obs, r_obs) in enumerate(zip(kept, want)):
            assert_same(obs, r_obs, f"kept observation {t}", strict_dtype=True)
        # Let them go: the blocks are free again, and used again.
        del kept, obs
        env.step(_actions(env, 1)[0])
        assert env._engine.leases.block == 1
    finally:
        close_all(env, ref)


def test_a_view_of_an_observation_keeps_its_block():
    """A slice, a reshape, a transpose, a torch tensor over the memory: each keeps the block from
    being written; once they go, the block serves again."""
    ref, env = _pair("image")
    try:
        env.seed(1)
        ref.seed(1)
        obs, r_obs = env.reset(), ref.reset()
        held = {"slice": obs[1:3], "reshape": obs.reshape(len(obs), -1), "transpose": obs.T,
                "torch": torch.from_numpy(obs), "row": obs[2]}
        want = {"slice": r_obs[1:3], "reshape": r_obs.reshape(len(r_obs), -1), "transpose": r_obs.T,
                "torch": r_obs, "row": r_obs[2]}
        del obs
        for act in _actions(env, 12):
            env.step(act)
        for key, value in held.items():
            assert_same(np.asarray(value), want[key], f"{key} of the reset observation")
        # The held block (1), and one more for the steps, whose results nobody keeps (2).
        assert env._engine.leases.grown == 2 and env._engine.leases.block == 2
        del value, held
        env.step(_actions(env, 1, seed=4)[0])
        assert env._engine.leases.grown == 2 and env._engine.leases.block == 1
    finally:
        close_all(env, ref)


def test_ppo_learns_exactly_as_on_dummy_vec_env():
    """SB3's PPO (its rollout buffer, _last_obs kept across steps) ends with the same weights and
    the same rollout buffer on ShmVecEnv(zero_copy=True) as on DummyVecEnv."""
    results = []
    for make in (DummyVecEnv, functools.partial(ShmVecEnv, n_workers=2, start_method="fork", zero_copy=True)):
        venv = make(testenvs.spaces_env_fns("image", "discrete", 4))
        model = None
        try:
            model = PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=2, seed=0, device="cpu")
            model.learn(total_timesteps=3 * 16 * 4)
            params = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
            results.append((params, model.rollout_buffer.observations.copy(), model.rollout_buffer.rewards.copy()))
        finally:
            del model  # (it holds its last observation, a lease block, in reference cycles)
            gc.collect()
            venv.close()
    (p_ref, o_ref, r_ref), (p_shm, o_shm, r_shm) = results
    assert_same(o_shm, o_ref, "rollout buffer observations", strict_dtype=True)
    assert_same(r_shm, r_ref, "rollout buffer rewards", strict_dtype=True)
    for key in p_ref:
        assert torch.equal(p_shm[key], p_ref[key]), key


@pytest.mark.parametrize("wrap", ["frame_stack", "normalize"])
def test_vec_frame_stack_and_vec_normalize_on_top(wrap):
    """SB3's wrappers over ShmVecEnv(zero_copy=True) give what they give over DummyVecEnv, step for
    step (VecNormalize keeps the raw observation of the last step: get_original_obs())."""
    obs_kind = "image" if wrap == "frame_stack" else "box"
    ref, env = _pair(obs_kind)
    if wrap == "frame_stack":
        ref, env = VecFrameStack(ref, 3), VecFrameStack(env, 3)
    else:
        ref, env = VecNormalize(ref), VecNormalize(env)
    try:
        env.seed(2)
        ref.seed(2)
        assert_same(env.reset(), ref.reset(), "reset", strict_dtype=True)
        for t, act in enumerate(_actions(env, 60)):
            out, want = env.step(act), ref.step(act)
            assert_same(out[:3], want[:3], f"step {t}", strict_dtype=True)
            assert_same(out[3], want[3], f"step {t} infos")
            if wrap == "normalize":
                assert_same(env.get_original_obs(), ref.get_original_obs(), f"step {t} original obs")
    finally:
        close_all(env, ref)


def test_shm_vector_env_observations_kept_are_never_overwritten():
    """The Gymnasium face: every observation kept equals SyncVectorEnv's."""
    fns = testenvs.spaces_env_fns("dict", "discrete", 3)
    ref = SyncVectorEnv(fns)
    env = ShmVectorEnv(fns, n_workers=2, start_method="fork", zero_copy=True)
    try:
        kept, want = [env.reset(seed=9)[0]], [ref.reset(seed=9)[0]]
        ref.action_space.seed(0)
        for t in range(MAX_BLOCKS + 3):
            act = ref.action_space.sample()
            kept.append(env.step(act)[0])
            want.append(ref.step(act)[0])
        for t, (obs, r_obs) in enumerate(zip(kept, want)):
            assert_same(obs, r_obs, f"kept observation {t}", strict_dtype=True)
        assert type(kept[0]) is dict and kept[1] is not kept[0]
    finally:
        close_all(env, ref)


def _image_fns(n_envs: int, shape=(84, 84, 4)) -> list:
    return [functools.partial(ImageEnv, shape) for _ in range(n_envs)]


def test_by_default_on_for_images_off_for_small_observations():
    small = ShmVecEnv(testenvs.spaces_env_fns("box", "discrete", 4), n_workers=2, start_method="fork")
    images = ShmVecEnv(_image_fns(4), n_workers=2, start_method="fork")
    vector = ShmVectorEnv(_image_fns(4), n_workers=2, start_method="fork")
    no_copy = ShmVecEnv(_image_fns(4), n_workers=2, start_method="fork", copy=False)
    off = ShmVecEnv(_image_fns(4), n_workers=2, start_method="fork", zero_copy=False)
    try:
        assert 4 * 5 * 4 < AUTO_MIN_BYTES <= 4 * 84 * 84 * 4
        assert small._engine.leases is None and not small.zero_copy
        assert images._engine.leases is not None and vector._engine.leases is not None
        assert images.zero_copy and vector.zero_copy and not off.zero_copy
        assert no_copy._engine.leases is None and off._engine.leases is None
        assert _leased(images.reset()) and not _leased(small.reset()) and not _leased(off.reset())
        assert images._engine.layout.obs_blocks == MAX_BLOCKS
    finally:
        close_all(small, images, vector, no_copy, off)


def test_options_it_cannot_go_with_are_refused():
    fns = testenvs.spaces_env_fns("box", "discrete", 2)
    with pytest.raises(ValueError, match="zero_copy=True cannot go with these options: copy=False"):
        ShmVecEnv(fns, copy=False, zero_copy=True)
    with pytest.raises(ValueError, match="on_failure='restart'"):
        ShmVecEnv(fns, on_failure="restart", zero_copy=True)
    with pytest.raises(TypeError, match="zero_copy must be True, False or None"):
        ShmVecEnv(fns, zero_copy="yes")
    with pytest.raises(SpaceError, match="without a fixed size"):
        ShmVecEnv([testenvs.make_text_env] * 2, n_workers=1, start_method="fork", zero_copy=True)
    # The default goes with them: zero_copy is then off.
    env = ShmVecEnv(fns, n_workers=1, start_method="fork", on_failure="restart")
    try:
        assert env._engine.leases is None
    finally:
        env.close()


def _allocated(env) -> int:
    return os.fstat(env._engine.workers.block_fd()).st_blocks * 512


def test_a_block_takes_memory_only_once_used():
    """Pages of a lease block are reserved the first time it is used: holding three observations
    takes three blocks of /dev/shm, not eight."""
    env = ShmVecEnv(_image_fns(4), n_workers=2, start_method="fork", zero_copy=True)
    try:
        layout = env._engine.layout
        block = layout.lease_spans[0][1]
        assert _allocated(env) < layout.base_nbytes + block
        kept = [env.reset()]
        kept += [env.step(np.zeros(4, dtype=np.int64))[0] for _ in range(2)]
        assert env._engine.leases.grown == 3
        assert layout.base_nbytes + 3 * block <= _allocated(env) < layout.base_nbytes + 4 * block + (1 << 16)
        del kept
    finally:
        env.close()


def test_no_room_in_dev_shm_means_copies(monkeypatch):
    """The reservation of a new block fails with ENOSPC: the observations are copies from then on
    (no SIGBUS in a worker writing to pages that do not exist)."""
    ref = DummyVecEnv(_image_fns(3))
    env = ShmVecEnv(_image_fns(3), n_workers=2, start_method="fork", zero_copy=True)
    try:
        first = env.reset()
        assert _leased(first) and env._engine.leases.grown == 1

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
        ref.reset()
        for t in range(3):
            act = np.full(3, t % 4)
            obs, want = env.step(act)[0], ref.step(act)[0]
            assert not _leased(obs)
            assert_same(obs, want, f"step {t}", strict_dtype=True)
        assert env._engine.leases.bound == 1
        del first  # block 1 is free again: leased once more
        assert _leased(env.step(np.zeros(3, dtype=np.int64))[0])
    finally:
        close_all(env, ref)


def test_observations_outlive_close():
    """close() while the caller holds observations: they stay readable (the mapping goes with the
    last of them), and nothing is left behind (the suite's leak check)."""
    env = ShmVecEnv(_image_fns(2, (16, 16, 3)), n_workers=2, start_method="fork", zero_copy=True)
    obs = env.reset()
    part = obs[1]
    copy = obs.copy()
    env.close()
    assert_same(obs, copy, "observation after close")
    assert_same(part, copy[1], "view after close")


def test_what_the_caller_does_to_an_observation_stays_its_own():
    """Setting an observation's shape or writeable flag changes nothing of what the next step hands out."""
    env = ShmVecEnv(_image_fns(2, (16, 16, 3)), n_workers=2, start_method="fork", zero_copy=True)
    try:
        obs = env.reset()
        obs.flags.writeable = False
        obs.shape = (2, -1)
        del obs
        for _ in range(3):
            obs = env.step(np.zeros(2, dtype=np.int64))[0]
            assert obs.shape == (2, 16, 16, 3) and obs.flags.writeable
        del obs
    finally:
        env.close()


def test_the_pools_refuse_zero_copy():
    from shmvec import ShmEnvPool

    with pytest.raises(TypeError, match="zero_copy"):
        ShmEnvPool(_image_fns(2), batch_size=1, zero_copy=True)


class _InterruptingWords:
    """The engine's words, but the first store of PENDING raises KeyboardInterrupt: a Ctrl-C in
    post() after the block was picked and before any worker had the command."""

    def __init__(self, words):
        self.words, self.armed = words, True

    def store(self, index, value):
        from shmvec import _protocol as P

        if index == P.PENDING and self.armed:
            self.armed = False
            raise KeyboardInterrupt
        self.words.store(index, value)

    def __getattr__(self, name):
        return getattr(self.words, name)


def test_a_post_interrupted_before_any_worker_keeps_the_last_observations():
    """Disabled autoreset: a step interrupted before it reached any worker, then a masked reset: the
    envs not reset show their last observations (SyncVectorEnv's), not the block the step picked."""
    from gymnasium.vector import AutoresetMode

    fns = testenvs.spaces_env_fns("image", "discrete", 3)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    env = ShmVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED, n_workers=2, start_method="fork", zero_copy=True)
    try:
        env.reset(seed=4)
        ref.reset(seed=4)
        act = np.array([1, 2, 0])
        kept = env.step(act)[0]  # held: the interrupted step picks another block
        ref.step(act)
        words = env._engine.words
        env._engine.words = _InterruptingWords(words)
        with pytest.raises(KeyboardInterrupt):
            env.step_async(act)
        env._engine.words = words
        mask = np.array([True, False, False])
        out, want = env.reset(options={"reset_mask": mask}), ref.reset(options={"reset_mask": mask})
        assert_same(out, want, "masked reset after the interrupted step", strict_dtype=True)
        del kept
    finally:
        close_all(env, ref)
