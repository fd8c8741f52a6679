"""Spaces without a fixed size (``Text``, ``Sequence``, ``Graph``, ``OneOf``, a custom ``Space``),
alone or mixed with fixed-size leaves, in both faces, step for step against their references.

The values of such leaves travel pickled in the workers' result messages (and the actions of
such leaves in the parent's step messages: shmvec._pickled_leaves); the fixed-size leaves stay in
shared memory.  Everything is compared exactly, types included (:func:`identical`):

- ``ShmVectorEnv`` against Gymnasium's ``SyncVectorEnv`` with the same autoreset mode: a batch of
  such a leaf is a tuple of the envs' values, ``final_obs`` holds what each env returned;
- ``ShmVecEnv`` against SB3: ``DummyVecEnv`` cannot hold these spaces (its buffers need a shape)
  and ``SubprocVecEnv`` batches observations with ``np.stack``, which raises for ragged values.
  So the reference is :class:`StackingDummyVecEnv`, DummyVecEnv's own loop (rewards, dones,
  infos, ``terminal_observation``, ``reset_infos``) keeping each env's observation and batching it
  as ``SubprocVecEnv`` does, with an object array where ``np.stack`` cannot stack; and, where
  ``SubprocVecEnv`` runs at all (``Text``, a ``Dict`` of an image and a ``Text``, the custom
  space), ``SubprocVecEnv`` itself.
"""

from __future__ import annotations

import collections
import threading
import time
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

import spaceenvs
from helpers import close_all
from shmvec import BrokenVecEnvError, ShmEnvPool, ShmVecEnv, ShmVecEnvPool, ShmVectorEnv, SpaceError
from shmvec._layout import space_leaves

N_STEPS = 70
N_ENVS, N_WORKERS = 5, 2  # uneven slices


