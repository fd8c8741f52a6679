# cython: language_level=3, boundscheck=False, wraparound=False
"""Private Cython module: the info codec, a worker's infos to the parent without pickle.

:func:`encode_infos` (in a worker, into its mailbox), :func:`decode_infos` and
:func:`load_result` (in the parent: the codec's message, or a pickle when the worker fell back).
"""
import pickle as _pickle

import numpy as _np

cimport numpy as cnp
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_AsTuple, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcmp, memcpy

cdef extern from "numpy/arrayobject.h":
    object PyArray_Scalar(void *data, cnp.dtype descr, object base)
    enum: NPY_HALF

cnp.import_array()

# Each step a worker sends the parent its envs' non-empty infos: Monitor's ``episode`` dict when an
# episode ends (every step for some env at 64 CartPoles), and, for MuJoCo-style envs, a dict of
# reward terms on every step.  This codec writes the usual values (``None``, ``bool``, ``int``
# within int64, ``float``, ``str``, ``dict``, ``list``, ``tuple``, numpy scalars and C-contiguous
# ndarrays of the numeric dtypes, each of exactly that type) straight into the worker's mailbox,
# and reads them back as the same types and values, with less machinery than pickle (no pickler
# object, no memo, no intermediate bytes).  Anything else (a subclass, an arbitrary object, a huge
# int, a string that is not valid UTF-8, nesting deeper than 32) makes ``encode_infos`` return -1,
# and the caller pickles the whole message as before.
#
# Format: one byte INFO_CODEC_MAGIC (a pickle of protocol >= 2 starts with 0x80), then one value:
# a tag byte, then the tag's payload (native byte order: both ends run on this machine):
#   NONE FALSE TRUE  -
#   INT              int64
#   FLOAT            float64
#   STR              uint32 length, UTF-8 bytes
#   DICT             uint32 count, count x (key value, value)
#   LIST TUPLE       uint32 count, count x value
#   NPSCALAR         uint8 type number, the scalar's bytes (itemsize)
#   NDARRAY          uint8 type number, uint8 ndim, ndim x int64 dims, the data (C order)

INFO_CODEC_MAGIC = 0x01

cdef enum:
    _C_NONE = 1
    _C_FALSE = 2
    _C_TRUE = 3
    _C_INT = 4
    _C_FLOAT = 5
    _C_STR = 6
    _C_DICT = 7
    _C_LIST = 8
    _C_TUPLE = 9
    _C_NPSCALAR = 10
    _C_NDARRAY = 11
    _C_MAX_DEPTH = 32
    _C_UNSUPPORTED = -1
    _C_FULL = -2

cdef object _np_generic = _np.generic


cdef inline bint _plain_numeric(int type_num):
    """Bool, the integers, the floats and the complexes (no object, string, void or datetime)."""
    return type_num <= cnp.NPY_CLONGDOUBLE or type_num == NPY_HALF


cdef Py_ssize_t _put_len(unsigned char *buf, Py_ssize_t pos, Py_ssize_t cap, uint8_t tag, Py_ssize_t n):
    if n > 0xFFFFFFFF:
        return _C_UNSUPPORTED
    if pos + 5 > cap:
        return _C_FULL
    cdef uint32_t n32 = <uint32_t>n
    buf[pos] = tag
    memcpy(buf + pos + 1, &n32, 4)
    return pos + 5


