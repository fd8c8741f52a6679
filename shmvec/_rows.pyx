# cython: language_level=3, boundscheck=False, wraparound=False
"""Private Cython module: the hot path's C loops over numpy arrays.

:class:`RowWriter` (a worker writes an observation row), :func:`copy_actions` (the parent
checks and copies a batch of actions), :func:`step_infos` (SB3's per-step dones and infos) and
:func:`publish_step` (a worker writes its rewards and flags).  Each does the common case in one
C loop and hands anything else back to the Python path (``shmvec._layout``, ``shmvec._actions``).
"""
cimport numpy as cnp
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_Check
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY
from libc.stdint cimport uint32_t
from libc.string cimport memcpy

from shmvec._sync cimport Words
from shmvec._sync_def cimport shmvec_store_release

cnp.import_array()

# Per env and per step, shmvec's Python code used numpy's Python API: a worker wrote each
# observation with ``buf[i] = obs`` after checking its type, shape and dtype, and the parent
# checked and copied the actions and built SB3's info dicts with a handful of numpy calls.
# These helpers do the same work in one C loop for the common case and hand anything else back
# to the Python path, which checks, casts and raises as before: both paths end in the same bytes.


cdef inline bint _same_dtype(cnp.ndarray a, cnp.dtype d):
    cdef cnp.dtype ad = <cnp.dtype>cnp.PyArray_DESCR(a)
    return ad is d or cnp.PyArray_EquivTypes(ad, d)


cdef class RowWriter:
    """``w(i, value)`` writes ``value`` into row ``i`` of ``dst`` (a C-contiguous ndarray).

    Fast path: ``value`` is an ndarray (exact type), C-contiguous, of exactly the row's shape
    and of a dtype equivalent to ``dst``'s; its bytes are copied.  Anything else (another
    dtype, a list, a scalar, a subclass, a wrong shape, ``i`` out of range) goes to
    ``slow(i, value)``, which converts, checks and raises (``shmvec._layout``).

    With ``at`` (a ``Words``) and ``at_index``, each row written also stores ``i + 1`` into
    that word: a worker's ENV_AT, the env it is in while it steps its envs in order
    (``shmvec._protocol``, "How failures are noticed"), at the cost of one store, not of a
    Python call per env.  Nothing is stored once ``at`` is released.
    """

    cdef cnp.ndarray dst
    cdef char *base
    cdef Py_ssize_t n_rows
    cdef Py_ssize_t row_bytes
    cdef int ndim
    cdef cnp.npy_intp *dims
    cdef cnp.dtype dtype
    cdef readonly object slow
    cdef Words at  # shmvec._sync.Words, through _sync.pxd
    cdef Py_ssize_t at_index

    def __cinit__(self, cnp.ndarray dst not None, slow not None, Words at=None, Py_ssize_t at_index=0):
        if cnp.PyArray_NDIM(dst) < 1 or not cnp.PyArray_IS_C_CONTIGUOUS(dst):
            raise ValueError("RowWriter needs a C-contiguous array with at least one axis")
        if at is not None and not 0 <= at_index < at.count:
            raise IndexError(f"word {at_index} out of range [0, {at.count})")
        self.at = at
        self.at_index = at_index
        self.dst = dst
        self.base = <char *>cnp.PyArray_DATA(dst)
        self.n_rows = cnp.PyArray_DIM(dst, 0)
        self.ndim = cnp.PyArray_NDIM(dst) - 1
        self.dims = cnp.PyArray_DIMS(dst) + 1
        self.row_bytes = cnp.PyArray_ITEMSIZE(dst)
        cdef int k
        for k in range(self.ndim):
            self.row_bytes *= self.dims[k]
        self.dtype = <cnp.dtype>cnp.PyArray_DESCR(dst)
        self.slow = slow

    def __call__(self, Py_ssize_t i, value):
        cdef cnp.ndarray v
        cdef int k
        if type(value) is cnp.ndarray and 0 <= i < self.n_rows:
            v = <cnp.ndarray>value
            if cnp.PyArray_NDIM(v) == self.ndim and cnp.PyArray_IS_C_CONTIGUOUS(v) and _same_dtype(v, self.dtype):
                for k in range(self.ndim):
                    if cnp.PyArray_DIMS(v)[k] != self.dims[k]:
                        break
                else:
                    memcpy(self.base + i * self.row_bytes, cnp.PyArray_DATA(v), self.row_bytes)
                    self._mark(i)
                    return
        self.slow(i, value)
        self._mark(i)

    cdef inline void _mark(self, Py_ssize_t i) noexcept:
        if self.at is not None and self.at.base != NULL:
            shmvec_store_release(self.at.base + self.at_index, <uint32_t>(i + 1))


