# cython: language_level=3, boundscheck=False, wraparound=False
"""Private Cython wrapper of csrc/: shared 32-bit words (shmvec_sync) and the index queue (shmvec_queue).

The only compiled module of shmvec.  Python code never touches a word except
through :class:`Words`; the memory ordering of each call is the one documented
in ``csrc/shmvec_sync.h``.
"""
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport errno
from libc.stdint cimport int64_t, uint32_t, uintptr_t

from shmvec._sync_def cimport (
    SHMVEC_INTERRUPTED,
    SHMVEC_OK,
    SHMVEC_TIMEOUT,
    shmvec_current_cpu,
    shmvec_fetch_add,
    shmvec_load_acquire,
    shmvec_now_ns,
    shmvec_store_release,
    shmvec_wait_while,
    shmvec_wake,
    shmvec_wake_sleepers,
)

OK = SHMVEC_OK
TIMEOUT = SHMVEC_TIMEOUT
INTERRUPTED = SHMVEC_INTERRUPTED

cdef int _WAKE_ALL = 0x7FFFFFFF


cdef class Words:
    """``count`` uint32 words at ``offset`` bytes into a writable buffer.

    The buffer is typically ``SharedMemory.buf``.  ``Words`` holds a view of it
    until :meth:`release` is called, so the mapping cannot go away under a
    waiting call.
    """

    cdef uint32_t *base
    cdef Py_ssize_t count
    cdef object view

    def __cinit__(self, buffer, Py_ssize_t offset, Py_ssize_t count):
        cdef unsigned char[::1] mv = buffer
        if offset < 0 or count < 0 or offset + 4 * count > mv.shape[0]:
            raise ValueError(f"words [{offset}, {offset + 4 * count}) outside a buffer of {mv.shape[0]} bytes")
        if count == 0:
            raise ValueError("Words needs at least one word")
        if (<uintptr_t>&mv[offset]) % 4 != 0:
            raise ValueError("words must be 4-byte aligned")
        self.base = <uint32_t *>&mv[offset]
        self.count = count
        self.view = mv

    def release(self):
        """Drops the view of the buffer; every later call raises ValueError."""
        self.base = NULL
        self.view = None

    cdef inline uint32_t *_word(self, Py_ssize_t i) except NULL:
        if self.base == NULL:
            raise ValueError("Words used after release()")
        if i < 0 or i >= self.count:
            raise IndexError(f"word {i} out of range [0, {self.count})")
        return self.base + i

    def __len__(self):
        return self.count

    def load(self, Py_ssize_t i):
        """Acquire-load of word ``i``."""
        return shmvec_load_acquire(self._word(i))

    def store(self, Py_ssize_t i, uint32_t value):
        """Release-store of ``value`` into word ``i``."""
        shmvec_store_release(self._word(i), value)

    def fetch_add(self, Py_ssize_t i, long delta):
        """Atomically adds ``delta`` (mod 2**32, seq_cst); returns the old value."""
        return shmvec_fetch_add(self._word(i), <uint32_t>delta)

    def wake(self, Py_ssize_t i, int n=_WAKE_ALL):
        """Wakes up to ``n`` processes waiting on word ``i``; returns how many."""
        cdef uint32_t *w = self._word(i)
        cdef int rc
        rc = shmvec_wake(w, n)
        if rc < 0:
            raise OSError(-rc, "futex wake failed")
        return rc

    def wake_sleepers(self, Py_ssize_t i, Py_ssize_t sleepers, int n=_WAKE_ALL):
        """Wakes up to ``n`` waiters on word ``i`` if word ``sleepers`` counts any.

        Call after storing the new value of word ``i``; waiters must pass the same
        ``sleepers`` to :meth:`wait_while`.  Skips the syscall when nobody sleeps.
        """
        cdef uint32_t *w = self._word(i)
        cdef uint32_t *s = self._word(sleepers)
        cdef int rc = shmvec_wake_sleepers(w, s, n)
        if rc < 0:
            raise OSError(-rc, "futex wake failed")
        return rc

    def wait_while(self, Py_ssize_t i, uint32_t old, double timeout, double spin=0.0, Py_ssize_t sleepers=-1):
        """Waits while word ``i`` equals ``old``.

        Returns the new value, or ``None`` when ``timeout`` seconds passed
        (``timeout < 0``: no limit) or a signal arrived.  The GIL is released
        while waiting.  Pending signal handlers run before returning, so
        ``KeyboardInterrupt`` propagates from here.  Callers loop: on ``None``
        they check that the other side is alive, then wait again.  ``sleepers``
        (a word index, or -1) is counted up while this call sleeps in the
        kernel, for :meth:`wake_sleepers`.
        """
        cdef uint32_t *w = self._word(i)
        cdef uint32_t *s = self._word(sleepers) if sleepers >= 0 else NULL
        cdef uint32_t observed = 0
        cdef int64_t spin_ns = <int64_t>(spin * 1e9) if spin > 0 else 0
        cdef int64_t timeout_ns = <int64_t>(timeout * 1e9) if timeout >= 0 else -1
        cdef int rc
        with nogil:
            rc = shmvec_wait_while(w, old, spin_ns, timeout_ns, &observed, s)
        if rc == SHMVEC_OK:
            return observed
        if rc == SHMVEC_TIMEOUT:
            return None
        if rc == SHMVEC_INTERRUPTED:
            PyErr_CheckSignals()
            return None
        raise OSError(-rc, "futex wait failed")


