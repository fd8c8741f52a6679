"""shmvec._rows: the hot path's C loops over numpy arrays (RowWriter, copy_actions, step_infos, publish_step).

Each must write exactly what the Python path it short-cuts writes, and hand everything it does
not take (another dtype, shape or type, a failed check) back to that path unchanged.  End to end,
``test_equivalence`` compares every step with DummyVecEnv; here each helper is checked alone,
against numpy, on the cases where the two paths part (with the Python layers over them:
``test_hot_path``).
"""

from __future__ import annotations

import numpy as np
import pytest

from shmvec._rows import ACTIONS_COPY, ACTIONS_NO_NAN, ACTIONS_RANGE, RowWriter, copy_actions, publish_step, step_infos
from shmvec._sync import Words


class _Recorder:
    """The slow path: records what it was handed and writes it as numpy would."""

    def __init__(self, dst: np.ndarray) -> None:
        self.dst, self.calls = dst, []

    def __call__(self, i: int, value) -> None:
        self.calls.append(i)
        self.dst[i] = value


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8, np.int64, np.bool_])
@pytest.mark.parametrize("row", [(), (3,), (2, 5), (4, 3, 2)])
def test_row_writer_fast_path_writes_the_row_and_nothing_else(dtype, row):
    rng = np.random.default_rng(0)
    dst = np.zeros((6, *row), dtype=dtype)
    slow = _Recorder(dst)
    w = RowWriter(dst, slow)
    value = np.asarray((rng.random(row) * 100).astype(dtype))  # 0-d: an array, not a scalar
    w(4, value)
    assert slow.calls == []  # took the fast path
    expected = np.zeros_like(dst)
    expected[4] = value
    np.testing.assert_array_equal(dst, expected)


@pytest.mark.parametrize("value", [
    np.arange(4, dtype=np.float64),                      # another dtype: numpy casts
    [1.0, 2.0, 3.0, 4.0],                                # a list
    np.arange(8, dtype=np.float32)[::2],                 # not contiguous
    np.arange(4, dtype=np.float32).reshape(1, 4),        # another shape
    np.arange(3, dtype=np.float32),                      # another length
    np.ma.masked_array(np.arange(4, dtype=np.float32)),  # a subclass
])
def test_row_writer_hands_anything_else_to_the_slow_path(value):
    dst = np.zeros((3, 4), dtype=np.float32)
    slow = _Recorder(dst)
    w = RowWriter(dst, slow)
    try:
        w(1, value)
    except ValueError:
        pass  # numpy refuses the shape: what the slow path would raise anyway
    assert slow.calls == [1]


def test_row_writer_index_out_of_range_goes_to_the_slow_path_which_raises():
    dst = np.zeros((3, 4), dtype=np.float32)
    w = RowWriter(dst, _Recorder(dst))
    with pytest.raises(IndexError):
        w(3, np.zeros(4, np.float32))
    with pytest.raises(IndexError):
        w(-4, np.zeros(4, np.float32))


def test_row_writer_takes_an_equivalent_byte_order():
    dst = np.zeros((2, 3), dtype=np.float32)
    slow = _Recorder(dst)
    w = RowWriter(dst, slow)
    native = np.dtype(np.float32).newbyteorder("=")
    w(0, np.array([1, 2, 3], dtype=native))
    swapped = np.array([4, 5, 6], dtype=np.dtype(np.float32).newbyteorder("S"))
    w(1, swapped)  # not equivalent: numpy converts it
    assert slow.calls == [1]
    np.testing.assert_array_equal(dst, [[1, 2, 3], [4, 5, 6]])


def test_row_writer_refuses_a_non_contiguous_destination():
    with pytest.raises(ValueError, match="C-contiguous"):
        RowWriter(np.zeros((4, 6), np.float32)[:, ::2], lambda i, v: None)
    with pytest.raises(ValueError):
        RowWriter(np.zeros((), np.float32), lambda i, v: None)


def test_row_writer_stores_env_at_through_a_words_of_the_sync_module():
    """``at``: a Words of shmvec._sync (cimported through _sync.pxd).  Each row written, by the
    fast path or the slow one, stores ``i + 1`` into word ``at_index``; nothing once released."""
    dst = np.zeros((3, 2), np.float32)
    buf = bytearray(16)
    words, spy = Words(buf, 0, 4), Words(buf, 0, 4)
    w = RowWriter(dst, _Recorder(dst), words, 2)
    w(1, np.ones(2, np.float32))  # fast path
    assert [spy.load(k) for k in range(4)] == [0, 0, 2, 0]
    w(2, [3.0, 4.0])  # slow path
    assert spy.load(2) == 3
    words.release()
    w(0, np.ones(2, np.float32))
    assert spy.load(2) == 3
    np.testing.assert_array_equal(dst, [[1, 1], [1, 1], [3, 4]])
    with pytest.raises(IndexError):
        RowWriter(dst, _Recorder(dst), spy, 4)
    with pytest.raises(TypeError):
        RowWriter(dst, _Recorder(dst), object(), 0)
    spy.release()


# ---- copy_actions -----------------------------------------------------------------------------------

@pytest.mark.parametrize("start,size", [(0, 2), (-3, 7), (5, 1)])
def test_copy_actions_range_accepts_exactly_start_to_start_plus_size(start, size):
    dst = np.full(6, 99, np.int64)
    ok = np.arange(6, dtype=np.int64) % size + start
    assert copy_actions(ok, dst, ACTIONS_RANGE, start, size)
    np.testing.assert_array_equal(dst, ok)
    for bad_value in (start - 1, start + size, np.iinfo(np.int64).min, np.iinfo(np.int64).max):
        bad = ok.copy()
        bad[3] = bad_value
        before = dst.copy()
        assert not copy_actions(bad, dst, ACTIONS_RANGE, start, size)
        np.testing.assert_array_equal(dst, before)  # nothing written


