"""A mapping of the shared-memory block received as a file descriptor.

The block's name is unlinked from ``/dev/shm`` once the first workers have
attached (so nothing outlives a SIGKILLed parent).  A worker started later (a
restart, ``on_failure="restart"``) therefore cannot open it by name: the parent
sends it the descriptor it keeps open (``SharedMemory._fd``) over the worker's
pipe (``multiprocessing.reduction.send_handle``, SCM_RIGHTS), and the worker
maps that.  :class:`FdSegment` has the attributes of ``SharedMemory`` that
:func:`shmvec._layout.close_mapping` uses, so the worker closes either the same way.
"""

from __future__ import annotations

import mmap
import os


class FdSegment:
    """``buf`` over an mmap of ``fd`` (whole file); owns ``fd`` and closes it in :meth:`close`."""

    _fd: int = -1
    _mmap: mmap.mmap | None = None
    _buf: memoryview | None = None

    def __init__(self, fd: int) -> None:
        self._fd = fd
        size = os.fstat(fd).st_size
        self._mmap = mmap.mmap(fd, size)
        self._buf = memoryview(self._mmap)
        self.size = size

    @property
    def buf(self) -> memoryview:
        assert self._buf is not None
        return self._buf

    def close(self) -> None:
        """Unmaps and closes the descriptor; BufferError (nothing closed) while arrays still view it."""
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
