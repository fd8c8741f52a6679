"""Observations handed out without a copy, and still safe (``zero_copy``).

Without it, the workers write every step's observations into one set of buffers (block 0) and
the parent copies them out (``copy=True``): SB3 keeps the last observation across a step, so
handing out the buffer itself would let the next step overwrite what the caller holds.  With
it, the parent hands out the buffers themselves, and never lets the workers write into a
buffer the caller still holds.

Layout (:class:`shmvec._layout.Layout`, ``obs_blocks=K``): after block 0 and the other buffers,
K *lease blocks*, each a full set of observation buffers (one per leaf, ``(n_envs, *shape)``).
They come last in the segment, and their pages are reserved (``posix_fallocate``) only the first
time each is used: a caller that holds one observation at a time uses two of them.

Who writes what (protocol step 1, :mod:`shmvec._protocol`):

- the parent, before it posts a STEP or a RESET, picks the block (:meth:`Leases.pick`) and stores
  its index into OBS_BLOCK (row 0); the release store of each worker's CMD_SEQ publishes it with
  the command.  Every other command (the pool's POOL) stores 0;
- each worker, after its acquire of CMD_SEQ, reads OBS_BLOCK and writes its envs' observations
  into that block (one ``RowWriter`` per block).  Terminal observations stay in their own buffer
  (copied out into the infos, as before);
- the parent, once PENDING is 0, hands out that block (:meth:`Leases.value`): block 0 as a copy,
  a lease block as its arrays themselves (a fresh ``dict``/``tuple`` around them for ``Dict`` and
  ``Tuple`` spaces).

When a lease block is free.  Each leaf of a lease block is, in the parent, a shaped array ``R``
viewing an array ``F`` (``np.frombuffer`` over the mapping, whose base is a ``memoryview``: it
holds the mapping open, so that ``close()`` cannot unmap what the caller holds).  The caller gets
a new view of ``R`` each time (``R`` itself stays the parent's: a caller that set its ``shape``
or its ``writeable`` flag would change what the next caller gets).  Numpy makes every view of it
(a slice, a reshape, a transpose, ``torch.from_numpy``, a ``memoryview``) refer to ``F`` itself:
it collapses chains of views to the first array that is not a view of another array.  So the
reference count of each leaf's ``F``, its *root*, counts every handle the caller has on the
block, however derived (a ``weakref`` is no handle: it sees the block's next contents).  A block
is free when the count of each of its roots is what the parent's own references make, measured
once when nothing else held them.  The check runs in
the parent only, before a post, under the vec env's lock; another thread of the caller's cannot
take a new reference to a block it holds no reference to, so a block seen free stays free.

Growth and its bound.  :meth:`Leases.pick` takes the lowest free block among those in use (a
block the caller has just let go is warm in the cache); when all are held, it reserves the pages
of the next one, up to K (:data:`MAX_BLOCKS`, and :data:`MAX_BYTES` in all).  Past the bound, or
when ``/dev/shm`` has no room for another block (ENOSPC from the reservation: no SIGBUS later),
the step goes to block 0 and the caller gets a copy, as without ``zero_copy``.

A partial reset (Gymnasium's ``reset_mask``) goes to a free block as any RESET does, and the envs
it does not reset must show their last observation there: each worker keeps, for each of its
envs, the object the env last returned (a reference, no copy, kept by the worker's step and reset
loops, only with lease blocks) and writes it again.  Nothing is copied from the
block the caller holds: the caller may have written into it in place (``obs *= 0.5``).

Forks.  A child of ``os.fork()`` (or of a ``fork`` multiprocessing process) inherits the mapping,
shared: a block it holds would change under it when the parent's next steps reuse the block (the
parent's reference counts do not see the child's handles), and what either process writes into a
block they both hold would show in the other.  So at every fork, the pages of each block the
caller holds (or, after ``close()``, that any array still views) are copied in the parent just
before it (:func:`_snapshot_before_fork`: the parent cannot step on before the fork returns, so
the copy is what the caller held), and in the child :func:`_unshare_after_fork` replaces those
pages with private memory holding that copy, at the same address (``mmap(MAP_FIXED | MAP_PRIVATE
| MAP_ANONYMOUS)``): every view the child holds stays valid and becomes its own, as a copy would
be.  (A copy taken in the child would race with the parent's next step.)  This costs a copy of
the held blocks per fork, and nothing on the step.  A vec env's own ``fork`` workers are left out
(:func:`starting_workers`): they map the block anew and never read the parent's mapping.

Failures add nothing new: a step that fails leaves its block half written and the engine broken.
``close()`` drops the roots; blocks the caller still holds keep the mapping alive
(:func:`shmvec._layout.close_mapping`), its name long unlinked.

Off (block 0 only) with ``copy=False`` (the caller asked for the buffer itself), with
``on_failure="restart"`` (a restart resets a worker's envs alone, outside the commands that
write every env's observations into one block), for observation leaves without a fixed size, in the pools and in ``ShmParallelEnv`` (unless
asked for: it reads the block written, then copies).  ``ShmMultiAgentVecEnv`` hands out its rows
as views of the lease block.  By default (``zero_copy=None``) it is on when one step's
observations weigh at least :data:`AUTO_MIN_BYTES`: below that a copy costs as much or less
(docs/design.md, "Observations
without the copy").
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec import _protocol as P
from shmvec._containers import assembler, children
from shmvec._errors import SpaceError
from shmvec._layout import Layout, Views, space_leaves

#: At most this many lease blocks...
MAX_BLOCKS = 8
#: ... and at most this many bytes in all of them, one block at least (the pages of a block are
#: reserved when it is first used).
MAX_BYTES = 1 << 30
#: zero_copy=None: on when one step's observations (all envs, all leaves) weigh at least this many bytes.
AUTO_MIN_BYTES = 32 << 10

_refs = sys.getrefcount


def obs_batch_bytes(space: spaces.Space, n_envs: int) -> int:
    """The bytes of one step's observations of ``n_envs`` envs, in buffers (leaves of a fixed size)."""
    return sum(n_envs * int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
               for leaf in space_leaves(space) if not leaf.pickled)


