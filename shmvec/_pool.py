"""The asynchronous env pool's shared memory and its worker side.

The pool runs on the engine of :class:`shmvec.ShmVecEnv` (same workers, same
observation/action/reward buffers, same command protocol; a worker's :class:`PoolServer` reads
and writes them through the worker's own views of the block, laid out from the same record as the
parent's: :mod:`shmvec._startup_args`) plus one more shared-memory segment, laid out by
:class:`PoolLayout`::

    out queue       IndexQueue (csrc/shmvec_queue.h): every worker pushes the
                    index of each env it finished stepping; the parent pops
    in queue w      IndexQueue per worker: the parent pushes the local index of
                    each env of worker w it sent an action to; worker w pops
    info lengths    uint32 (n_envs,): bytes of env i's info message, 0 if none
    info slots      n_envs x info_bytes: env i's info message: the info codec of
                    shmvec._codec (encode_infos), or a pickle when the codec does not
                    carry one of its values or the pickle is what fits; the parent
                    tells them apart by the first byte (load_result)
    finished at     float64 (n_envs,): CLOCK_MONOTONIC (time.monotonic(), the same
                    clock in every process) when env i's latest step ended

Who writes what, in which order
-------------------------------
The parent posts the synchronous command POOL (protocol of :mod:`shmvec._protocol`):
every worker enters :meth:`PoolServer.run` and stays there until it pops STOP.

  parent  1. send(): writes env i's action row; marks i in flight;
             pushes i - start_w into in queue w (release: the action is visible
             to the worker that pops it)
  worker  2. pops j (acquire); steps env i = start_w + j; writes row i of the
             observations (and terminal observations), rewards, terminated,
             truncated, and its info slot and info length
             and the time it finished (finished at)
          3. pushes i into the out queue (release: step 2 is visible to the parent
             that pops i)
  parent  4. recv(): waits until batch_size indices are published (woken once,
             by the push that completes the batch), pops them (acquire); reads
             their rows; unmarks them.  It never writes a row of an env in flight, and a worker only
             writes rows of envs it popped and has not pushed back yet.

The timeout (``timeout=``) bounds each env's step from its send(): the parent notes when it
sends each env (:class:`SendClock`, before the push of step 1) and, every POLL_S of a recv()
(also one that other workers keep fed), looks for envs in flight that were sent more than
``timeout`` ago and have not finished since (finished at < sent at).  An env that finished and
waits in the out queue for a recv() is not late, however long the caller takes; one queued
behind a hung env is (its worker never takes it).  The parent reads "finished at" without
popping: a plain load that may miss a store made in the same instant, so a step that ends just
at its deadline may be reported late, never a step that ended well before it.

Stopping: the parent pushes STOP into every in queue; each worker, having
finished everything queued before it, returns from POOL and completes the
command (PENDING, protocol step 6).  Rare commands, reset and close run with
the pool stopped; results already in the out queue stay there.

Failures: an env that raises makes its worker push ERROR_BIT | w into the out
queue (so a parent waiting in recv() wakes up) and leave POOL with STATUS=ERROR;
the parent stops the pool and re-raises the exception through the usual path.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmvec import _protocol as P
from shmvec._codec import encode_infos
from shmvec._layout import ALIGN, make_gather
from shmvec._pickling import dumps
from shmvec._queue import IndexQueue, QUEUE_MAX_VALUE, queue_bytes, queue_capacity_for

STOP = QUEUE_MAX_VALUE
ERROR_BIT = 1 << 31
DEFAULT_INFO_BYTES = 4096


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class PoolLayout:
    """Offsets in the pool segment; computed identically by the parent and the workers."""

    def __init__(self, slices: list[range], info_bytes: int) -> None:
        n_envs = slices[-1].stop
        self.info_bytes = info_bytes
        self.out_capacity = queue_capacity_for(n_envs + len(slices) + 1)
        self.in_capacity = [queue_capacity_for(len(sl) + 2) for sl in slices]
        offset = 0
        self.out_offset = offset
        offset = _align(offset + queue_bytes(self.out_capacity))
        self.in_offsets = []
        for cap in self.in_capacity:
            self.in_offsets.append(offset)
            offset = _align(offset + queue_bytes(cap))
        self.len_offset = offset
        offset = _align(offset + 4 * n_envs)
        self.info_offset = offset
        offset = _align(offset + info_bytes * n_envs)
        self.finished_offset = offset
        offset = _align(offset + 8 * n_envs)
        self.n_envs = n_envs
        self.nbytes = max(offset, ALIGN)

    def info_views(self, buf: memoryview) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.frombuffer(buf, dtype=np.uint32, count=self.n_envs, offset=self.len_offset)
        slots = np.frombuffer(buf, dtype=np.uint8, count=self.n_envs * self.info_bytes,
                              offset=self.info_offset).reshape(self.n_envs, self.info_bytes)
        return lengths, slots

    def finished_view(self, buf: memoryview) -> np.ndarray:
        """When each env's latest step ended (time.monotonic(); 0: never)."""
        return np.frombuffer(buf, dtype=np.float64, count=self.n_envs, offset=self.finished_offset)


