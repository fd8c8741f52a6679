"""Shared-memory segments: created with their pages reserved, or mapped from a file descriptor.

Every segment shmvec creates (the engine's block, the pool's queues and info slots) comes from
:func:`create_segment`, which reserves its pages (``posix_fallocate``) before anything is written
to it (the zero-copy lease blocks at the end of the engine's block: when each is first used,
:mod:`shmvec._leases`).  A tmpfs hands out a page only when it is first touched: a segment created without the
reservation fits in a nearly full ``/dev/shm`` and then kills the process with SIGBUS at its first
write to a page that is not there (during construction, or mid-step).  Reserved, the shortage is
an ENOSPC at construction, raised as :class:`shmvec.ShmVecEnvError` saying what to do.

A mapping of the block received as a file descriptor (:class:`FdSegment`): the block's name is
unlinked from ``/dev/shm`` once the first workers have attached (so nothing outlives a SIGKILLed
parent).  A worker started later (a restart, ``on_failure="restart"``) therefore cannot open it by
name: the parent sends it the descriptor it keeps open (``SharedMemory._fd``) over the worker's
pipe (``multiprocessing.reduction.send_handle``, SCM_RIGHTS), and the worker maps that.
:class:`FdSegment` has the attributes of ``SharedMemory`` that
:func:`shmvec._layout.close_mapping` uses, so the worker closes either the same way.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
from multiprocessing.shared_memory import SharedMemory

from shmvec._errors import ShmVecEnvError


def create_segment(nbytes: int, reserve: int | None = None, what: str = "buffers") -> SharedMemory:
    """A new segment of ``nbytes``, the pages of its first ``reserve`` bytes (default all) reserved
    now; on failure nothing is left behind (the segment is closed and unlinked).

    :raises ShmVecEnvError: ``/dev/shm`` has no room for them (ENOSPC), instead of SIGBUS later.
    """
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=nbytes)
    reserve = nbytes if reserve is None else reserve
    try:
        os.posix_fallocate(shm._fd, 0, reserve)
    except (AttributeError, OSError) as exc:
        # Another error (a file system without fallocate) leaves the pages to be found on use.
        if getattr(exc, "errno", None) == errno.ENOSPC:
            shm.close()
            shm.unlink()
            raise ShmVecEnvError(
                f"/dev/shm has no room for {reserve} bytes of {what}; enlarge it "
                "(docker: --shm-size) or use fewer envs or smaller observations."
            ) from exc
    except BaseException:
        shm.close()
        shm.unlink()
        raise
    return shm


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