def test_copy_actions_range_multidimensional():
    dst = np.zeros((4, 3), np.int64)
    ok = np.random.default_rng(0).integers(0, 5, (4, 3))
    assert copy_actions(ok, dst, ACTIONS_RANGE, 0, 5)
    np.testing.assert_array_equal(dst, ok)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_copy_actions_nan_check(dtype):
    dst = np.zeros((3, 2), dtype)
    ok = np.array([[np.inf, -1e30], [0, 1], [-np.inf, 2]], dtype)  # inf passes, as in the Python check
    assert copy_actions(ok, dst, ACTIONS_NO_NAN)
    np.testing.assert_array_equal(dst, ok)
    bad = ok.copy()
    bad[1, 0] = np.nan
    assert not copy_actions(bad, dst, ACTIONS_NO_NAN)
    np.testing.assert_array_equal(dst, ok)


@pytest.mark.parametrize("value", [
    np.zeros(4, np.int32),            # another dtype
    np.zeros(5, np.int64),            # another length
    np.zeros((4, 1), np.int64),       # another shape
    np.zeros(8, np.int64)[::2],       # not contiguous
    [0, 1, 0, 1],                     # not an array
    np.zeros(4, np.int64).view(np.ma.MaskedArray),
])
def test_copy_actions_declines_what_needs_conversion(value):
    dst = np.full(4, 7, np.int64)
    assert not copy_actions(value, dst, ACTIONS_RANGE, 0, 2)
    assert not copy_actions(value, dst, ACTIONS_COPY)
    assert dst.tolist() == [7, 7, 7, 7]


def test_copy_actions_unknown_check_raises():
    with pytest.raises(ValueError, match="unknown action check"):
        copy_actions(np.zeros(2, np.int64), np.zeros(2, np.int64), 9)


# ---- step_infos ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 8, 64, 1000])
def test_step_infos_matches_numpy(n):
    rng = np.random.default_rng(n)
    terminated, truncated = rng.random(n) < 0.2, rng.random(n) < 0.2
    dones = np.empty(n, bool)
    infos, done = step_infos(terminated, truncated, dones)
    np.testing.assert_array_equal(dones, terminated | truncated)
    assert done == np.flatnonzero(terminated | truncated).tolist()
    assert infos == [{"TimeLimit.truncated": bool(t)} for t in truncated & ~terminated]
    assert all(type(info["TimeLimit.truncated"]) is bool for info in infos)
    assert len({id(info) for info in infos}) == n  # one dict per env


def test_step_infos_rejects_other_arrays():
    b = np.zeros(3, bool)
    for bad in (np.zeros(3, np.uint8), np.zeros(4, bool), np.zeros((3, 1), bool), np.zeros(6, bool)[::2]):
        with pytest.raises(ValueError, match="bool arrays"):
            step_infos(bad, b, b)
        with pytest.raises(ValueError):
            step_infos(b, b, bad)


# ---- publish_step ----------------------------------------------------------------------------------

def _flag_buffers(n: int = 10, dtype=np.float32):
    return np.full(n, -1.0, dtype), np.zeros(n, bool), np.ones(n, bool)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_publish_step_writes_floats_and_bools_as_numpy_would(dtype):
    rew, te, tr = _flag_buffers(dtype=dtype)
    # np.float64 is a float; +-1e300: +-inf in float32; ints within int64 (2**53 + 1 rounds)
    rews = [1.0, 0.1, np.float64(-2.5), 1e300, -1e300, 3, -(2**53 + 1)]
    terms = [True, False, False, True, False, False, True]
    truncs = [False, False, True, True, False, True, False]
    assert publish_step(rew, te, tr, 2, rews, terms, truncs)
    exp_rew, exp_te, exp_tr = _flag_buffers(dtype=dtype)
    with np.errstate(over="ignore"):
        exp_rew[2:9] = rews
    exp_te[2:9], exp_tr[2:9] = terms, truncs
    np.testing.assert_array_equal(rew, exp_rew)
    np.testing.assert_array_equal(te, exp_te)
    np.testing.assert_array_equal(tr, exp_tr)


@pytest.mark.parametrize("rews,terms,truncs", [
    ([np.float32(1.0)], [False], [False]),  # not a Python float: numpy converts it
    ([True], [False], [False]),             # a bool is an int, but not exactly
    ([2**63], [False], [False]),            # an int past int64
    ([1.0], [np.bool_(True)], [False]),     # numpy's bool
    ([1.0], [False], [0]),
    ([1.0, 2.0], [False], [False]),         # lengths differ
])
def test_publish_step_declines_other_types(rews, terms, truncs):
    rew, te, tr = _flag_buffers()
    assert not publish_step(rew, te, tr, 0, rews, terms, truncs)


def test_publish_step_declines_out_of_range_and_other_buffers():
    rew, te, tr = _flag_buffers(4)
    assert not publish_step(rew, te, tr, 3, [1.0, 1.0], [False] * 2, [False] * 2)
    assert not publish_step(rew, te, tr, -1, [1.0], [False], [False])
    assert not publish_step(rew.astype(np.float16), te, tr, 0, [1.0], [False], [False])
    assert not publish_step(rew, te.view(np.uint8), tr, 0, [1.0], [False], [False])
    assert (rew == -1).all()