def lease_count(zero_copy: bool | None, space: spaces.Space, n_envs: int) -> int:
    """How many lease blocks the layout gets: 0 (off) or the bound.

    :param zero_copy: the option as :class:`shmvec._options.Options` resolved it: True, False, or
        None (on from :data:`AUTO_MIN_BYTES`).
    :raises SpaceError: ``zero_copy=True`` with observation leaves without a fixed size.
    """
    if zero_copy is False:
        return 0
    if any(leaf.pickled for leaf in space_leaves(space)):
        if zero_copy:
            raise SpaceError(f"zero_copy=True cannot apply to the observation space {space}: it has leaves "
                             "without a fixed size (Text, Sequence, Graph, ...), which travel pickled. Leave "
                             "zero_copy at None (its default).")
        return 0
    nbytes = obs_batch_bytes(space, n_envs)
    if nbytes == 0 or (zero_copy is None and nbytes < AUTO_MIN_BYTES):
        return 0
    return max(1, min(MAX_BLOCKS, MAX_BYTES // nbytes))


class Leases:
    """The lease blocks of one engine, on the parent's side (see the module docstring).

    :param layout: the block's layout (``obs_blocks`` > 0).
    :param views: the parent's arrays over it.
    :param fd: the segment's descriptor, to reserve a block's pages when it is first used.
    :param top_dict: the type of a ``Dict`` observation batch (SB3: ``OrderedDict``).
    """

    def __init__(self, layout: Layout, views: Views, fd: int, top_dict: type) -> None:
        self.spans = layout.lease_spans
        self.fd = fd
        space = layout.observation_space
        # roots[b]: each leaf's F in lease block b (index 0: none, block 0 is never leased); the
        # shaped arrays R over them stay the parent's own: the caller gets a new view of each.
        self.roots: list[list[np.ndarray]] = [[]] + [[arr.base for arr in block.values()]
                                                     for block in views.obs_blocks[1:]]
        self.values: list[Callable[[], Any]] = [lambda: None] + [
            _value_of(space, block, top_dict) for block in views.obs_blocks[1:]]
        self.grown = 0  # lease blocks whose pages are reserved: 1..grown are in use
        self.bound = len(self.spans)  # lowered when /dev/shm has no room for the next one
        self.block = 0  # where the last STEP or RESET wrote its observations
        self.previous = 0  # where the one before did
        # Each block's pages, [lo, hi) page-aligned (the fork hook makes them private in a child).
        self.pages = [(0, 0)] + [_pages(arrays) for arrays in self.roots[1:]]
        # Each root's reference count when only the parent holds it, read as free() reads it.
        self.base = [[_refs(arrays[k]) for k in range(len(arrays))] for arrays in self.roots]
        _LIVE.add(self)

    def free(self, b: int) -> bool:
        """Whether the caller holds nothing of lease block ``b``."""
        roots, base = self.roots[b], self.base[b]
        for k in range(len(roots)):
            if _refs(roots[k]) != base[k]:
                return False
        return True

    def pick(self, cmd: int, words: Any) -> None:
        """Before a post: chooses the block ``cmd``'s observations go to and stores it into OBS_BLOCK."""
        b = 0
        if cmd == P.Cmd.STEP or cmd == P.Cmd.RESET:  # (a partial reset too: its workers write every env)
            b = self._lowest_free()
            self.previous, self.block = self.block, b  # (previous: the post may fail before any worker has it)
        words.store(P.OBS_BLOCK, b)

    def _lowest_free(self) -> int:
        free = self.free
        for b in range(1, self.grown + 1):
            if free(b):
                return b
        if self.grown < self.bound and self._reserve(self.grown + 1):
            self.grown += 1
            return self.grown
        return 0

    def _reserve(self, b: int) -> bool:
        offset, nbytes = self.spans[b - 1]
        try:
            os.posix_fallocate(self.fd, offset, nbytes)
        except OSError:  # ENOSPC: /dev/shm is full; copy from now on
            self.bound = self.grown
            return False
        return True

    def value(self) -> Any:
        """The observations of the last STEP or RESET from its lease block (None: block 0, the caller copies)."""
        return self.values[self.block]()

    def release(self) -> None:
        """Drops the roots (before the mapping is closed); a block an array still views after that
        is the caller's, and the fork hook keeps watching it (by a weak reference)."""
        _LIVE.discard(self)
        _RELEASED[:] = [(pages, refs) for pages, refs in _RELEASED if any(r() is not None for r in refs)]
        _RELEASED.extend((self.pages[b], [weakref.ref(root) for root in self.roots[b]])
                         for b in range(1, self.grown + 1))
        self.roots, self.values, self.block = [], [], 0

    def held_pages(self) -> list[tuple[int, int]]:
        """The pages of the blocks the caller holds now."""
        return [self.pages[b] for b in range(1, self.grown + 1) if not self.free(b)]


# ---- forks (module docstring, "Forks") ----------------------------------------------------------------
_LIVE: "weakref.WeakSet[Leases]" = weakref.WeakSet()  # the lease blocks of every open engine
# The pages of the blocks of closed engines, with a weak reference to each root: alive, an array of
# the caller's still views the block (and holds the mapping open).
_RELEASED: list[tuple[tuple[int, int], list[weakref.ref]]] = []
_STARTING: set[int] = set()  # the threads starting a vec env's own workers now
_SNAPSHOTS: dict[int, list[tuple[int, bytes]]] = {}  # forking thread -> (address, bytes) of the held pages
_PAGE = mmap.PAGESIZE
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)  # (Linux, macOS)


def _pages(roots: list[np.ndarray]) -> tuple[int, int]:
    """The pages [lo, hi) of one lease block (its roots' memory, rounded out to whole pages)."""
    lo = min(root.__array_interface__["data"][0] for root in roots)
    hi = max(root.__array_interface__["data"][0] + root.nbytes for root in roots)
    return lo // _PAGE * _PAGE, -(-hi // _PAGE) * _PAGE


@contextlib.contextmanager
def starting_workers() -> Iterator[None]:
    """Around the start of a vec env's own workers: a worker forked there holds no observation,
    and the fork hook leaves its copy of the parent's mapping as it is (no copy of held blocks)."""
    me = threading.get_ident()
    _STARTING.add(me)
    try:
        yield
    finally:
        _STARTING.discard(me)


def _held_pages() -> list[tuple[int, int]]:
    """The pages [lo, hi) of every block the caller holds, overlaps merged."""
    pages = [p for leases in list(_LIVE) for p in leases.held_pages()]
    pages += [p for p, refs in _RELEASED if any(r() is not None for r in refs)]
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(pages):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _snapshot_before_fork() -> None:
    """In the parent, just before a fork: copies the held blocks' pages for the child."""
    me = threading.get_ident()
    if me not in _STARTING:  # (a vec env's own worker: it holds nothing)
        _SNAPSHOTS[me] = [(lo, ctypes.string_at(lo, hi - lo)) for lo, hi in _held_pages()]


def _drop_snapshot() -> None:
    _SNAPSHOTS.pop(threading.get_ident(), None)


def _unshare_after_fork() -> None:
    """In the child: the pages of every block held at the fork become its own, holding what they
    held then, at the same address (module docstring, "Forks")."""
    taken = _SNAPSHOTS.pop(threading.get_ident(), [])  # (the forking thread: the same ident in the child)
    _SNAPSHOTS.clear()
    _LIVE.clear()  # the child's copies: no engine of the parent hands out a block here
    _RELEASED.clear()
    for lo, data in taken:
        _unshare(lo, data)


def _unshare(address: int, data: bytes) -> None:
    """Replaces the mapped pages at ``address`` (page-aligned) with private memory holding ``data``."""
    nbytes = len(data)
    got = _mmap(address, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
    if got != address:
        err = ctypes.get_errno()
        raise OSError(err, f"shmvec: could not make a held observation block private in a forked child "
                           f"({os.strerror(err)}): the parent's next steps may change it")
    ctypes.memmove(address, data, nbytes)


_mmap = ctypes.CDLL(None, use_errno=True).mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_snapshot_before_fork, after_in_parent=_drop_snapshot,
                        after_in_child=_unshare_after_fork)


def _value_of(space: spaces.Space, block: dict, top_dict: type) -> Callable[[], Any]:
    """What hands out lease block ``block`` (``{path: R}``): a new view of each leaf's array (its
    base is the leaf's ``F``, which the reference counts watch), in a fresh dict or tuple for
    ``Dict`` and ``Tuple`` spaces."""
    return _build(space, (), block, top_dict)


def _build(space: spaces.Space, path: tuple, block: dict, top_dict: type) -> Callable[[], Any]:
    # Module-level recursion: a nested function calling itself would form a reference cycle
    # holding the roots (and the mapping) until the garbage collector runs.
    kids = children(space)
    if kids is not None:  # a container (shmvec._containers): its value, built of its children's
        items = [_build(s, path + (key,), block, dict) for key, s in kids]
        build = assembler(space, top_dict)
        return lambda: build([f() for f in items])
    root = block[path]
    return lambda: root[...]  # a new view each time: what the caller does to it stays its own