cdef Py_ssize_t _enc(object x, unsigned char *buf, Py_ssize_t pos, Py_ssize_t cap, int depth) except -3:
    """Encodes ``x`` at ``buf[pos:]``; returns the new position, _C_UNSUPPORTED or _C_FULL."""
    cdef type t = type(x)
    cdef long long ival
    cdef int overflow, k, nd
    cdef double dval
    cdef const char *s
    cdef Py_ssize_t n
    cdef cnp.dtype descr
    cdef cnp.ndarray arr
    cdef Py_ssize_t it = 0
    cdef PyObject *kp
    cdef PyObject *vp
    if depth > _C_MAX_DEPTH:
        return _C_UNSUPPORTED
    if x is None or x is True or x is False:
        if pos + 1 > cap:
            return _C_FULL
        buf[pos] = _C_NONE if x is None else (_C_TRUE if x is True else _C_FALSE)
        return pos + 1
    if t is float:
        if pos + 9 > cap:
            return _C_FULL
        dval = PyFloat_AS_DOUBLE(x)
        buf[pos] = _C_FLOAT
        memcpy(buf + pos + 1, &dval, 8)
        return pos + 9
    if t is int:
        ival = PyLong_AsLongLongAndOverflow(x, &overflow)
        if overflow:
            return _C_UNSUPPORTED
        if pos + 9 > cap:
            return _C_FULL
        buf[pos] = _C_INT
        memcpy(buf + pos + 1, &ival, 8)
        return pos + 9
    if t is str:
        try:
            s = PyUnicode_AsUTF8AndSize(x, &n)
        except UnicodeError:  # lone surrogates: pickle keeps them
            return _C_UNSUPPORTED
        pos = _put_len(buf, pos, cap, _C_STR, n)
        if pos < 0:
            return pos
        if pos + n > cap:
            return _C_FULL
        memcpy(buf + pos, s, n)
        return pos + n
    if t is dict:
        pos = _put_len(buf, pos, cap, _C_DICT, PyDict_Size(x))
        while pos >= 0 and PyDict_Next(x, &it, &kp, &vp):
            pos = _enc(<object>kp, buf, pos, cap, depth + 1)
            if pos >= 0:
                pos = _enc(<object>vp, buf, pos, cap, depth + 1)
        return pos
    if t is list or t is tuple:
        pos = _put_len(buf, pos, cap, _C_LIST if t is list else _C_TUPLE, len(x))
        for value in x:
            if pos < 0:
                return pos
            pos = _enc(value, buf, pos, cap, depth + 1)
        return pos
    if t is cnp.ndarray:
        arr = <cnp.ndarray>x
        descr = <cnp.dtype>cnp.PyArray_DESCR(arr)
        nd = cnp.PyArray_NDIM(arr)
        if (not _plain_numeric(descr.type_num) or not cnp.PyArray_ISNOTSWAPPED(arr)
                or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or nd > 32):
            return _C_UNSUPPORTED
        n = cnp.PyArray_NBYTES(arr)
        if pos + 3 + 8 * nd + n > cap:
            return _C_FULL
        buf[pos] = _C_NDARRAY
        buf[pos + 1] = <uint8_t>descr.type_num
        buf[pos + 2] = <uint8_t>nd
        pos += 3
        for k in range(nd):
            ival = cnp.PyArray_DIMS(arr)[k]
            memcpy(buf + pos, &ival, 8)
            pos += 8
        if n:
            memcpy(buf + pos, cnp.PyArray_DATA(arr), n)
        return pos + n
    if isinstance(x, <type>_np_generic):
        descr = cnp.PyArray_DescrFromScalar(x)
        if not _plain_numeric(descr.type_num) or <void *>t != <void *>descr.typeobj:
            return _C_UNSUPPORTED
        n = descr.itemsize
        if pos + 2 + n > cap:
            return _C_FULL
        buf[pos] = _C_NPSCALAR
        buf[pos + 1] = <uint8_t>descr.type_num
        cnp.PyArray_ScalarAsCtype(x, buf + pos + 2)
        return pos + 2 + n
    return _C_UNSUPPORTED


def encode_infos(obj, buffer) -> int:
    """Writes ``obj`` into the writable ``buffer`` (a worker's mailbox) with the info codec.

    Returns the number of bytes written; -1 when ``obj`` holds a value the codec does not
    carry (the caller pickles instead); -2 when it does not fit in ``buffer``.
    """
    cdef unsigned char[::1] view = buffer
    cdef Py_ssize_t cap = view.shape[0]
    if cap < 1:
        return _C_FULL
    cdef unsigned char *buf = &view[0]
    buf[0] = INFO_CODEC_MAGIC
    return _enc(obj, buf, 1, cap, 0)


# The decoder's string cache: the same keys ("episode", "r", "reward_run", ...) arrive every step.
# A string of up to 64 bytes is looked up by its bytes (FNV-1a hash, one slot per hash value mod
# the size) and the cached object returned, its hash already computed for the dict it goes into.
# Strings are immutable, so sharing one object between infos is safe (pickle's memo shares them
# within a message too).
cdef enum:
    _STR_CACHE_SLOTS = 512
    _STR_CACHE_MAX_LEN = 64

cdef PyObject *_str_cache[_STR_CACHE_SLOTS]
cdef Py_ssize_t _str_cache_len[_STR_CACHE_SLOTS]
cdef char _str_cache_bytes[_STR_CACHE_SLOTS][_STR_CACHE_MAX_LEN]


cdef object _cached_str(const char *s, Py_ssize_t n):
    cdef uint32_t h = 2166136261u
    cdef Py_ssize_t k
    if n > _STR_CACHE_MAX_LEN:
        return PyUnicode_DecodeUTF8(<char *>s, n, NULL)
    for k in range(n):
        h = (h ^ <uint8_t>s[k]) * 16777619u
    k = h % _STR_CACHE_SLOTS
    if _str_cache[k] != NULL and _str_cache_len[k] == n and memcmp(_str_cache_bytes[k], s, n) == 0:
        return <object>_str_cache[k]
    value = PyUnicode_DecodeUTF8(<char *>s, n, NULL)
    hash(value)  # computed once, kept in the object
    Py_INCREF(value)
    Py_XDECREF(_str_cache[k])
    _str_cache[k] = <PyObject *>value
    _str_cache_len[k] = n
    memcpy(_str_cache_bytes[k], s, n)
    return value


cdef inline uint32_t _get_u32(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end) except? 0xFFFFFFFF:
    cdef uint32_t v
    if pos[0] + 4 > end:
        raise ValueError("truncated info message")
    memcpy(&v, buf + pos[0], 4)
    pos[0] += 4
    return v


