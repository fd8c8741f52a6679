"""The C fast paths of the hot loop (``shmvec._rows``: RowWriter, copy_actions, step_infos; ``shmvec._codec``).

Each must write exactly what the Python path it short-cuts writes, and hand everything it does
not take (another dtype, shape or type, a failed check) back to that path unchanged.  End to end,
``test_equivalence`` compares every step with DummyVecEnv; here each helper is checked alone,
against numpy, on the cases where the two paths part.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from shmvec import InvalidActionError, ObservationError, _codec, _rows
from shmvec._actions import make_action_checks, make_fast_copies
from shmvec._codec import decode_infos, encode_infos, load_result
from shmvec._layout import Layout, make_scatter
from shmvec._rows import ACTIONS_COPY, ACTIONS_NO_NAN, ACTIONS_RANGE, RowWriter, copy_actions, publish_step, step_infos


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


def test_publish_step_declines_out_of_range_and_other_buffers():
    rew, te, tr = _flag_buffers(4)
    assert not publish_step(rew, te, tr, 3, [1.0, 1.0], [False] * 2, [False] * 2)
    assert not publish_step(rew, te, tr, -1, [1.0], [False], [False])
    assert not publish_step(rew.astype(np.float16), te, tr, 0, [1.0], [False], [False])
    assert not publish_step(rew, te.view(np.uint8), tr, 0, [1.0], [False], [False])
    assert (rew == -1).all()


def test_helpers_are_exported_by_their_modules():
    assert {"RowWriter", "copy_actions", "step_infos", "publish_step"} <= set(dir(_rows))
    assert {"encode_infos", "decode_infos", "load_result"} <= set(dir(_codec))


# ---- the info codec -------------------------------------------------------------------------------

def _roundtrip(value, size: int = 1 << 16):
    buf = bytearray(size)
    n = encode_infos(value, buf)
    assert n > 0, n
    return decode_infos(memoryview(buf)[:n])


def _same(a, b) -> bool:
    """Equal values of exactly the same types, all the way down (NaN equal to NaN, -0.0 not to 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(x, y) for x, y in zip(a.keys(), b.keys())) and all(
            _same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() and b.flags.writeable
    if isinstance(a, (np.longdouble, np.clongdouble)):
        # x87 extended precision keeps 10 bytes of value in 16; numpy >= 2.5 (the only numpy on
        # Python >= 3.12 today) leaves the 6 padding bytes of a scalar uninitialised: compare the value
        # (NaN equal to NaN, -0.0 not to 0.0), not the bytes.
        return bool(a == b or (np.isnan(a) and np.isnan(b))) and bool(np.signbit(np.real(a)) == np.signbit(np.real(b)))
    if isinstance(a, (float, np.floating, np.complexfloating)):
        return np.asarray(a).tobytes() == np.asarray(b).tobytes()
    return a == b


CODEC_VALUES = [
    None, True, False, 0, 1, -1, 2**63 - 1, -(2**63), 0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"),
    "", "episode", "h\u00e9llo \u2603 \U0001F600", "k" * 100, [], (), {}, [1, True, 1.0], (None, (), [()]),
    {"a": 1, 2: "b", (3, 4): [5.0], None: {}, 1.5: True},
    np.float64(1.25), np.float32(-2.5), np.float16(0.5), np.int64(-7), np.int32(7), np.int8(-1), np.uint8(200),
    np.uint64(2**64 - 1), np.bool_(True), np.complex128(1 + 2j), np.complex64(-1j), np.longdouble(1.5),
    np.arange(6, dtype=np.int32).reshape(2, 3), np.zeros((0, 3)), np.array(3.0), np.ones((2, 2), dtype=bool),
    np.zeros((2, 0)), {"last": np.zeros((3, 0, 2), dtype=np.int16)},  # a zero after other dims (was "malformed")
    np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1), np.array([1 + 1j], dtype=np.complex64),
    [(5, {"episode": {"r": 20.0, "l": 20, "t": 0.512345}}, {}), (17, {"TimeLimit.truncated": True}, None)],
]


@pytest.mark.parametrize("value", CODEC_VALUES, ids=lambda v: type(v).__name__)
def test_info_codec_returns_the_same_types_and_values(value):
    assert _same(value, _roundtrip(value))


def test_info_codec_keeps_bool_and_int_apart_and_dict_order():
    out = _roundtrip({"z": True, "a": 1, "m": np.bool_(False), "b": 0})
    assert list(out) == ["z", "a", "m", "b"]
    assert out["z"] is True and type(out["a"]) is int and type(out["m"]) is np.bool_


def test_info_codec_string_cache_never_mixes_strings_up():
    # More distinct keys than the cache has slots, twice: every one comes back as itself.
    keys = [f"key_{i}" for i in range(2000)] + ["\u00e9" * 3, "\u00e9" * 2 + "e"]
    for _ in range(2):
        out = _roundtrip({k: i for i, k in enumerate(keys)}, 1 << 20)
        assert list(out) == keys and list(out.values()) == list(range(len(keys)))


class _MyDict(dict):
    pass


@pytest.mark.parametrize("value", [
    2**63, -(2**63) - 1, "\ud800", object(), _MyDict(a=1), np.arange(4)[::2], np.arange(4).astype(">i4"),
    np.array(["a"]), np.array([object()]), np.datetime64(1, "s"), {"deep": np.datetime64(1, "s")},
    [1.0, [2.0, {"x": type}]], np.asfortranarray(np.ones((2, 3))), np.ones(3).view(np.recarray),
], ids=lambda v: type(v).__name__)
def test_info_codec_declines_what_it_does_not_carry(value):
    assert encode_infos(value, bytearray(4096)) == -1


def test_info_codec_declines_too_deep_nesting_and_reports_a_full_buffer():
    deep: list = []
    for _ in range(40):
        deep = [deep]
    assert encode_infos(deep, bytearray(4096)) == -1
    assert encode_infos([1.0] * 100, bytearray(50)) == -2
    assert encode_infos(None, bytearray(0)) == -2
    assert encode_infos("x" * 10, bytearray(12)) == -2


@pytest.mark.parametrize("data", [b"", b"\x01", b"\x01\x63", b"\x01\x05\x00", b"\x01\x06\xff\xff\xff\xff",
                                  b"\x01\x08\xff\xff\xff\xff", b"\x01\x0b\x0c\x01" + b"\xff" * 8,
                                  b"\x01\x01\x01", b"\x80\x05",
                                  b"\x01\x0b\x0c\x02" + (2**40).to_bytes(8, "little") * 2])  # no data for 2**80
def test_info_codec_rejects_malformed_messages(data):
    with pytest.raises(ValueError):
        decode_infos(data)


def test_load_result_reads_the_codec_and_pickles():
    import pickle

    items = [(3, {"episode": {"r": 1.0, "l": 1, "t": 0.0}}, {})]
    buf = bytearray(256)
    n = encode_infos(items, buf)
    assert load_result(memoryview(buf)[:n]) == items
    odd = [(1, _MyDict(a=np.datetime64(1, "s")), None)]
    back = load_result(pickle.dumps(odd, protocol=5))
    assert back == odd and type(back[0][1]) is _MyDict
