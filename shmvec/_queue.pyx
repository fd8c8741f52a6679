# cython: language_level=3, boundscheck=False, wraparound=False
"""Private Cython wrapper of csrc/shmvec_queue.h: the bounded MPSC queue of ints in shared memory.

:class:`IndexQueue` is the queue (its memory ordering is documented in the header); the three
functions at the end are a pool's in-flight bookkeeping around it (``shmvec.env_pool``: which
envs were sent and not yet received), each one C call so that a signal handler runs before it
or after it, never half-way.  Waits release the GIL and run signal handlers as in ``_sync``.
"""
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint32_t, uintptr_t

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
from shmvec._sync_def cimport SHMVEC_INTERRUPTED, SHMVEC_OK, SHMVEC_TIMEOUT

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