def current_cpu():
    """The CPU this process runs on now (a hint: it may move at once), or -1 where unknown."""
    return shmvec_current_cpu()


def now_ns():
    """CLOCK_MONOTONIC in nanoseconds (the clock the waits use)."""
    return shmvec_now_ns()


# ---- the index queue (csrc/shmvec_queue.h) ---------------------------------------------------------

from shmvec._queue_def cimport (
    SHMVEC_QUEUE_BAD_ARG,
    SHMVEC_QUEUE_EMPTY,
    SHMVEC_QUEUE_MAX_VALUE,
    shmvec_queue_bytes,
    shmvec_queue_capacity,
    shmvec_queue_capacity_for,
    shmvec_queue_init,
    shmvec_queue_pop,
    shmvec_queue_push,
    shmvec_queue_push_urgent,
    shmvec_queue_size,
    shmvec_queue_wait_count,
    shmvec_queue_try_pop,
)

QUEUE_MAX_VALUE = SHMVEC_QUEUE_MAX_VALUE


def queue_bytes(uint32_t capacity):
    """Bytes a queue of ``capacity`` slots (a power of two) takes in the buffer."""
    cdef size_t n = shmvec_queue_bytes(capacity)
    if n == 0:
        raise ValueError(f"queue capacity must be a power of two in [1, 2**30], got {capacity}")
    return n


def queue_capacity_for(uint32_t n):
    """The smallest power of two >= ``n``: a capacity that holds ``n`` values."""
    return shmvec_queue_capacity_for(n)