ACTIONS_COPY = 0      # copy only (integer Box, or invalid_actions="ignore")
ACTIONS_RANGE = 1     # int64: start <= a < start + size (Discrete, uniform MultiDiscrete)
ACTIONS_NO_NAN = 2    # float32 / float64: no NaN (float Box)


def copy_actions(value, cnp.ndarray dst not None, int check, long long start=0, long long size=0):
    """Copies a batch of actions into ``dst`` if it needs no conversion and passes ``check``.

    Returns True when it copied.  False (nothing written) when ``value`` is not a C-contiguous
    ndarray of ``dst``'s shape and dtype, or a value fails the check: the caller's Python path
    then reshapes, casts, names the faulty envs and raises (or warns).
    """
    if type(value) is not cnp.ndarray:
        return False
    cdef cnp.ndarray v = <cnp.ndarray>value
    cdef int k, nd = cnp.PyArray_NDIM(dst)
    if cnp.PyArray_NDIM(v) != nd or not cnp.PyArray_IS_C_CONTIGUOUS(v) or not cnp.PyArray_IS_C_CONTIGUOUS(dst):
        return False
    for k in range(nd):
        if cnp.PyArray_DIMS(v)[k] != cnp.PyArray_DIMS(dst)[k]:
            return False
    if not _same_dtype(v, <cnp.dtype>cnp.PyArray_DESCR(dst)):
        return False
    cdef Py_ssize_t j, n = cnp.PyArray_SIZE(v)
    cdef int typenum = cnp.PyArray_TYPE(v)
    cdef const long long *ints
    cdef const float *f32
    cdef const double *f64
    if check == ACTIONS_RANGE:
        if typenum != cnp.NPY_INT64 or size <= 0:
            return False
        ints = <const long long *>cnp.PyArray_DATA(v)
        for j in range(n):
            if <unsigned long long>ints[j] - <unsigned long long>start >= <unsigned long long>size:  # both bounds (wraps)
                return False
    elif check == ACTIONS_NO_NAN:
        if typenum == cnp.NPY_FLOAT32:
            f32 = <const float *>cnp.PyArray_DATA(v)
            for j in range(n):
                if f32[j] != f32[j]:
                    return False
        elif typenum == cnp.NPY_FLOAT64:
            f64 = <const double *>cnp.PyArray_DATA(v)
            for j in range(n):
                if f64[j] != f64[j]:
                    return False
        else:
            return False
    elif check != ACTIONS_COPY:
        raise ValueError(f"unknown action check {check}")
    memcpy(cnp.PyArray_DATA(dst), cnp.PyArray_DATA(v), n * cnp.PyArray_ITEMSIZE(v))
    return True


