# cython: language_level=3, boundscheck=False, wraparound=False
"""Private Cython wrapper of csrc/ (shared 32-bit words, the index queue), the hot path's C loops and the info codec.

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

    def try_pop_to(self, list out, uint32_t keep_out=0):
        """``try_pop()``, the value also appended to ``out`` unless it has a bit of ``keep_out``
        set.  One C call: a signal handler (Ctrl-C) runs before the pop or after the append,
        never between them with the value only in the caller's local.  Consumer only."""
        cdef uint32_t value = 0
        if shmvec_queue_try_pop(self._q(), &value) != SHMVEC_OK:
            return None
        if not (value & keep_out):
            out.append(value)
        return value

    def pop_to(self, list out, double timeout, double spin=0.0, uint32_t keep_out=0):
        """``pop(timeout, spin)``, the value also appended to ``out`` unless it has a bit of
        ``keep_out`` set (see :meth:`try_pop_to`).  Consumer only."""
        value = self.pop(timeout, spin)
        if value is not None and not (<uint32_t>value & keep_out):
            out.append(value)
        return value

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


def send_ids_valid(unsigned char[::1] in_flight, const int64_t[::1] ids):
    """True if every id is in ``[0, len(in_flight))``, not in flight, and none repeats: a pool's
    ``send`` checked in one pass (the Python path names what is wrong when this says False).

    Marks each id seen (2) as it goes and clears the marks before returning, with no Python
    between: ``in_flight`` is as it was whatever a signal handler does.
    """
    cdef Py_ssize_t k, n = ids.shape[0], m = in_flight.shape[0]
    cdef int64_t i
    cdef bint ok = True
    for k in range(n):
        i = ids[k]
        if i < 0 or i >= m or in_flight[i] != 0:
            ok = False
            break
        in_flight[i] = 2
    for k in range(n):
        i = ids[k]
        if 0 <= i < m and in_flight[i] == 2:
            in_flight[i] = 0
    return ok


def release_in_flight(unsigned char[::1] in_flight, list ids):
    """Clears ``in_flight[i]`` for every ``i`` in ``ids``, then empties ``ids``: the end of a
    pool's ``recv``.  One C call, so a signal handler cannot leave the envs released but still
    listed as received (a ``recv()`` called again would return them twice)."""
    cdef Py_ssize_t k, n = len(ids)
    cdef Py_ssize_t i
    for k in range(n):
        i = ids[k]
        if i < 0 or i >= in_flight.shape[0]:
            raise IndexError(f"env id {i} out of range")
    for k in range(n):
        in_flight[<Py_ssize_t>ids[k]] = 0
    del ids[:]


def push_in_flight(list queues, unsigned char[::1] in_flight, const int64_t[::1] ids,
                   const int64_t[::1] owner, const int64_t[::1] starts):
    """Marks env ``ids[k]`` in flight (``in_flight[ids[k]] = 1``) and pushes ``ids[k] -
    starts[w]`` to ``queues[w]``, ``w = owner[ids[k]]``, for every k: a pool's ``send``.

    One C call, so that a signal handler (Ctrl-C's KeyboardInterrupt) runs before it or after
    it, never between marking an env and pushing it (an env marked and not pushed would be
    waited for for ever).  The caller has checked the ids (in range, distinct, not in flight).
    """
    cdef Py_ssize_t k, n = ids.shape[0]
    cdef int64_t i, w
    cdef uint32_t value
    cdef uint32_t *q
    cdef int rc
    for k in range(n):
        i = ids[k]
        if i < 0 or i >= in_flight.shape[0] or i >= owner.shape[0]:
            raise IndexError(f"env id {i} out of range")
        w = owner[i]
        if w < 0 or w >= len(queues) or w >= starts.shape[0] or i < starts[w]:
            raise IndexError(f"env id {i}: bad worker {w}")
    for k in range(n):
        in_flight[ids[k]] = 1
    for k in range(n):
        i = ids[k]
        w = owner[i]
        q = (<IndexQueue?>queues[w])._q()
        value = <uint32_t>(i - starts[w])
        with nogil:
            rc = shmvec_queue_push(q, value)
        if rc < 0:
            raise OSError(-rc, "queue push failed")


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
    cdef Words at
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


from cpython.float cimport PyFloat_Check, PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_CheckExact, PyLong_AsLongLongAndOverflow
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


# ---- the info codec: infos from the workers without pickle ------------------------------------------
#
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

from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.list cimport PyList_AsTuple, PyList_New, PyList_SET_ITEM
from libc.stdint cimport uint8_t
from libc.string cimport memcmp

cdef extern from "numpy/arrayobject.h":
    object PyArray_Scalar(void *data, cnp.dtype descr, object base)
    enum: NPY_HALF

import numpy as _np

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


import pickle as _pickle


def load_result(buffer):
    """A worker's result message (its mailbox, sliced to the length): ``decode_infos`` when it
    starts with INFO_CODEC_MAGIC, else ``pickle.loads`` (what a worker pickles when the codec
    does not carry a value)."""
    cdef const unsigned char[::1] view = buffer
    if view.shape[0] >= 2 and view[0] == INFO_CODEC_MAGIC:
        return decode_infos(buffer)
    return _pickle.loads(buffer)