# ---- comparison ------------------------------------------------------------------------------------
def identical(a: Any, b: Any, path: str = "value") -> None:
    """``a`` equals ``b`` and has its types, all the way down (object arrays element by element)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__} ({a!r} vs {b!r})"
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            identical(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):  # GraphInstance too (a namedtuple)
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            identical(x, y, f"{path}[{k}]")
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype == object:
            for k, (x, y) in enumerate(zip(a.ravel(), b.ravel())):
                identical(x, y, f"{path}.flat[{k}]")
        else:
            assert np.array_equal(a, b), f"{path}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


# ---- SB3's reference --------------------------------------------------------------------------------
def subproc_batch(space: gym.spaces.Space, values: list) -> Any:
    """SubprocVecEnv's batch (``np.stack`` per leaf, a ``Dict`` as an OrderedDict as DummyVecEnv
    returns it), with an object array of the values where ``np.stack`` raises."""
    if isinstance(space, gym.spaces.Dict):
        return collections.OrderedDict((k, subproc_batch(s, [v[k] for v in values])) for k, s in space.spaces.items())
    if isinstance(space, gym.spaces.Tuple):
        return tuple(subproc_batch(s, [v[k] for v in values]) for k, s in enumerate(space.spaces))
    try:
        return np.stack(values)
    except ValueError:
        out = np.empty(len(values), dtype=object)
        for k, value in enumerate(values):
            out[k] = value
        return out


class StackingDummyVecEnv(DummyVecEnv):
    """DummyVecEnv whose observations are kept per env and batched as SubprocVecEnv batches them."""

    def __init__(self, env_fns: list) -> None:
        self.envs = [fn() for fn in env_fns]
        env = self.envs[0]
        VecEnv.__init__(self, len(env_fns), env.observation_space, env.action_space)
        self.buf_obs = [None] * self.num_envs
        self.buf_dones = np.zeros((self.num_envs,), dtype=bool)
        self.buf_rews = np.zeros((self.num_envs,), dtype=np.float32)
        self.buf_infos = [{} for _ in range(self.num_envs)]
        self.metadata = env.metadata

    def _save_obs(self, env_idx: int, obs: Any) -> None:
        self.buf_obs[env_idx] = obs

    def _obs_from_buf(self) -> Any:
        return subproc_batch(self.observation_space, deepcopy(self.buf_obs))


def sb3_actions(kind: str, n: int, n_steps: int, seed: int) -> list[tuple[Any, Any]]:
    """Per step: (the batch ShmVecEnv takes, the per-env list DummyVecEnv indexes)."""
    space = spaceenvs.make_act_space(kind)
    space.seed(seed)
    out = []
    for _ in range(n_steps):
        per_env = [space.sample() for _ in range(n)]
        if kind == "dict_text":
            batch = {"move": np.stack([a["move"] for a in per_env]), "say": [a["say"] for a in per_env]}
        elif kind == "text":
            batch = per_env  # a list of str, one per env
        else:
            batch = np.asarray(per_env)
        out.append((batch, per_env))
    return out


def run_sb3(ref: VecEnv, env: VecEnv, act_kind: str, n_steps: int = N_STEPS, seed: int = 3,
            subproc: bool = False) -> int:
    """Steps both on the same seeds and actions; returns how many episodes ended.

    ``subproc``: ``ref`` is SubprocVecEnv, whose containers are its own: rewards stacked to
    float64 (DummyVecEnv, and ShmVecEnv, hand float32), infos and ``reset_infos`` as tuples
    (lists), a ``Dict`` batch as a dict (an OrderedDict): those are compared as DummyVecEnv's.
    """
    def like_dummy(value: Any, what: str) -> Any:
        if not subproc:
            return value
        if what == "rewards":
            return value.astype(np.float32)
        if what == "obs" and type(value) is dict:
            return collections.OrderedDict(value)
        return list(value) if what in ("infos", "reset_infos") else value

    for venv in (ref, env):
        venv.seed(seed)
    identical(env.reset(), like_dummy(ref.reset(), "obs"), "reset obs")
    identical(env.reset_infos, like_dummy(ref.reset_infos, "reset_infos"), "reset_infos")
    ended = 0
    for t, (batch, per_env) in enumerate(sb3_actions(act_kind, env.num_envs, n_steps, seed)):
        out_r = ref.step(per_env)
        out_s = env.step(batch)
        for what, a, b in zip(("obs", "rewards", "dones", "infos"), out_s, out_r):
            identical(a, like_dummy(b, what), f"step {t} {what}")
        identical(env.reset_infos, like_dummy(ref.reset_infos, "reset_infos"), f"step {t} reset_infos")
        ended += int(out_r[2].sum())
    return ended


SB3_CASES = [
    pytest.param("fork", obs, "discrete", id=f"fork-{obs}") for obs in spaceenvs.OBS_KINDS
] + [
    pytest.param("fork", "image_text", "text", id="fork-image_text-text_action"),
    pytest.param("fork", "sequence", "dict_text", id="fork-sequence-dict_text_action"),
    pytest.param("spawn", "image_text", "text", id="spawn-image_text-text_action"),
    pytest.param("spawn", "graph", "dict_text", id="spawn-graph-dict_text_action"),
]


@pytest.mark.parametrize("method, obs_kind, act_kind", SB3_CASES)
def test_shm_vec_env_matches_sb3(method, obs_kind, act_kind):
    fns = spaceenvs.space_env_fns(obs_kind, act_kind, N_ENVS)
    ref = StackingDummyVecEnv(fns)
    env = ShmVecEnv(fns, n_workers=N_WORKERS, start_method=method)
    try:
        assert env.observation_space == ref.observation_space and env.action_space == ref.action_space
        assert run_sb3(ref, env, act_kind) >= 10
    finally:
        close_all(env, ref)


@pytest.mark.parametrize("obs_kind, act_kind", [("text", "text"), ("image_text", "discrete"), ("custom", "text")])
def test_shm_vec_env_matches_subproc_vec_env_where_it_runs(obs_kind, act_kind):
    fns = spaceenvs.space_env_fns(obs_kind, act_kind, N_ENVS)
    ref = SubprocVecEnv(fns, start_method="fork")
    env = ShmVecEnv(fns, n_workers=N_WORKERS, start_method="fork")
    try:
        assert run_sb3(ref, env, act_kind, n_steps=40, subproc=True) >= 5
    finally:
        close_all(env, ref)


# ---- Gymnasium's reference --------------------------------------------------------------------------
def run_gym(ref: SyncVectorEnv, env: ShmVectorEnv, mode: AutoresetMode, n_steps: int = N_STEPS,
            seed: int = 11) -> int:
    """Steps both on the same seeds and actions (DISABLED: ended envs reset with a mask)."""
    obs_r, infos_r = ref.reset(seed=seed)
    obs_s, infos_s = env.reset(seed=seed)
    identical(obs_s, obs_r, "reset obs")
    identical(infos_s, infos_r, "reset infos")
    ref.action_space.seed(seed)
    ended = 0
    for t in range(n_steps):
        actions = ref.action_space.sample()
        out_r = ref.step(actions)
        out_s = env.step(actions)
        for name, a, b in zip(("obs", "rewards", "terminated", "truncated", "infos"), out_s, out_r):
            identical(a, b, f"step {t} {name}")
        done = out_r[2] | out_r[3]
        ended += int(done.sum())
        if mode == AutoresetMode.DISABLED and done.any():
            obs_r, infos_r = ref.reset(options={"reset_mask": done.copy()})
            obs_s, infos_s = env.reset(options={"reset_mask": done.copy()})
            identical(obs_s, obs_r, f"step {t} masked reset obs")
            identical(infos_s, infos_r, f"step {t} masked reset infos")
    return ended


GYM_CASES = [
    pytest.param("fork", mode, obs, "discrete", id=f"fork-{mode.value}-{obs}")
    for mode in AutoresetMode for obs in spaceenvs.OBS_KINDS
] + [
    pytest.param("fork", mode, obs, act, id=f"fork-{mode.value}-{obs}-{act}_action")
    for mode in AutoresetMode for obs, act in (("image_text", "text"), ("oneof", "dict_text"))
] + [
    pytest.param("spawn", AutoresetMode.SAME_STEP, "image_text", "dict_text", id="spawn-SameStep-image_text-dict_text"),
    pytest.param("spawn", AutoresetMode.NEXT_STEP, "custom", "text", id="spawn-NextStep-custom-text"),
]


@pytest.mark.parametrize("method, mode, obs_kind, act_kind", GYM_CASES)
def test_shm_vector_env_matches_sync_vector_env(method, mode, obs_kind, act_kind):
    fns = spaceenvs.space_env_fns(obs_kind, act_kind, N_ENVS)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    env = ShmVectorEnv(fns, autoreset_mode=mode, n_workers=N_WORKERS, start_method=method)
    try:
        assert env.single_observation_space == ref.single_observation_space
        assert env.single_action_space == ref.single_action_space
        assert run_gym(ref, env, mode) >= 10
    finally:
        close_all(env, ref)


# ---- where the values travel ------------------------------------------------------------------------
def test_a_dict_keeps_its_image_in_shared_memory_and_pickles_only_the_text():
    env = ShmVectorEnv(spaceenvs.space_env_fns("image_text", "dict_text", 3), n_workers=2, start_method="fork")
    try:
        layout = env._engine.layout
        assert [leaf.path for leaf in layout.obs_leaves] == [("image",)]
        assert layout.obs_pickled == [("caption",)]
        assert [leaf.path for leaf in layout.act_leaves] == [("move",)] and layout.act_pickled == [("say",)]
        obs, _ = env.reset(seed=0)
        # The image batch is the shared buffer's copy; the caption a tuple of the envs' str.
        assert obs["image"].shape == (3, 6, 6, 3) and type(obs["caption"]) is tuple
        assert all(type(c) is str for c in obs["caption"])
    finally:
        env.close()


@pytest.mark.parametrize("face", ["sb3", "gym"])
def test_values_larger_than_the_mailbox_go_through_the_pipe(face):
    """Observations and actions of several kilobytes with a 512-byte mailbox: both directions use
    the pipe, and the results still equal the reference's."""
    fns = [spaceenvs.make_big_text_env] * 4
    if face == "sb3":
        ref, env = StackingDummyVecEnv(fns), ShmVecEnv(fns, n_workers=2, start_method="fork", mailbox_bytes=512)
        try:
            big = [["ab" * 2000 + str(i)] * 4 for i in range(30)]  # the actions' pickles exceed the mailbox
            for venv in (ref, env):
                venv.seed(5)
            identical(env.reset(), ref.reset(), "reset obs")
            for t, actions in enumerate(big):
                identical(env.step(actions), ref.step(actions), f"step {t}")
        finally:
            close_all(env, ref)
    else:
        mode = AutoresetMode.SAME_STEP
        ref = SyncVectorEnv(fns, autoreset_mode=mode)
        env = ShmVectorEnv(fns, autoreset_mode=mode, n_workers=2, start_method="fork", mailbox_bytes=512)
        try:
            identical(env.reset(seed=5), ref.reset(seed=5), "reset")
            for t in range(30):
                actions = tuple("ab" * 2000 + str(t + i) for i in range(4))
                identical(env.step(actions), ref.step(actions), f"step {t}")
        finally:
            close_all(env, ref)


