"""What a worker is started with and what it attaches to: typed records that cross the process line.

Not to be confused with :mod:`shmvec._startup` (a tool that times start-up).  Three records, each
built by one function of the parent (:class:`shmvec._workers.WorkerSet`) and read by the worker
(:mod:`shmvec._worker`):

- :class:`WorkerStart`: a worker process's arguments, the target's ``args`` beside its two pipe
  ends; built by ``WorkerSet.worker_start`` for a first start and for a restart alike;
- :class:`BlockSizes`: everything a :class:`shmvec._layout.Layout` is built from besides the
  spaces.  The parent builds its layout with :meth:`BlockSizes.layout` from its spaces, each
  worker with the same call from its own env's spaces, so both lay out the same block; the
  pool's worker side reads the actions through the worker's layout (:mod:`shmvec._pool`), never
  a layout of its own;
- :class:`Attach`: the payload of the ATTACH and ATTACH_FD messages (protocol, "Start-up" in
  :mod:`shmvec._protocol`): the block's name (None for ATTACH_FD: a restarted worker maps the
  block from the descriptor that follows, its name being unlinked), its sizes and whether masks
  are written from the start; built by ``WorkerSet.send_attach``, for the start-up handshake and
  for a restart.

Frozen dataclasses of plain values: they pickle under every start method, and a worker that
reads a field the parent did not set fails at start-up, not at the first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shmvec import _protocol as P
from shmvec._layout import Layout

if TYPE_CHECKING:
    from gymnasium import spaces

__all__ = ["WorkerStart", "BlockSizes", "Attach"]


@dataclass(frozen=True)
class WorkerStart:
    """A worker process's start-up arguments (its pipes travel beside it: see ``worker_main``)."""

    index: int  # the worker's number, w
    env_range: range  # its slice of the env indices
    env_fns: bytes  # its slice's factories, cloudpickled (kept by the parent to restart it)
    parent_pid: int  # watched by the worker: it exits when the parent is gone
    threads: int | None  # worker_threads: the cap of its envs' thread pools (None: no cap)
    spin: float  # worker_spin_s: the spin budget of its waits on the control words
    affinity: frozenset[int] | None = None  # the CPUs it is pinned to (cpu_affinity), set before any env is built
    autoreset: str = P.AUTORESET_SAME_STEP  # one of _protocol.AUTORESET_MODES
    registrations: bytes | None = None  # the parent's env registrations it may lack (shmvec._registrations)
    public_name: str = "ShmVecEnv"  # the class the user called, named in errors


@dataclass(frozen=True)
class BlockSizes:
    """The sizes the shared block is laid out from, besides the spaces (see the module docstring)."""

    n_envs: int
    n_workers: int
    mailbox_bytes: int
    mask_size: int = 0  # flat size of one env's action mask; 0: no mask buffer
    obs_blocks: int = 0  # lease blocks of zero_copy (shmvec._leases); 0: none

    def layout(self, observation_space: spaces.Space, action_space: spaces.Space) -> Layout:
        """The block's layout for these spaces: the one way the parent and the workers build it."""
        return Layout(observation_space, action_space, self.n_envs, self.n_workers, self.mailbox_bytes,
                      self.mask_size, self.obs_blocks)


@dataclass(frozen=True)
class Attach:
    """The ATTACH / ATTACH_FD payload (see the module docstring)."""

    shm_name: str | None  # None: ATTACH_FD, the block's descriptor follows on the pipe
    sizes: BlockSizes
    masks_live: bool  # write action masks after every step and reset from the start
