"""The rules every face applies to its arguments, each written once: ``env_fns``, the exact cast of
actions, one value per env, SB3's ``indices``, rows of a nested batch.

Each face calls the one function (``shmvec.factories.factory_list``, ``shmvec._actions.exact_cast``,
``shmvec._seeds.per_env_values`` and ``env_indices``, ``shmvec._frontend.batch_rows``), so a face
cannot drift from another: here the rules themselves, and the faces that need no worker to show
they take the same ``env_fns`` message.
"""

from __future__ import annotations

import numpy as np
import pytest

import testenvs
from shmvec import ShmEnvPool, ShmParallelEnv, ShmVectorEnv
from shmvec._actions import exact_cast
from shmvec._frontend import batch_rows
from shmvec._seeds import env_indices, per_env_values
from shmvec.factories import factory_list

FACES = ["ShmVecEnv", "ShmVectorEnv", "ShmEnvPool", "ShmVecEnvPool", "RayShmVecEnv", "RayShmEnvPool"]


# ---- env_fns ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("face", [ShmVectorEnv, ShmEnvPool])
def test_a_pettingzoo_env_gets_the_same_hint_from_every_single_agent_face(face):
    """The hint names the multi-agent faces (the two checkers this replaced disagreed on it)."""
    with pytest.raises(TypeError) as info:
        face(testenvs.FakeParallelEnv())
    text = str(info.value)
    assert text == str(_refused(testenvs.FakeParallelEnv(), face.__name__))
    for phrase in ("PettingZoo env", "PettingZoo multi-agent env (FakeParallelEnv)", f"{face.__name__} runs "
                   "single-agent Gymnasium envs", "shmvec.ShmMultiAgentVecEnv(env_fns)", "shmvec.ShmParallelEnv"):
        assert phrase in text, text


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("env_fns, second", [(6, None), (6, testenvs.make_cartpole), ("CartPole-v1", None),
                                             (testenvs.make_cartpole, None), (object(), None), ([], None)])
def test_every_face_reads_env_fns_with_the_same_rule(face, env_fns, second):
    """The message differs by the face's name alone (an SB3 face's names SB3's make_vec_env, the
    others' shmvec.make_vec)."""
    mine = str(_refused(env_fns, face, second))
    like = "ShmVecEnv" if "VecEnv" in face else "ShmVectorEnv"
    theirs = str(_refused(env_fns, like, second))
    assert mine.replace(face, "X") == theirs.replace(like, "X"), (mine, theirs)


def test_the_torchrl_order_names_the_users_factory_and_the_usual_form():
    text = str(_refused(4, "ShmVecEnv", testenvs.make_cartpole))
    assert "not (num_envs, factory) as TorchRL's ParallelEnv(n, make_env); ShmVecEnv takes the factories first" in text
    assert "ShmVecEnv([make_cartpole] * 4)" in text and "ShmVecEnv([make_env] * 4)" in text, text


def test_the_multi_agent_faces_call_a_pettingzoo_env_an_instance_not_a_mistake():
    with pytest.raises(TypeError) as info:
        ShmParallelEnv(testenvs.FakeParallelEnv())
    text = str(info.value)
    assert "PettingZoo env instance (FakeParallelEnv), not a factory" in text, text
    assert "single-agent" not in text and "SuperSuit" not in text, text
    with pytest.raises(TypeError, match=r"ShmParallelEnv\(\[make_parallel_env\] \* 3\)"):
        ShmParallelEnv(3)


def test_a_list_of_factories_comes_back_as_a_list():
    fns = (testenvs.make_cartpole, testenvs.make_cartpole)
    assert factory_list(fns, "ShmVectorEnv") == list(fns)


def _refused(env_fns, face, second=None):
    with pytest.raises((TypeError, ValueError)) as info:
        factory_list(env_fns, face, second)
    return info.value


# ---- actions ------------------------------------------------------------------------------------------
def test_exact_cast_takes_exact_values_and_refuses_the_rest():
    whole = np.array([0.0, 2.0, 3.0])
    out = exact_cast(whole, np.dtype(np.int64), ("a",))
    assert out.dtype == np.int64 and out.tolist() == [0, 2, 3]
    same = np.ones(3, dtype=np.float32)
    assert exact_cast(same, np.dtype(np.float64)) is same  # numpy casts it without loss when it is written
    with pytest.raises(ValueError, match=r"actions\['a'\]\[0\] have dtype float64, which does not cast safely to "
                                         r"int64.*got \[0.5, 1.0\]"):
        exact_cast(np.array([0.5, 1.0]), np.dtype(np.int64), ("a", 0))
    with pytest.raises(ValueError, match="does not cast safely to uint8"):
        exact_cast(np.array([256]), np.dtype(np.uint8))


# ---- one value per env, SB3's indices -----------------------------------------------------------------
def test_one_value_per_env_or_one_for_all():
    assert per_env_values(7, 3) == [7, 7, 7]
    assert per_env_values({"a": 1}, 2) == [{"a": 1}, {"a": 1}]
    assert per_env_values((1, 2), 2) == [1, 2]
    with pytest.raises(ValueError) as info:
        per_env_values([1, 2], 3, "options")
    text = str(info.value)
    for phrase in ("Options must be", "length equal", "one entry per env", "Got `2` options for 3 environments",
                   "one per env"):
        assert phrase in text, text


def test_sb3_indices():
    assert env_indices(None, 3) == [0, 1, 2]
    assert env_indices(2, 3) == [2]
    assert env_indices(range(1, 3), 3) == [1, 2]
    assert env_indices(np.array([2, 0]), 3) == [2, 0]


# ---- rows of a nested batch ---------------------------------------------------------------------------
def test_batch_rows_keeps_the_nesting():
    batch = {"a": np.arange(4), "b": (np.arange(8).reshape(4, 2), {"c": np.arange(4) * 10})}
    row = batch_rows(batch, 2)
    assert row["a"] == 2 and row["b"][0].tolist() == [4, 5] and row["b"][1]["c"] == 20
    picked = batch_rows(batch, np.array([3, 1]))
    assert picked["a"].tolist() == [3, 1] and picked["b"][1]["c"].tolist() == [30, 10]
    head = batch_rows(batch, slice(None, 2))
    assert np.shares_memory(head["a"], batch["a"])  # a slice is a view, as numpy gives it
    copied = batch_rows(batch, 1, copy=True)
    assert not np.shares_memory(copied["b"][0], batch["b"][0])
    assert batch_rows({"infos": [{"x": 1}, {}, {"y": 2}]}, slice(1, None)) == {"infos": [{}, {"y": 2}]}
