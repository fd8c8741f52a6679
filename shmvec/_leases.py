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

A partial reset (Gymnasium's ``reset_mask``) writes only the envs it resets; the others must show
their last observation: the parent copies the block holding it into block 0 and posts block 0.

Failures add nothing new: a step that fails leaves its block half written and the engine broken.
``close()`` drops the roots; blocks the caller still holds keep the mapping alive
(:func:`shmvec._layout.close_mapping`), its name long unlinked.

Off (block 0 only) with ``copy=False`` (the caller asked for the buffer itself), with
``on_failure="restart"`` (its truncation reports read and write the observations of block 0),
for observation leaves without a fixed size, in the pools and in ``ShmParallelEnv`` (unless
asked for: it reads the block written, then copies).  ``ShmMultiAgentVecEnv`` hands out its rows
as views of the lease block.  By default (``zero_copy=None``) it is on when one step's
observations weigh at least :data:`AUTO_MIN_BYTES`: below that a copy costs as much or less
(docs/design.md, "Observations
without the copy").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec import _protocol as P
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
        self.partial = False  # the next RESET writes only some envs (reset_mask)
        # Each root's reference count when only the parent holds it, read as free() reads it.
        self.base = [[_refs(arrays[k]) for k in range(len(arrays))] for arrays in self.roots]

    def free(self, b: int) -> bool:
        """Whether the caller holds nothing of lease block ``b``."""
        roots, base = self.roots[b], self.base[b]
        for k in range(len(roots)):
            if _refs(roots[k]) != base[k]:
                return False
        return True

    def pick(self, cmd: int, words: Any, views: Views) -> None:
        """Before a post: chooses the block ``cmd``'s observations go to and stores it into OBS_BLOCK."""
        b = 0
        if cmd == P.Cmd.STEP or (cmd == P.Cmd.RESET and not self.partial):
            b = self._lowest_free()
        elif cmd == P.Cmd.RESET:  # a partial reset: the envs it does not reset keep their last observation
            if self.block:
                for path, arr in views.obs_blocks[self.block].items():
                    np.copyto(views.obs[path], arr)
            self.partial = False
        if cmd == P.Cmd.STEP or cmd == P.Cmd.RESET:
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
        """Drops the roots (before the mapping is closed)."""
        self.roots, self.values, self.block = [], [], 0


def _value_of(space: spaces.Space, block: dict, top_dict: type) -> Callable[[], Any]:
    """What hands out lease block ``block`` (``{path: R}``): a new view of each leaf's array (its
    base is the leaf's ``F``, which the reference counts watch), in a fresh dict or tuple for
    ``Dict`` and ``Tuple`` spaces."""
    return _build(space, (), block, top_dict)


def _build(space: spaces.Space, path: tuple, block: dict, top_dict: type) -> Callable[[], Any]:
    # Module-level recursion: a nested function calling itself would form a reference cycle
    # holding the roots (and the mapping) until the garbage collector runs.
    if isinstance(space, spaces.Dict):
        parts = [(key, _build(s, path + (key,), block, dict)) for key, s in space.spaces.items()]
        return lambda: top_dict([(key, f()) for key, f in parts])
    if isinstance(space, spaces.Tuple):
        items = [_build(s, path + (k,), block, dict) for k, s in enumerate(space.spaces)]
        return lambda: tuple([f() for f in items])
    root = block[path]
    return lambda: root[...]  # a new view each time: what the caller does to it stays its own
