"""shmvec._codec: the info codec (encode_infos, decode_infos, load_result), a worker's infos without pickle.

Every value it carries comes back as the same type and value; anything else it declines (the
worker then pickles), and a malformed message raises instead of reading past the end.
"""

from __future__ import annotations

import numpy as np
import pytest

from shmvec._codec import decode_infos, encode_infos, load_result


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
