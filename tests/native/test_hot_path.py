"""The C fast paths of the hot loop where they meet the Python layers over them.

The helpers alone are tested in ``test_rows`` (shmvec._rows) and ``test_codec`` (shmvec._codec).
Here: the scatter of ``shmvec._layout`` keeps its errors behind RowWriter's fast path, what
copy_actions accepts the action checks of ``shmvec._actions`` accept too, the casts of
``exact_integers``, and publish_step on the layout's own buffers.  End to end,
``test_equivalence`` compares every step with DummyVecEnv.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from shmvec import InvalidActionError, ObservationError, _codec, _rows
from shmvec._actions import make_action_checks, make_fast_copies
from shmvec._layout import Layout, make_scatter
from shmvec._rows import copy_actions, publish_step


# ---- make_scatter over RowWriter (shmvec._layout) ------------------------------------------------

def test_scatter_keeps_its_errors_behind_the_fast_path():
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32), "n": spaces.Discrete(4)})
    leaves = {("pos",): np.zeros((2, 3), np.float32), ("n",): np.zeros(2, np.int64)}
    scatter = make_scatter(space, leaves, "observation")
    scatter(1, {"pos": np.ones(3, np.float32), "n": np.int64(3)})
    np.testing.assert_array_equal(leaves[("pos",)], [[0, 0, 0], [1, 1, 1]])
    assert leaves[("n",)].tolist() == [0, 3]
    with pytest.raises(ObservationError, match=r"observation\['pos'\] has shape \(4,\)"):
        scatter(0, {"pos": np.ones(4, np.float32), "n": 0})
    with pytest.raises(ObservationError, match="does not cast"):
        scatter(0, {"pos": np.ones(3, np.complex64), "n": 0})


# ---- copy_actions and the action checks (shmvec._actions) ----------------------------------------

@pytest.mark.parametrize("space", [
    spaces.Discrete(3, start=-1), spaces.MultiDiscrete([4, 4]), spaces.MultiDiscrete([2, 5]),
    spaces.MultiBinary(3), spaces.Box(-1, 1, (2,), np.float32), spaces.Box(0, 9, (2,), np.int64),
])
@pytest.mark.parametrize("policy", ["raise", "ignore"])
def test_fast_copy_agrees_with_the_python_check(space, policy):
    """Whatever copy_actions accepts, the Python check accepts; whatever it declines either
    fails that check or is left to the Python path (never accepted wrongly)."""
    checks = make_action_checks(space, [()], policy)
    fast = make_fast_copies(space, [()], policy).get(())
    rng = np.random.default_rng(1)
    n = 5
    shape = (n, *space.shape)
    for _ in range(200):
        if isinstance(space, spaces.Box):
            batch = rng.normal(0, 3, shape).astype(space.dtype)
            if space.dtype.kind == "f" and rng.random() < 0.3:
                batch.flat[rng.integers(batch.size)] = np.nan
        else:
            batch = rng.integers(-3, 7, shape).astype(np.int64)
        dst = np.zeros(shape, space.dtype)
        taken = fast is not None and copy_actions(batch, dst, *fast)
        check = checks.get(())
        try:
            if check is not None:
                check(batch)
            valid = True
        except InvalidActionError:
            valid = False
        if taken:
            assert valid or policy == "ignore"
            np.testing.assert_array_equal(dst, batch)


# ---- exact_integers (casts into integer action and observation buffers) --------------------------

@pytest.mark.parametrize("value, src, dst, ok", [
    (2**31, np.float32, np.int32, False),        # in float32, 2**31 compares equal to int32's max
    (2**31 - 128, np.float32, np.int32, True),
    (2**63, np.float64, np.int64, False),
    (2**32, np.float32, np.uint32, False),
    (-1.0, np.float64, np.uint8, False),
    (255.0, np.float64, np.uint8, True),
    (300, np.int64, np.int16, True),
    (40000, np.int64, np.int16, False),         # same kind for numpy, and it would wrap
    (300, np.int64, np.uint8, False),
    (True, np.bool_, np.uint8, True),
])
def test_exact_integers_takes_only_values_that_fit(value, src, dst, ok):
    from shmvec._actions import exact_integers

    out = exact_integers(np.array([value], dtype=src), np.dtype(dst))
    if ok:
        assert out is not None and out.dtype == dst and int(out[0]) == int(value)
    else:
        assert out is None


# ---- publish_step and the layout's buffers (shmvec._layout) ---------------------------------------

def test_publish_step_takes_the_layouts_reward_buffer():
    """The workers' own buffers: the fast path must not be dead for want of a dtype (it was,
    from the day the reward buffer became float64 until it took float64)."""
    layout = Layout(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), 6, 2, 64, 0)
    buf = bytearray(layout.nbytes)
    views = layout.views(memoryview(buf))
    assert publish_step(views.rew, views.terminated, views.truncated, 3, [0.5, 1, 2.0], [False, True, False],
                        [False, False, True])
    assert views.rew[3:].tolist() == [0.5, 1.0, 2.0]
    assert views.terminated[3:].tolist() == [False, True, False]
    del views


# ---- the modules the Python layers import them from ----------------------------------------------

def test_helpers_are_exported_by_their_modules():
    assert {"RowWriter", "copy_actions", "step_infos", "publish_step"} <= set(dir(_rows))
    assert {"encode_infos", "decode_infos", "load_result"} <= set(dir(_codec))
