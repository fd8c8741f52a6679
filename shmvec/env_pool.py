"""ShmEnvPool: an EnvPool-style asynchronous pool of Python envs, on the engine every face holds.

``num_envs`` envs, of which ``batch_size`` come back at a time::

    pool = ShmEnvPool(env_fns, batch_size=16)          # num_envs = len(env_fns), e.g. 64
    obs, infos = pool.reset(seed=0)                    # the first batch_size envs to be ready
    while True:
        actions = policy(obs)
        pool.send(actions, infos["env_id"])            # they step in the workers...
        obs, rew, term, trunc, infos = pool.recv()     # ...the first batch_size to finish come back

Slow envs no longer hold back fast ones, and the learner overlaps with stepping (``send`` returns
at once).  Workers publish the index of each env they finished into a lock-free queue in shared
memory (``csrc/shmvec_queue.h``); ``recv`` waits until ``batch_size`` are there.  The protocol is
written down in :mod:`shmvec._pool`.
"""

from __future__ import annotations

import numbers
import os
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from shmvec import _pool
from shmvec import _protocol as P
from shmvec._codec import load_result
from shmvec._copyguard import Uncopyable
from shmvec._engine import Engine
from shmvec._errors import ShmVecEnvError, SpaceError, WorkerTimeoutError
from shmvec._frontend import (
    ENGINE_OPTIONS,
    InfoBatch,
    by_env_id,
    checked_send_ids,
    decided_of,
    env_render_mode,
    gym_engine,
    refuse_unknown_keywords,
    usable_engine,
)
from shmvec._layout import close_mapping
from shmvec._queue import IndexQueue, push_in_flight, release_in_flight
from shmvec._seeds import gym_vector_seeds, per_env_values
from shmvec._segment import create_segment
from shmvec._state import POOLING, serialized
from shmvec.factories import factory_list

_CLOSE_S = 5.0


class _PoolResources:
    """The pool segment and its queues; class-level defaults make ``release()`` safe half-built."""

    shm: SharedMemory | None = None
    queues: list = []
    views: Any = None
    unlinked = False
    released = False
    pid: int | None = None  # the process that created the segment: a forked child never unlinks it

    def unlink(self) -> None:
        if self.shm is not None and not self.unlinked and os.getpid() == self.pid:
            self.unlinked = True
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        for q in self.queues:
            q.release()
        self.queues = []
        self.views = None
        if self.shm is not None:
            self.unlink()
            close_mapping(self.shm)


def check_late(engine: Engine, clock: _pool.SendClock | None, in_flight: np.ndarray, now: float) -> None:
    """:raises WorkerTimeoutError: an env in flight was sent more than ``timeout=`` before ``now``
    and has not finished its step (``clock`` None: the pool has no timeout)."""
    if clock is None:
        return
    late, age = clock.late(in_flight, now)
    if not late:
        return
    busy = sorted({engine.owner[i] for i in late})
    at = []
    where, stacks = engine.stuck(busy)
    for w, stepping in zip(busy, where):
        queued = [i for i in late if engine.owner[i] == w and i != stepping]
        at.append(f"; worker {w}" + ("" if stepping is None else f", in env {stepping}")
                  + (f" ({_named(queued)} queued behind it)" if queued and stepping is not None else ""))
    one = len(late) == 1
    raise engine.record(WorkerTimeoutError(
        f"pool recv: the step{'' if one else 's'} of {_named(late)} did not finish within {clock.timeout:g} s "
        f"of {'its' if one else 'their'} send() ({'sent' if one else 'the first sent'} {age:.1f} s ago){''.join(at)}. "
        + ("Where each was is shown above (faulthandler). " if stacks else "")
        + "An env may hang: call close() (it terminates the workers) and build a new pool, with a larger "
        "timeout= if the env is only slow."
    ), cause=stacks)


def _named(envs: list[int]) -> str:
    return f"env {envs[0]}" if len(envs) == 1 else "envs " + ", ".join(map(str, envs))