def test_a_step_interrupted_before_its_piped_actions_are_sent_breaks_the_env_and_closes_at_once():
    """Ctrl-C between the post and the pipe: a worker waits for the rest of its actions, so the step
    cannot be collected (the env is broken); close() reaches the waiting worker (it gives up)."""
    env = ShmVectorEnv([spaceenvs.make_big_text_env] * 2, n_workers=2, start_method="fork", mailbox_bytes=512)
    try:
        env.reset(seed=0)
        channel = env._engine.channel

        def interrupted(*args: Any, **kwargs: Any) -> None:
            raise KeyboardInterrupt

        channel.send_args = interrupted
        with pytest.raises(KeyboardInterrupt):
            env.step(("ab" * 2000, "c"))
        with pytest.raises(BrokenVecEnvError):
            env.step(("a", "b"))
        del channel.send_args
    finally:
        started = time.monotonic()
        env.close()
    assert time.monotonic() - started < 3.0  # not the 5 s a worker that does not answer CLOSE takes


def test_copy_false_and_a_later_step_leave_earlier_batches_alone():
    fns = spaceenvs.space_env_fns("sequence", "text", 4)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    env = ShmVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, n_workers=2, start_method="fork", copy=False)
    sb3_ref, sb3 = StackingDummyVecEnv(fns), ShmVecEnv(fns, n_workers=2, start_method="fork", copy=False)
    try:
        kept = []
        identical(env.reset(seed=1), ref.reset(seed=1), "reset")
        for t in range(20):
            actions = tuple("ab"[:t % 3] for _ in range(4))
            out = env.step(actions)
            identical(out, ref.step(actions), f"step {t}")
            kept.append((out[0], deepcopy(out[0])))
        for before, copied in kept:
            identical(before, copied, "an earlier batch")
        assert run_sb3(sb3_ref, sb3, "text", n_steps=20) >= 1
    finally:
        close_all(env, ref, sb3, sb3_ref)


