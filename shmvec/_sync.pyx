# cython: language_level=3, boundscheck=False, wraparound=False
"""Private Cython wrapper of csrc/shmvec_sync.h: shared 32-bit words and futex waits on them.

Python code never touches a word except through :class:`Words`; the memory ordering of each
call is the one documented in ``csrc/shmvec_sync.h``.  Every wait releases the GIL, returns
on a signal after running its handler (so ``KeyboardInterrupt`` propagates), and has a timeout
after which the caller checks that the other side is alive.  ``shmvec/_sync.pxd`` declares
:class:`Words` for the modules that cimport it (``shmvec._rows``).
"""
from cpython.exc cimport PyErr_CheckSignals
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

    # base, count, view: declared in _sync.pxd

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