cdef class IndexQueue:
    """A bounded multi-producer single-consumer queue of ints in a shared buffer.

    ``IndexQueue(buffer, offset, capacity, init=True)`` lays out an empty queue at
    ``offset`` (64-byte aligned) bytes into ``buffer``; other processes attach to the
    same bytes with ``init=False``.  Any number of processes may :meth:`push` at
    once; only one process may :meth:`pop`/:meth:`try_pop`.  No more than
    ``capacity`` values may be outstanding (a push beyond waits for the consumer).
    The memory ordering is documented in ``csrc/shmvec_queue.h``: what a producer
    wrote before ``push(i)`` is visible to the consumer once ``pop`` returns ``i``.
    """

    cdef uint32_t *q
    cdef object view

    def __cinit__(self, buffer, Py_ssize_t offset, uint32_t capacity, bint init=True):
        cdef unsigned char[::1] mv = buffer
        cdef size_t nbytes = shmvec_queue_bytes(capacity)
        if nbytes == 0:
            raise ValueError(f"queue capacity must be a power of two in [1, 2**30], got {capacity}")
        if offset < 0 or offset + <Py_ssize_t>nbytes > mv.shape[0]:
            raise ValueError(f"queue [{offset}, {offset + nbytes}) outside a buffer of {mv.shape[0]} bytes")
        if (<uintptr_t>&mv[offset]) % 64 != 0:
            raise ValueError("the queue must be 64-byte aligned")
        self.q = <uint32_t *>&mv[offset]
        self.view = mv
        if init:
            if shmvec_queue_init(self.q, capacity) != SHMVEC_OK:
                raise ValueError("bad queue arguments")
        elif shmvec_queue_capacity(self.q) != capacity:
            cap = shmvec_queue_capacity(self.q)
            self.q = NULL
            self.view = None
            raise ValueError(f"the queue at offset {offset} has capacity {cap}, not {capacity}")

    def release(self):
        """Drops the view of the buffer; every later call raises ValueError."""
        self.q = NULL
        self.view = None

    cdef inline uint32_t *_q(self) except NULL:
        if self.q == NULL:
            raise ValueError("IndexQueue used after release()")
        return self.q

    @property
    def capacity(self):
        return shmvec_queue_capacity(self._q())

    def __len__(self):
        """Values pushed and not yet popped (a snapshot)."""
        return shmvec_queue_size(self._q())

    def push(self, uint32_t value, bint urgent=False):
        """Appends ``value`` (0 <= value <= QUEUE_MAX_VALUE); safe from any process, concurrently.

        ``urgent`` wakes a consumer in :meth:`wait_count` even if its batch is not complete.
        """
        cdef uint32_t *q = self._q()
        cdef int rc
        if value > SHMVEC_QUEUE_MAX_VALUE:
            raise ValueError(f"value {value} exceeds QUEUE_MAX_VALUE")
        with nogil:
            rc = shmvec_queue_push_urgent(q, value) if urgent else shmvec_queue_push(q, value)
        if rc < 0:
            raise OSError(-rc, "queue push failed")

    def push_many(self, const uint32_t[::1] values):
        """Appends every value of a contiguous uint32 array, in order, without the GIL."""
        cdef uint32_t *q = self._q()
        cdef Py_ssize_t k, n = values.shape[0]
        cdef int rc = 0
        for k in range(n):
            if values[k] > SHMVEC_QUEUE_MAX_VALUE:
                raise ValueError(f"value {values[k]} exceeds QUEUE_MAX_VALUE")
        with nogil:
            for k in range(n):
                rc = shmvec_queue_push(q, values[k])
                if rc < 0:
                    break
        if rc < 0:
            raise OSError(-rc, "queue push failed")

    def wait_count(self, uint32_t n, double timeout, double spin=0.0):
        """True at once if ``n`` values are published and not popped; else waits (GIL released)
        until woken by the push that completes the ``n`` or an urgent push (asleep: once per
        batch, not once per value), or until any push (while spinning), and returns True:
        pop what is there and call again for the rest.  False after ``timeout`` seconds or a
        signal (its handler runs first).  Consumer only."""
        cdef uint32_t *q = self._q()
        cdef int64_t spin_ns = <int64_t>(spin * 1e9) if spin > 0 else 0
        cdef int64_t timeout_ns = <int64_t>(timeout * 1e9) if timeout >= 0 else -1
        cdef int rc
        with nogil:
            rc = shmvec_queue_wait_count(q, n, spin_ns, timeout_ns)
        if rc == SHMVEC_OK:
            return True
        if rc == SHMVEC_TIMEOUT:
            return False
        if rc == SHMVEC_INTERRUPTED:
            PyErr_CheckSignals()
            return False
        raise OSError(-rc, "queue wait failed")

    def try_pop(self):
        """The next value, or None if none is ready.  Consumer only."""
        cdef uint32_t value = 0
        if shmvec_queue_try_pop(self._q(), &value) == SHMVEC_OK:
            return value
        return None

    def pop(self, double timeout, double spin=0.0):
        """Waits for the next value (GIL released); None after ``timeout`` seconds (< 0: no
        limit) or when a signal arrived (its handler runs first).  Consumer only."""
        cdef uint32_t *q = self._q()
        cdef uint32_t value = 0
        cdef int64_t spin_ns = <int64_t>(spin * 1e9) if spin > 0 else 0
        cdef int64_t timeout_ns = <int64_t>(timeout * 1e9) if timeout >= 0 else -1
        cdef int rc
        with nogil:
            rc = shmvec_queue_pop(q, spin_ns, timeout_ns, &value)
        if rc == SHMVEC_OK:
            return value
        if rc == SHMVEC_TIMEOUT:
            return None
        if rc == SHMVEC_INTERRUPTED:
            PyErr_CheckSignals()
            return None
        raise OSError(-rc, "queue pop failed")