# ---- what is refused, and how -----------------------------------------------------------------------
@pytest.mark.parametrize("face", ["sb3", "gym"])
def test_pickled_action_batches_that_do_not_fit_are_refused_and_leave_the_env_usable(face):
    fns = spaceenvs.space_env_fns("text", "text", 3)
    env = (ShmVecEnv(fns, n_workers=2, start_method="fork") if face == "sb3"
           else ShmVectorEnv(fns, n_workers=2, start_method="fork"))
    try:
        env.reset()
        with pytest.raises(ValueError, match="2 values; expected 3"):
            env.step(["a", "b"])
        with pytest.raises(ValueError, match="one per env"):
            env.step("abc")  # a str is not a batch (it would hand each env one character)
        with pytest.raises(TypeError, match="pickle") as info:
            env.step(["a", threading.Lock(), "b"])  # does not pickle: a note names the env
        assert any("env 1" in note for note in info.value.__notes__)
        out = env.step(("a", "bb", ""))
        assert len(out) in (4, 5)
    finally:
        env.close()


def test_the_pools_refuse_spaces_without_a_fixed_size_saying_what_to_use():
    fns = spaceenvs.space_env_fns("image_text", "discrete", 3)
    for cls in (ShmEnvPool, ShmVecEnvPool):
        with pytest.raises(SpaceError, match="ShmVectorEnv"):
            cls(fns, n_workers=2, start_method="fork")


def test_restarts_refuse_spaces_without_a_fixed_size():
    with pytest.raises(SpaceError, match="on_failure='restart'"):
        ShmVecEnv(spaceenvs.space_env_fns("text", "discrete", 2), n_workers=2, start_method="fork",
                  on_failure="restart")


@pytest.mark.parametrize("n_workers", [1, 2])
def test_a_space_subclass_without_eq_is_named_in_the_error(n_workers):
    with pytest.raises(SpaceError, match="without __eq__"):
        ShmVecEnv([spaceenvs.OpaqueEnv] * 2, n_workers=n_workers, start_method="fork")


def test_space_leaves_marks_spaces_without_a_fixed_size_and_refuses_what_is_no_space():
    space = spaceenvs.make_obs_space("tuple_text")
    leaves = space_leaves(space)
    assert [(leaf.path, leaf.pickled) for leaf in leaves] == [((0,), False), ((1,), True), ((2,), False)]
    for kind in spaceenvs.OBS_KINDS[:6]:
        assert [leaf.pickled for leaf in space_leaves(spaceenvs.make_obs_space(kind))] == [True]
    with pytest.raises(SpaceError, match="not a gymnasium.spaces.Space"):
        space_leaves(gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Text(3))) and object())


def test_an_observation_that_does_not_pickle_names_its_env():
    env = ShmVecEnv(spaceenvs.space_env_fns("custom", "discrete", 3), n_workers=1, start_method="fork")
    try:
        env.reset()
        env.env_method("set_poison", indices=[2])
        with pytest.raises(TypeError, match="pickle") as info:
            env.step(np.zeros(3, dtype=np.int64))
        assert any("env 2" in note for note in getattr(info.value, "__notes__", [])), info.value
    finally:
        env.close()