cdef object _dec(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int depth):
    cdef uint8_t tag
    cdef long long ival
    cdef double dval
    cdef uint32_t n, k
    cdef int nd, type_num, j
    cdef cnp.npy_intp dims[32]
    cdef cnp.dtype descr
    cdef cnp.ndarray arr
    cdef double scalar[8]  # aligned room for any plain numeric scalar (clongdouble: 32 bytes)
    cdef Py_ssize_t nbytes
    cdef dict d
    cdef list lst
    if depth > _C_MAX_DEPTH or pos[0] >= end:
        raise ValueError("malformed info message")
    tag = buf[pos[0]]
    pos[0] += 1
    if tag == _C_NONE:
        return None
    if tag == _C_TRUE:
        return True
    if tag == _C_FALSE:
        return False
    if tag == _C_FLOAT or tag == _C_INT:
        if pos[0] + 8 > end:
            raise ValueError("truncated info message")
        if tag == _C_FLOAT:
            memcpy(&dval, buf + pos[0], 8)
            pos[0] += 8
            return dval
        memcpy(&ival, buf + pos[0], 8)
        pos[0] += 8
        return ival
    if tag == _C_STR:
        n = _get_u32(buf, pos, end)
        if pos[0] + n > end:
            raise ValueError("truncated info message")
        value = _cached_str(<const char *>buf + pos[0], n)
        pos[0] += n
        return value
    if tag == _C_DICT:
        n = _get_u32(buf, pos, end)
        d = {}
        for k in range(n):
            key = _dec(buf, pos, end, depth + 1)
            d[key] = _dec(buf, pos, end, depth + 1)
        return d
    if tag == _C_LIST or tag == _C_TUPLE:
        n = _get_u32(buf, pos, end)
        if n > end - pos[0]:  # every value takes at least one byte
            raise ValueError("malformed info message")
        lst = PyList_New(n)
        for k in range(n):
            value = _dec(buf, pos, end, depth + 1)
            Py_INCREF(value)
            PyList_SET_ITEM(lst, k, value)
        return lst if tag == _C_LIST else PyList_AsTuple(lst)
    if tag == _C_NPSCALAR:
        if pos[0] + 1 > end:
            raise ValueError("truncated info message")
        type_num = buf[pos[0]]
        if not _plain_numeric(type_num):
            raise ValueError("malformed info message")
        descr = cnp.PyArray_DescrFromType(type_num)
        nbytes = descr.itemsize
        if pos[0] + 1 + nbytes > end or nbytes > <Py_ssize_t>sizeof(scalar):
            raise ValueError("truncated info message")
        memcpy(scalar, buf + pos[0] + 1, nbytes)
        pos[0] += 1 + nbytes
        return PyArray_Scalar(scalar, descr, None)
    if tag == _C_NDARRAY:
        if pos[0] + 2 > end:
            raise ValueError("truncated info message")
        type_num = buf[pos[0]]
        nd = buf[pos[0] + 1]
        pos[0] += 2
        if not _plain_numeric(type_num) or nd > 32 or pos[0] + 8 * nd > end:
            raise ValueError("malformed info message")
        empty = False
        for j in range(nd):
            memcpy(&ival, buf + pos[0], 8)
            pos[0] += 8
            if ival < 0:
                raise ValueError("malformed info message")
            dims[j] = <cnp.npy_intp>ival
            empty = empty or ival == 0
        # The data's size, checked against the bytes left as it grows (no overflow); any zero
        # dimension, even after large ones (a (2, 0) array), makes it 0.
        nbytes = 0 if empty else cnp.PyArray_DescrFromType(type_num).itemsize
        for j in range(nd if nbytes else 0):
            if nbytes > (end - pos[0]) // dims[j]:
                raise ValueError("truncated info message")
            nbytes *= dims[j]
        if pos[0] + nbytes > end:
            raise ValueError("truncated info message")
        arr = cnp.PyArray_SimpleNew(nd, dims, type_num)
        if nbytes:
            memcpy(cnp.PyArray_DATA(arr), buf + pos[0], nbytes)
        pos[0] += nbytes
        return arr
    raise ValueError(f"malformed info message (tag {tag})")


def decode_infos(buffer):
    """The value :func:`encode_infos` wrote into ``buffer`` (all of it: slice it to the length)."""
    cdef const unsigned char[::1] view = buffer
    cdef Py_ssize_t end = view.shape[0]
    if end < 2 or view[0] != INFO_CODEC_MAGIC:
        raise ValueError("not an info message")
    cdef Py_ssize_t pos = 1
    value = _dec(&view[0], &pos, end, 0)
    if pos != end:
        raise ValueError("malformed info message (trailing bytes)")
    return value


def load_result(buffer):
    """A worker's result message (its mailbox, sliced to the length): ``decode_infos`` when it
    starts with INFO_CODEC_MAGIC, else ``pickle.loads`` (what a worker pickles when the codec
    does not carry a value)."""
    cdef const unsigned char[::1] view = buffer
    if view.shape[0] >= 2 and view[0] == INFO_CODEC_MAGIC:
        return decode_infos(buffer)
    return _pickle.loads(buffer)