# ---- hot-path helpers over numpy arrays -------------------------------------------------------------
#
# Per env and per step, shmvec's Python code used numpy's Python API: a worker wrote each
# observation with ``buf[i] = obs`` after checking its type, shape and dtype (about 0.6 us per
# env), and the parent checked and copied the actions and built SB3's info dicts with a handful
# of numpy calls (a few us per step).  These helpers do the same work in one C loop for the
# common case and hand anything else back to the Python path, which checks, casts and raises
# as before: both paths end in the same bytes.

cimport numpy as cnp
from libc.string cimport memcpy

cnp.import_array()

cdef inline bint _same_dtype(cnp.ndarray a, cnp.dtype d):
    cdef cnp.dtype ad = <cnp.dtype>cnp.PyArray_DESCR(a)
    return ad is d or cnp.PyArray_EquivTypes(ad, d)


cdef class RowWriter:
    """``w(i, value)`` writes ``value`` into row ``i`` of ``dst`` (a C-contiguous ndarray).

    Fast path: ``value`` is an ndarray (exact type), C-contiguous, of exactly the row's shape
    and of a dtype equivalent to ``dst``'s; its bytes are copied.  Anything else (another
    dtype, a list, a scalar, a subclass, a wrong shape, ``i`` out of range) goes to
    ``slow(i, value)``, which converts, checks and raises (``shmvec._layout``).
    """

    cdef cnp.ndarray dst
    cdef char *base
    cdef Py_ssize_t n_rows
    cdef Py_ssize_t row_bytes
    cdef int ndim
    cdef cnp.npy_intp *dims
    cdef cnp.dtype dtype
    cdef readonly object slow

    def __cinit__(self, cnp.ndarray dst not None, slow not None):
        if cnp.PyArray_NDIM(dst) < 1 or not cnp.PyArray_IS_C_CONTIGUOUS(dst):
            raise ValueError("RowWriter needs a C-contiguous array with at least one axis")
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
                    return
        self.slow(i, value)


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


from cpython.float cimport PyFloat_Check, PyFloat_AS_DOUBLE
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY


cdef inline int _as_flag(object x):
    """1 for True, 0 for False, -1 for anything that is not a Python bool."""
    if x is True:
        return 1
    if x is False:
        return 0
    return -1


def publish_step(cnp.ndarray rew not None, cnp.ndarray terminated not None, cnp.ndarray truncated not None,
                 Py_ssize_t start, list rews not None, list terms not None, list truncs not None):
    """A worker's ``rew[start:start + n] = rews`` (float32) and the same for both flags (bool).

    Takes rewards that are Python floats (or a subclass, as numpy's float64) and flags that
    are Python bools; returns False as soon as one is anything else, and the caller then does
    the three numpy assignments, which convert (or raise) as before and overwrite all ``n``.
    """
    cdef Py_ssize_t j, n = len(rews)
    if len(terms) != n or len(truncs) != n or start < 0:
        return False
    for a in (rew, terminated, truncated):
        if cnp.PyArray_NDIM(a) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(a) or start + n > cnp.PyArray_DIM(a, 0):
            return False
    if (cnp.PyArray_TYPE(rew) != cnp.NPY_FLOAT32 or cnp.PyArray_TYPE(terminated) != cnp.NPY_BOOL
            or cnp.PyArray_TYPE(truncated) != cnp.NPY_BOOL):
        return False
    cdef float *r = <float *>cnp.PyArray_DATA(rew) + start
    cdef unsigned char *te = <unsigned char *>cnp.PyArray_DATA(terminated) + start
    cdef unsigned char *tr = <unsigned char *>cnp.PyArray_DATA(truncated) + start
    cdef object x
    cdef double d
    cdef int flag
    for j in range(n):
        x = rews[j]
        if not PyFloat_Check(x):
            return False
        d = PyFloat_AS_DOUBLE(x)
        if d > FLT_MAX:  # out of float's range: inf, as numpy gives (the C cast alone is undefined)
            d = INFINITY
        elif d < -FLT_MAX:
            d = -INFINITY
        r[j] = <float>d
        flag = _as_flag(terms[j])
        if flag < 0:
            return False
        te[j] = flag
        flag = _as_flag(truncs[j])
        if flag < 0:
            return False
        tr[j] = flag
    return True