class SendClock:
    """The parent's side of ``timeout=``: when each env was last sent, and which are late (see
    the module docstring).  Only a pool with a timeout has one: without, send() reads no clock."""

    def __init__(self, n_envs: int, timeout: float, finished_at: np.ndarray) -> None:
        self.timeout = timeout
        self.sent_at = np.full(n_envs, np.inf)  # inf: not with a worker (never sent, or reset)
        self.finished_at: np.ndarray | None = finished_at

    def sent(self, ids: np.ndarray) -> None:
        """Envs ``ids`` are about to be pushed to their workers (stamped first: a worker may
        finish one before the push returns)."""
        self.sent_at[ids] = time.monotonic()

    def forget(self) -> None:
        """No env is with a worker (async_reset puts every env in the out queue itself)."""
        self.sent_at[:] = np.inf

    def late(self, in_flight: np.ndarray, now: float) -> tuple[list[int], float]:
        """The envs in flight sent more than ``timeout`` before ``now`` that have not finished
        since, and how long ago the first of them was sent."""
        assert self.finished_at is not None
        sent_at = self.sent_at
        late = np.flatnonzero(in_flight & (sent_at <= now - self.timeout) & (self.finished_at < sent_at))
        if late.size == 0:
            return [], 0.0
        return late.tolist(), float(now - sent_at[late].min())

    def release(self) -> None:
        self.finished_at = None  # a view of the pool segment


class InfoTooLargeError(ValueError):
    """An env's info does not fit the pool's per-env slot (``info_bytes``), encoded or pickled."""


class PoolServer:
    """Worker side of the pool: steps single envs as their indices arrive (see the module docstring)."""

    def __init__(self, worker: Any, shm_name: str, slices: list[range], info_bytes: int, spin: float) -> None:
        from multiprocessing.shared_memory import SharedMemory

        self.worker = worker
        # An idle pool worker spins at most POOL_SPIN_S on every empty pop (its spin is not
        # adaptive): the longer budget of the synchronous step loop is for a policy's forward
        # pass between steps, which a pool worker does not wait for as a whole.
        self.spin = min(spin, P.POOL_SPIN_S)
        self.layout = layout = PoolLayout(slices, info_bytes)
        self.shm = SharedMemory(name=shm_name)
        buf = self.shm.buf
        w = worker.index
        self.out_q = IndexQueue(buf, layout.out_offset, layout.out_capacity, False)
        self.in_q = IndexQueue(buf, layout.in_offsets[w], layout.in_capacity[w], False)
        self.info_len, self.info_slots = layout.info_views(buf)
        self.finished_at = layout.finished_view(buf)
        # The actions through the worker's own views of the block (laid out from the Attach record
        # of shmvec._startup_args, like the parent's): the pool lays out no block of its own.
        self.read_action = make_gather(worker.envs[0].action_space, worker.views.act, copy=True)

    def detach(self) -> None:
        self.read_action = None  # type: ignore[assignment]
        self.info_len = self.info_slots = self.finished_at = None  # type: ignore[assignment]
        for q in (self.out_q, self.in_q):
            q.release()
        self.shm.close()

    def run(self, seq: int | None = None) -> list:
        """The POOL command (posted as ``seq``): serve env indices until STOP.  Returns no items
        (infos go to the slots).

        Also returns once another command is posted (checked when a pop times out): a pool that
        was never closed is released by the engine's finalizer (interpreter exit, the garbage
        collector), which posts CLOSE and pushes no STOP; without this check the worker served on
        until SIGTERM, 5 s later, and its envs were never closed.
        """
        worker = self.worker
        in_q, out_q = self.in_q, self.out_q
        start = worker.start
        step = self._step_same if worker.autoreset == P.AUTORESET_SAME_STEP else self._step_next
        words, seq_word = worker.words, P.word(worker.index, P.CMD_SEQ)
        env_at = P.word(worker.index, P.ENV_AT)  # envs come in any order: stored before each (_protocol)
        finished_at, now = self.finished_at, time.monotonic
        while True:
            j = in_q.pop(P.PARENT_POLL_S, self.spin)
            if j is None:
                if not worker.parent.alive():
                    return []
                if seq is not None and words.load(seq_word) != seq:
                    return []
                continue
            if j == STOP:
                return []
            i = start + j
            words.store(env_at, i)
            try:
                step(j, i)
            except BaseException:
                worker.current = i
                out_q.push(ERROR_BIT | worker.index, True)  # urgent: wakes a waiting recv()
                raise
            finished_at[i] = now()
            out_q.push(i)

    def _put_info(self, i: int, info: Any) -> None:
        if not info:
            self.info_len[i] = 0
            return
        slot = self.info_slots[i]
        n = encode_infos(info, slot)  # -1: a value the codec does not carry; -2: no room
        if n > 0:
            self.info_len[i] = n
            return
        data = dumps(info)  # smaller than the codec's message: its memo shares keys
        n = len(data)
        if n > self.layout.info_bytes:
            raise InfoTooLargeError(
                f"the info of env {i} takes {n} bytes, more than the pool's info_bytes={self.layout.info_bytes}: "
                "pass a larger info_bytes to the pool"
            )
        slot[:n] = np.frombuffer(data, dtype=np.uint8)
        self.info_len[i] = n

    def _step_next(self, j: int, i: int) -> None:
        worker = self.worker
        env = worker.envs[j]
        if worker.finished[j]:
            obs, info = env.reset()
            rew, term, trunc = 0.0, False, False
        else:
            obs, rew, term, trunc, info = env.step(self.read_action(i))
        worker.finished[j] = bool(term or trunc)
        worker.write_obs(i, obs)
        worker.rew[i] = rew
        worker.terminated[i] = term
        worker.truncated[i] = trunc
        self._put_info(i, info)

    def _step_same(self, j: int, i: int) -> None:
        worker = self.worker
        env = worker.envs[j]
        obs, rew, term, trunc, info = env.step(self.read_action(i))
        reset_info = None
        if term or trunc:
            worker.write_term(i, obs)
            obs, reset_info = env.reset()
        worker.write_obs(i, obs)
        worker.rew[i] = rew
        worker.terminated[i] = term
        worker.truncated[i] = trunc
        self._put_info(i, (info, reset_info) if (info or reset_info) else None)