def step_infos(cnp.ndarray terminated not None, cnp.ndarray truncated not None, cnp.ndarray dones not None):
    """SB3's per-step bookkeeping in one pass over the flags of all envs.

    Writes ``dones = terminated | truncated`` and returns ``(infos, done_indices)``: one new
    ``{"TimeLimit.truncated": truncated and not terminated}`` per env, and the indices of the
    envs that are done.  All three arrays are 1-D, C-contiguous and of dtype bool.
    """
    cdef Py_ssize_t i, n = cnp.PyArray_DIM(terminated, 0)
    for a in (terminated, truncated, dones):
        if (cnp.PyArray_NDIM(a) != 1 or cnp.PyArray_DIM(a, 0) != n or cnp.PyArray_TYPE(a) != cnp.NPY_BOOL
                or not cnp.PyArray_IS_C_CONTIGUOUS(a)):
            raise ValueError("step_infos needs three 1-D contiguous bool arrays of one length")
    cdef const unsigned char *te = <const unsigned char *>cnp.PyArray_DATA(terminated)
    cdef const unsigned char *tr = <const unsigned char *>cnp.PyArray_DATA(truncated)
    cdef unsigned char *d = <unsigned char *>cnp.PyArray_DATA(dones)
    cdef list infos = []
    cdef list done = []
    for i in range(n):
        d[i] = 1 if (te[i] or tr[i]) else 0
        infos.append({"TimeLimit.truncated": True if (tr[i] and not te[i]) else False})
        if d[i]:
            done.append(i)
    return infos, done


cdef inline int _as_flag(object x):
    """1 for True, 0 for False, -1 for anything that is not a Python bool."""
    if x is True:
        return 1
    if x is False:
        return 0
    return -1


def publish_step(cnp.ndarray rew not None, cnp.ndarray terminated not None, cnp.ndarray truncated not None,
                 Py_ssize_t start, list rews not None, list terms not None, list truncs not None):
    """A worker's ``rew[start:start + n] = rews`` and the same for both flags (bool).

    ``rew`` is float64 (the layout's reward buffer: Gymnasium's dtype; SB3's float32 is made
    from it in the parent, which rounds as numpy's own float32 assignment would) or float32.
    Takes rewards that are Python floats (or a subclass, as numpy's float64) or ints (exactly
    ``int``, within int64), and flags that are Python bools; returns False as soon as one is
    anything else, and the caller then does the three numpy assignments, which convert (or
    raise) as before and overwrite all ``n``.
    """
    cdef Py_ssize_t j, n = len(rews)
    if len(terms) != n or len(truncs) != n or start < 0:
        return False
    for a in (rew, terminated, truncated):
        if cnp.PyArray_NDIM(a) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(a) or start + n > cnp.PyArray_DIM(a, 0):
            return False
    cdef int rew_type = cnp.PyArray_TYPE(rew)
    if ((rew_type != cnp.NPY_FLOAT64 and rew_type != cnp.NPY_FLOAT32)
            or cnp.PyArray_TYPE(terminated) != cnp.NPY_BOOL or cnp.PyArray_TYPE(truncated) != cnp.NPY_BOOL):
        return False
    cdef bint wide = rew_type == cnp.NPY_FLOAT64
    cdef double *r64 = <double *>cnp.PyArray_DATA(rew) + start
    cdef float *r32 = <float *>cnp.PyArray_DATA(rew) + start
    cdef unsigned char *te = <unsigned char *>cnp.PyArray_DATA(terminated) + start
    cdef unsigned char *tr = <unsigned char *>cnp.PyArray_DATA(truncated) + start
    cdef object x
    cdef double d
    cdef long long k
    cdef int flag, overflow
    for j in range(n):
        x = rews[j]
        if PyFloat_Check(x):
            d = PyFloat_AS_DOUBLE(x)
        elif PyLong_CheckExact(x):
            overflow = 0
            k = PyLong_AsLongLongAndOverflow(x, &overflow)
            if overflow != 0:
                return False
            d = <double>k
        else:
            return False
        if wide:
            r64[j] = d
        else:
            if d > FLT_MAX:  # out of float's range: inf, as numpy gives (the C cast alone is undefined)
                d = INFINITY
            elif d < -FLT_MAX:
                d = -INFINITY
            r32[j] = <float>d
        flag = _as_flag(terms[j])
        if flag < 0:
            return False
        te[j] = flag
        flag = _as_flag(truncs[j])
        if flag < 0:
            return False
        tr[j] = flag
    return True