def no_pickled_leaves(engine: Engine) -> SpaceError:
    return SpaceError(
        f"the pools (ShmEnvPool, ShmVecEnvPool) hold every observation and action in shared memory, and "
        f"these envs' spaces have leaves without a fixed size (observation_space {engine.observation_space}, "
        f"action_space {engine.action_space}): step them with ShmVectorEnv (Gymnasium) or ShmVecEnv (SB3), "
        "which send such leaves pickled.")


class ShmEnvPool(Uncopyable):
    """An asynchronous pool: ``send(actions, env_ids)`` then ``recv()`` the first ``batch_size`` envs done.

    Returns Gymnasium-style batches: ``(obs, rewards, terminated, truncated, infos)`` with one row
    per returned env, and ``infos["env_id"]`` (int64) naming the env of each row, in the order they
    finished.  Other infos are a dict of arrays with ``_key`` masks (Gymnasium's ``_add_info``).

    Autoreset: ``NEXT_STEP`` (default, as EnvPool) -- an env that ended is reset on its next
    ``send`` (its action is ignored, reward 0, flags False); or ``SAME_STEP`` -- reset at once,
    ``infos["final_obs"]``/``infos["final_info"]`` carry the episode's end.

    :param env_fns: callables that each build a new ``gymnasium.Env``.
    :param batch_size: envs per ``recv`` (default ``num_envs``: synchronous).  At least
        ``batch_size`` envs must be in flight when ``recv`` is called.
    :param autoreset_mode: ``AutoresetMode.NEXT_STEP`` or ``SAME_STEP``.
    :param info_bytes: room per env for its info message (a larger info raises in the worker).
    :param timeout: seconds each env's step may take from its ``send`` (WorkerTimeoutError past it).
    :param n_workers, start_method, worker_threads, spin_us: as for :class:`shmvec.ShmVecEnv`; so are
        further keyword arguments (``envs_per_worker``, ``cpu_affinity``, ``preload``, ...).

    :raises ValueError: a bad ``batch_size`` or autoreset mode.
    """

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    _engine: Engine | None = None
    # Gymnasium's batched infos in recv(); False (the SB3 face, shmvec.vec_env_pool, which reads
    # row_infos) batches only the final observations: no batching error for arrays of uneven length.
    batch_infos = True
    _pres: _PoolResources | None = None
    _out_q: IndexQueue | None = None
    _in_qs: list = []
    _clock: _pool.SendClock | None = None  # with timeout=: when each env was sent (the timeout's check)
    closed = True
    _alive_at = 0.0  # when recv() last checked that the workers are alive

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        batch_size: int | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        info_bytes: int = _pool.DEFAULT_INFO_BYTES,
        n_workers: int | None = None,
        start_method: str | None = None,
        worker_threads: int | None = 1,
        timeout: float | None = None,
        spin_us: float | tuple[float, float] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        env_fns = factory_list(env_fns, type(self).__name__, batch_size)
        # (Results are always copies: no copy=, no zero_copy=.)
        refuse_unknown_keywords(type(self), engine_kwargs, ENGINE_OPTIONS - {"copy", "zero_copy"})
        mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"ShmEnvPool supports NEXT_STEP and SAME_STEP autoreset, not {mode}")
        self.autoreset_mode = mode
        if isinstance(info_bytes, bool) or not isinstance(info_bytes, numbers.Integral) or info_bytes < 1:
            raise ValueError(f"info_bytes must be a positive number of bytes, got {info_bytes!r}")
        batch_size = len(env_fns) if batch_size is None else int(batch_size)
        if not 1 <= batch_size <= len(env_fns):
            raise ValueError(f"batch_size must be in [1, {len(env_fns)}] for {len(env_fns)} envs, got {batch_size}")
        self.batch_size = batch_size
        worker_mode = P.AUTORESET_NEXT_STEP if mode == AutoresetMode.NEXT_STEP else P.AUTORESET_SAME_STEP
        self._engine = engine = gym_engine(
            env_fns, worker_mode, type(self).__name__, n_workers=n_workers, start_method=start_method, copy=True,
            worker_threads=worker_threads, timeout=timeout, spin_us=spin_us, **engine_kwargs,
        )
        self.closed = False
        try:
            self._attach_pool(engine, info_bytes)
        except BaseException:
            self.close()
            raise
        self.num_envs = engine.num_envs
        self.n_workers = engine.n_workers
        self.single_observation_space = engine.observation_space
        self.single_action_space = engine.action_space
        self.observation_space = batch_space(self.single_observation_space, batch_size)
        self.action_space = batch_space(self.single_action_space, batch_size)
        self.metadata = dict(engine.metadata)
        self.metadata["autoreset_mode"] = mode
        self.render_mode = env_render_mode(engine)
        self._in_flight = np.zeros(self.num_envs, dtype=np.bool_)
        self._pending_infos: dict[int, Any] = {}
        self._partial: list[int] = []
        self._starts = [sl.start for sl in engine.slices]
        # For push_in_flight (send): the same flags as bytes, each env's worker and first env.
        self._in_flight_u8 = self._in_flight.view(np.uint8)
        self._owner = np.asarray(engine.owner, dtype=np.int64)
        self._starts_i64 = np.asarray(self._starts, dtype=np.int64)
        self._spin = engine.options.parent_spin_s
        self._infos = InfoBatch(batch_size)

    def _attach_pool(self, engine: Engine, info_bytes: int) -> None:
        if not engine.fixed_size:
            raise no_pickled_leaves(engine)
        layout = self._pool_layout = _pool.PoolLayout(engine.slices, info_bytes)
        pres = self._pres = _PoolResources()
        pres.pid = os.getpid()
        self._pool_finalizer = weakref.finalize(self, pres.release)
        # Its pages reserved, as the engine's block: a nearly full /dev/shm raises here, not SIGBUS.
        pres.shm = create_segment(layout.nbytes, what="the pool's queues and info slots")
        buf = pres.shm.buf
        out_q = IndexQueue(buf, layout.out_offset, layout.out_capacity, True)
        in_qs = [IndexQueue(buf, off, cap, True) for off, cap in zip(layout.in_offsets, layout.in_capacity)]
        pres.queues = [out_q, *in_qs]
        self._out_q, self._in_qs = out_q, in_qs
        self._info_len, self._info_slots = layout.info_views(buf)
        if engine.timeout is not None:
            self._clock = _pool.SendClock(engine.num_envs, engine.timeout, layout.finished_view(buf))
        pres.views = (self._info_len, self._info_slots)
        targets = [sl.start for sl in engine.slices]  # one env per worker: each attaches once
        engine.call(P.Call.POOL_ATTACH, targets, (pres.shm.name, engine.slices, info_bytes, engine.options.worker_spin_s))
        pres.unlink()
        self._obs_rows = engine.obs_view
        self._term_obs = engine.term_obs

    # ---- the pool ---------------------------------------------------------------------------------------
    @serialized
    def async_reset(self, seed: int | list[int | None] | None = None,
                    options: dict[str, Any] | list[dict[str, Any] | None] | None = None) -> None:
        """Resets every env (all in flight afterwards); ``recv`` returns them ``batch_size`` at a time.

        Whatever was in flight or waiting to be received is dropped.

        :param seed: None, an int (env i gets ``seed + i``), or one seed (or None) per env.
        :param options: passed to every env's ``reset``; or a list of one dict (or None) per env.
        """
        engine = self._usable()
        seeds = gym_vector_seeds(seed, self.num_envs)
        per_env = per_env_values(options, self.num_envs, "options")
        self._stop()
        while self._out_q.try_pop() is not None:  # results nobody will receive
            pass
        self._partial = []
        self._in_flight[:] = False
        if self._clock is not None:
            self._clock.forget()
        results = engine.reset(seeds, per_env)
        self._pending_infos = {}
        for items in results:
            for i, info in items:
                self._pending_infos[i] = info
        engine.rewards[:] = 0.0  # (no local of the views: see _rows)
        engine.terminated[:] = False
        engine.truncated[:] = False
        self._info_len[:] = 0
        try:
            # Every env is ready to be received; interrupted (Ctrl-C) part way, none is, so
            # that recv() says to reset again instead of waiting for envs nobody stepped.
            self._in_flight[:] = True
            self._out_q.push_many(np.arange(self.num_envs, dtype=np.uint32))
            self._start()
        except BaseException:
            while self._out_q.try_pop() is not None:
                pass
            self._in_flight[:] = False
            raise

    def reset(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """``async_reset`` then ``recv``: the first ``batch_size`` envs (rewards 0, flags False, reset infos)."""
        self.async_reset(seed=seed, options=options)
        obs, _, _, _, infos = self.recv()
        return obs, infos

    @serialized
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Starts stepping env ``env_ids[k]`` with ``actions[k]``; returns at once.

        :param env_ids: distinct env indices, none of them in flight (default: all envs, then
            ``actions`` has ``num_envs`` rows).
        :raises ValueError: bad ids (out of range, repeated, already in flight) or actions.
        """
        engine = self._usable()
        if engine.state is not POOLING:
            raise ShmVecEnvError("send() before reset(): call reset() or async_reset() first")
        ids = checked_send_ids(env_ids, self.num_envs, self._in_flight)
        # Checked as ShmVecEnv checks its actions (shmvec._actions.ActionWriter.write_rows), an
        # invalid one named by its env id.
        engine.write_rows(actions, ids, "env ids", by_env_id)
        if self._clock is not None:
            self._clock.sent(ids)
        # Marked and pushed in one C call: a Ctrl-C lands before (nothing sent) or after (all sent).
        push_in_flight(self._in_qs, self._in_flight_u8, ids, self._owner, self._starts_i64)

    @serialized
    def recv(self):
        """Waits for the next ``batch_size`` envs to finish; returns (obs, rewards, terminated, truncated, infos).

        :raises ShmVecEnvError: fewer than ``batch_size`` envs are in flight (it would wait forever).
        :raises WorkerDiedError, WorkerTimeoutError: a worker died, or an env's step outlasted
            ``timeout`` from its send(); the original exception type if an env raised.
        """
        result = self._recv_held()
        self._release_received()
        return result

    def _release_received(self) -> None:
        """The envs of the batch ``_recv_held`` returned are no longer in flight (they can be sent)."""
        release_in_flight(self._in_flight_u8, self._partial)  # and empties _partial, in one C call

    def _recv_held(self, order: list[int] | None = None):
        """``recv()``'s batch, its envs still in flight until ``_release_received()``: called
        again before that (a Ctrl-C landed as it returned), it returns the same batch.

        ``order`` (``step_envs``): the batch is exactly these envs, the only ones in flight; their
        rows come back in this order."""
        engine = self._usable()
        now = time.monotonic()
        if now - self._alive_at >= P.POLL_S:
            # Every POLL_S at most, not only when a wait comes back empty: other workers that keep
            # the pool fed must not hide a dead or hung one (its envs would stay in flight for ever).
            self._alive_at = now
            engine.check_alive("pool recv")
            check_late(engine, self._clock, self._in_flight, now)
        n = self.batch_size if order is None else len(order)
        in_flight = int(self._in_flight.sum())
        if in_flight < n:
            raise ShmVecEnvError(
                f"recv() with {in_flight} envs in flight, fewer than batch_size={n}: send() actions first"
            )
        out_q = self._out_q
        ids = self._partial  # kept across calls: a recv() interrupted (Ctrl-C) loses no env
        error_bit = _pool.ERROR_BIT
        while len(ids) < n:
            # Popped and appended to ids in one C call: a Ctrl-C cannot lose an env between them.
            v = out_q.try_pop_to(ids, error_bit)
            if v is None and out_q.wait_count(n - len(ids), P.POLL_S, self._spin):
                v = out_q.try_pop_to(ids, error_bit)
                if v is None:  # published, but an earlier slot is still being filled
                    v = out_q.pop_to(ids, P.POLL_S, self._spin, error_bit)
            if v is None:
                engine.check_alive("pool recv")
                check_late(engine, self._clock, self._in_flight, time.monotonic())
                continue
            if v & _pool.ERROR_BIT:
                self._stop()  # raises the env's exception (and marks the engine broken)
                raise ShmVecEnvError(f"worker {v & ~_pool.ERROR_BIT} reported an error that it did not send")
        if order is not None:  # the same envs (only they were in flight), in the caller's order
            ids[:] = order
        return self._rows(engine, np.asarray(ids, dtype=np.int64))  # the envs are still _partial and in flight

    def step(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None):
        """``send`` then ``recv`` (EnvPool's ``step``): the first ``batch_size`` envs to finish,
        which need not be those sent; :meth:`step_envs` returns exactly those."""
        self.send(actions, env_ids)
        return self.recv()

    @serialized
    def step_envs(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None):
        """Steps exactly envs ``env_ids`` and waits for exactly those, whatever ``batch_size`` is
        (EnvPool's synchronous ``step``); returns their rows in the order of ``env_ids``.

        For callers that step a subset of the envs in lock step (Tianshou's collectors): no other
        env may be in flight, so the envs that come back are the ones sent.

        :param env_ids: distinct env indices (default: all envs).
        :raises ShmVecEnvError: other envs are in flight (sent, or reset by ``async_reset``, and not
            received yet): ``recv()`` them first.
        :raises ValueError: bad ids or actions, as :meth:`send`.
        """
        engine = self._usable()
        if engine.state is not POOLING:
            raise ShmVecEnvError("step_envs() before reset(): call reset() or async_reset() first")
        if self._in_flight.any():
            raise ShmVecEnvError(
                f"step_envs() with envs {np.flatnonzero(self._in_flight).tolist()} in flight: it waits for exactly the "
                "envs it sends, so recv() those first"
            )
        ids = checked_send_ids(env_ids, self.num_envs, self._in_flight)
        if ids.size == 0:
            raise ValueError("step_envs() needs at least one env id")
        engine.write_rows(actions, ids, "env ids", by_env_id)
        if self._clock is not None:
            self._clock.sent(ids)
        push_in_flight(self._in_qs, self._in_flight_u8, ids, self._owner, self._starts_i64)
        result = self._recv_held(ids.tolist())
        self._release_received()
        return result

    # ---- rare calls (the pool stops meanwhile; whatever is in flight completes first) ------------------
    @serialized
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or returns the attribute if it is not callable)."""
        return self._paused_call(P.Call.CALL, (name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    @serialized
    def set_attr(self, name: str, values: Any) -> None:
        """One value per env (a list or tuple of ``num_envs``), or the same value for all."""
        self._paused_call(P.Call.SET_WRAPPER_ATTR, (name, per_env_values(values, self.num_envs)))

    @serialized
    def render(self) -> tuple[Any, ...]:
        return self._paused_call(P.Call.RENDER, ())

    @serialized
    def decided(self) -> dict[str, Any]:
        """What the defaults became on this machine, and why, as ``ShmVectorEnv.decided``."""
        return decided_of(self)

    def close(self) -> None:
        """Stops the pool and the workers, frees both shared-memory segments.  Idempotent.

        From another thread: a thread waiting in ``recv()`` stops (ClosedVecEnvError), then this closes.
        """
        if self.closed:
            return
        engine = self._engine
        if engine is None:
            self._close()
            return
        with engine.closing():
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        engine, self._engine = self._engine, None
        try:
            if engine is not None:
                # The workers serve the pool (or did when it broke): STOP first.  Not in a child
                # of os.fork() (state FORKED): the workers and the queues are the parent's (its
                # pool would stop serving); engine.close() drops the child's mapping.
                if engine.serving_pool:
                    try:
                        self._stop_workers()  # workers still serving the pool then see CLOSE
                        if engine.failure is None:
                            engine.complete("pool", deadline_s=_CLOSE_S)
                    except BaseException:
                        pass  # close() below terminates what did not stop
                self._obs_rows = self._term_obs = None
                engine.close()
        finally:
            self._out_q = self._in_qs = None  # type: ignore[assignment]
            self._info_len = self._info_slots = None  # type: ignore[assignment]
            if self._clock is not None:
                self._clock.release()
            if self._pres is not None:
                self._pres.release()
                self._pool_finalizer.detach()

    def __enter__(self) -> "ShmEnvPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not self.closed:
            try:
                self.close()
            except Exception:
                pass

    # ---- internals --------------------------------------------------------------------------------------
    def _usable(self) -> Engine:
        return usable_engine(self)

    def _check_usable(self) -> None:
        """Raises ClosedVecEnvError or BrokenVecEnvError, as RayShmEnvPool's does."""
        usable_engine(self)

    def _start(self) -> None:
        engine = self._engine
        assert engine is not None
        # POOLING from before the post: interrupted after it, close() still stops the workers
        # (it sends STOP only to a pool being served; a worker serving the pool ignores CLOSE).
        engine.start_pool()

    def _stop_workers(self) -> None:
        for q in self._in_qs:
            q.push(_pool.STOP)

    def _stop(self) -> None:
        """Stops a running pool (state POOLING): STOP to every worker, then waits for them to leave
        it (state IDLE).  Interrupted (Ctrl-C) or failed half way, the engine is broken and close()
        still sends STOP (a second one to a worker is never read): ``Engine.stop_pool``."""
        engine = self._engine
        assert engine is not None
        if engine.state is POOLING:
            engine.stop_pool(self._stop_workers)

    def set_batch_infos(self, on: bool) -> None:
        """Whether recv() batches infos as Gymnasium does (False: only the final observations;
        each row's own dicts are in ``row_infos``)."""
        self.batch_infos = bool(on)

    def _paused_call(self, name: str, args: tuple, indices: list[int] | None = None) -> tuple[Any, ...]:
        engine = self._usable()
        running = engine.state is POOLING
        self._stop()
        try:
            return tuple(engine.call(name, indices, args))
        finally:
            if running and engine.failure is None:
                self._start()

    def _payload(self, i: int) -> Any:
        """Env i's message in its info slot (its infos for this row), or None."""
        n = int(self._info_len[i])
        return load_result(self._info_slots[i, :n]) if n else None

    def _rows(self, engine: Engine, idx: np.ndarray):
        # Fancy indexing: arrays of their own.  No local keeps a view of a shared segment past
        # its use: a traceback that keeps this frame (an info Gymnasium cannot batch raises in
        # ``add``) would keep the segment mapped after close().
        obs = self._obs_rows(idx)
        rewards = engine.rewards[idx]
        terminated = engine.terminated[idx]
        truncated = engine.truncated[idx]
        infos: dict[str, Any] = {}
        # step_envs() returns as many rows as it was given ids, not batch_size.
        add = (self._infos if idx.size == self.batch_size else InfoBatch(idx.size))._add_info
        same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        pending = self._pending_infos
        # Each row's own dicts, as its env returned them (step info, reset info), for the SB3
        # face (shmvec.vec_env_pool): Gymnasium's batching sizes an array from the first row
        # that has a key, so an int in one env truncates another's float.
        self.row_infos = row_infos = []
        if not self.batch_infos:  # only the final observations batched; infos are the rows' own
            add = _final_obs_only(add)
        payloads = [self._payload(i) for i in idx.tolist()]
        for k, (i, payload) in enumerate(zip(idx.tolist(), payloads)):
            reset_info = pending.get(i) if pending else None  # from async_reset; dropped below
            if same_step:
                info, step_reset_info = payload if payload is not None else ({}, None)
                if terminated[k] or truncated[k]:
                    row_infos.append((info or {}, step_reset_info or reset_info or {}))
                    infos = add(infos, {"final_obs": self._term_obs(i), "final_info": info or {}}, k)
                    info = step_reset_info
                else:
                    row_infos.append((info or {}, reset_info))
                if info:
                    infos = add(infos, info, k)
            else:
                row_infos.append((payload or {}, reset_info))
                if payload:
                    infos = add(infos, payload, k)
            if reset_info:
                infos = add(infos, reset_info, k)
        if pending:  # only now: an interrupted _rows leaves them for the recv() that retries
            for i in idx.tolist():
                pending.pop(i, None)
        infos["env_id"] = idx
        return obs, rewards, terminated, truncated, infos


def _final_obs_only(add: Any) -> Any:
    """Gymnasium's ``_add_info`` for the final observations alone (``batch_infos=False``)."""
    def add_final_obs(infos: dict, info: dict, k: int) -> dict:
        return add(infos, {"final_obs": info["final_obs"]}, k) if "final_obs" in info else infos
    return add_final_obs
