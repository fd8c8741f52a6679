"""The engine of ShmVecEnv: workers stepping slices of envs in shared memory, without SB3.

``VecCore`` is everything :class:`shmvec.ShmVecEnv` does.  It takes SB3's ``VecEnv`` API
from the class after it: ``ShmVecEnv(VecCore, VecEnv)`` (:mod:`shmvec.shm_vec_env`) is the SB3
face; the Gymnasium face and the pools (:mod:`shmvec.shm_vector_env`, :mod:`shmvec.env_pool`)
run ``VecCore`` over :class:`VecBase`, a stand-in for the few parts of SB3's ``VecEnv`` the
engine uses, so that they never import SB3 (and with it torch: about 1.2 s and 200 MB).

The protocol between this class and its workers is written down in
:mod:`shmvec._protocol`; the buffers are laid out by :mod:`shmvec._layout`.
"""

from __future__ import annotations

import collections
import math
import multiprocessing as mp
import numbers
import os
import pickle
import secrets
import select
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from copy import deepcopy
from multiprocessing import reduction, resource_tracker
from multiprocessing.connection import Connection, wait as mp_wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec import _crash
from shmvec import _masks
from shmvec import _protocol as P
from shmvec._actions import INVALID_ACTIONS, exact_integers, make_action_checks, make_fast_copies, rows_reshaped
from shmvec._core import Words, copy_actions, current_cpu, load_result, step_infos
from shmvec._errors import (
    AlreadyPendingCallError,
    BrokenVecEnvError,
    ClosedVecEnvError,
    FirstFailure,
    NoAsyncCallError,
    ShmVecEnvError,
    SpaceError,
    Uncopyable,
    WorkerDiedError,
    WorkerStacks,
    WorkerTimeoutError,
    broken_by,
    caused,
    describe_exitcode,
    unpack_exception,
)
from shmvec._layout import Layout, close_mapping, group_by_slice, make_gather, scalar_float_box, split_envs
from shmvec._recovery import Recovery
from shmvec import _describe, _machine, _pickling, _seeds
from shmvec import factories as F
from shmvec._machine import default_start_method, usable_cores as _cores  # noqa: F401 - shm_vec_env re-exports them
from shmvec._worker import worker_main

# SB3's type aliases (stable_baselines3.common.vec_env.base_vec_env), without importing SB3.
VecEnvIndices = Any  # None, an int or an iterable of ints
VecEnvObs = Any  # an array, or a dict or tuple of arrays
VecEnvStepReturn = tuple  # (obs, rewards, dones, infos)

_ERROR = int(P.Status.ERROR)
_STEP = int(P.Cmd.STEP)
_BROKEN_HINT = "The vec env cannot go on: call close() and build a new one."
_CALL_HINT = "The vec env is still usable."
_START_HINT = "The vec env was not built, and its workers were stopped: fix the cause and build it again."
# Starting a worker imports its modules and builds its envs: a step-sized timeout is too short.
_START_TIMEOUT_FLOOR_S = 60.0
# Bounds of close(): polite exit, then SIGTERM, then SIGKILL.
_CLOSE_JOIN_S = 5.0
_TERMINATE_JOIN_S = 1.0
# (parent, worker) microseconds of yielding spin before a wait sleeps on the futex.
# The parent spins only when a core is free for it (fewer workers than cores): with every
# core busy stepping envs, a spinning parent takes half of one from a worker.  On its own core
# it spins as long as the workers do: a parent asleep on an idle (virtual) core wakes up tens
# of microseconds late (1 worker, 8 CartPoles on 2 cores: 0.69x DummyVecEnv with 50 us of
# spin, 1.02x with 1000 us).  Workers spin adaptively up to their budget (_worker._Worker.serve):
# while the parent's gaps between steps stay under it.  5000 us covers a PPO policy's forward
# pass and SB3's bookkeeping at a few hundred envs (about 1.5 ms at 256 CartPoles); with 1000
# us the workers slept through that gap, and a worker woken on an idle virtual core started
# its step a few hundred microseconds late (bench/ppo_wallclock.py --n-envs 64 256 --spin-us 0
# 1000 against 0 5000, 2 alternating pairs: env step 0.41 s against 0.35 s at 256 envs, 1.16x
# and 1.21x against 1.43x and 1.30x DummyVecEnv; level at 64 envs).
DEFAULT_WORKER_SPIN_US = 5000.0
DEFAULT_PARENT_SPIN_US = 1000.0
# How long to wait to reap a worker whose sentinel says it is gone (for its exit code).
_DIED_JOIN_S = 1.0


def _spin_pair(spin_us: Any) -> tuple[float, float]:
    """``spin_us`` as (parent, worker) microseconds: one number for both, or a pair."""
    pair = (spin_us, spin_us) if isinstance(spin_us, numbers.Real) else spin_us
    try:
        parent_us, worker_us = pair
    except (TypeError, ValueError):
        raise TypeError(
            f"spin_us must be a number of microseconds or a (parent, worker) pair of them, not {spin_us!r}"
        ) from None
    for name, value in (("parent", parent_us), ("worker", worker_us)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(value):
            raise TypeError(f"spin_us: the {name}'s spin must be a number of microseconds, not {value!r}")
    return float(parent_us), float(worker_us)


def default_n_workers(n_envs: int) -> int:
    """No more workers than cores this process may run on, nor than envs."""
    return max(1, min(n_envs, _cores()))


_LIVE_RESOURCES: "weakref.WeakSet[_Resources]" = weakref.WeakSet()


def _forget_workers_after_fork() -> None:
    """In the child of a bare ``os.fork()`` (not multiprocessing's, which starts afresh): the child
    inherits multiprocessing's set of this process's children, and at its exit multiprocessing
    terminates those that are daemonic, which are our workers: the parent's next step then met
    WorkerDiedError (SIGTERM).  They are the parent's, so the child forgets them."""
    children = getattr(mp.process, "_children", None)
    if children is None:
        return
    for res in list(_LIVE_RESOURCES):
        for proc in res.processes:
            children.discard(proc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)


class _Resources:
    """Everything that must be released, reachable without the vec env (for weakref.finalize).

    Class-level defaults make ``release()`` safe on a half-built object.
    """

    processes: list = []
    conns: list[Connection] = []
    crash_conns: list[Connection] = []  # worker w's crash pipe, read end (shmvec._crash)
    shm: SharedMemory | None = None
    unlinked: bool = False
    words: Words | None = None
    views: Any = None
    released: bool = False
    died_in_close: list[tuple[int, int | None, str]] = []  # (worker, exit code, its crash report)
    ready: frozenset[int] | set[int] = frozenset()  # workers past the handshake (they serve the words)
    owner_pid: int | None = None  # the process that built them: a forked child never releases them

    def __init__(self) -> None:
        self.owner_pid = os.getpid()

    def unlink(self) -> None:
        if self.shm is not None and not self.unlinked:
            self.unlinked = True
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass

    def release(self, polite: bool = True) -> list[tuple[int, dict]]:
        """Stops the workers (politely if asked), frees the memory; returns errors env.close() raised.

        Interrupted (Ctrl-C while a worker's env.close() hangs), it still terminates every worker
        and frees everything before the interrupt goes on: there is no second chance, as a
        second call returns at once.
        """
        if self.released:
            return []
        if self.owner_pid is not None and os.getpid() != self.owner_pid:
            # A forked process (a worker of another vec env) collecting its copy of this object:
            # the workers and the block are its parent's to stop and free, not its own.  Its copy
            # of the mapping goes quietly (views of it may still be alive in the same garbage:
            # SharedMemory.__del__ would print a BufferError).
            if self.shm is not None:
                close_mapping(self.shm)
            return []
        self.released = True
        alive = [(w, p) for w, p in enumerate(self.processes) if _is_alive(p)]
        try:
            if polite:
                self._ask_to_exit(alive)
        finally:
            close_errors = self._free(alive)
        return close_errors

    def _ask_to_exit(self, alive: list) -> None:
        words = self.words
        if words is not None:
            for w, _ in alive:
                words.store(P.word(w, P.CMD), P.Cmd.CLOSE)
                words.fetch_add(P.word(w, P.CMD_SEQ), 1)
                words.wake(P.word(w, P.CMD_SEQ))
        for w, _ in alive:
            if w not in self.ready:  # still in the handshake (interrupted there): tell them on the pipe
                try:
                    self.conns[w].send(("abort", None))
                except OSError:
                    pass
        deadline = time.monotonic() + _CLOSE_JOIN_S
        for w, p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        # Asked to close, they exited on their own: a non-zero code is a crash in env.close().
        self.died_in_close = [(w, p.exitcode, self.crash_report(w))
                              for w, p in alive if not p.is_alive() and p.exitcode != 0]

    def crash_report(self, w: int) -> str:
        """What dead worker w wrote to its crash pipe (shmvec._crash), or ""."""
        return _crash.read_report(self.crash_conns[w]) if w < len(self.crash_conns) else ""

    def _free(self, alive: list) -> list[tuple[int, dict]]:
        close_errors: list[tuple[int, dict]] = []
        for w, p in alive:
            if p.is_alive():
                p.terminate()
                p.join(_TERMINATE_JOIN_S)
            if p.is_alive():
                p.kill()
                p.join()
        for w, conn in enumerate(self.conns):
            try:
                while conn.poll(0):
                    data = conn.recv_bytes()
                    try:
                        msg = pickle.loads(data)  # an answer nobody read may not unpickle here
                    except Exception:
                        continue
                    if msg[0] == "closed" and msg[1] is not None:
                        close_errors.append((w, msg[1]))
            except (EOFError, OSError):
                pass
            conn.close()
        for conn in self.crash_conns:
            conn.close()
        for p in self.processes:
            try:
                p.close()
            except (ValueError, AttributeError):  # closed already (a restart stopped it)
                pass
        if self.words is not None:
            self.words.release()
        self.words = None
        self.views = None
        if self.shm is not None:
            self.unlink()
            close_mapping(self.shm)
        return close_errors


def _is_alive(p: Any) -> bool:
    try:
        return p.is_alive()
    except ValueError:  # a Process object closed already (a restart stopped it): not running
        return False


def _whole(name: str, value: Any, minimum: int) -> int | None:
    """``value`` as an int (None stays None): integers, and floats of whole value
    (``os.cpu_count() / 2``); TypeError for 2.5, a string or a bool, ValueError below ``minimum``."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and (
            isinstance(value, numbers.Integral) or float(value).is_integer()):
        value = int(value)
    else:
        raise TypeError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


class VecCore(Uncopyable, Recovery):
    """Everything :class:`shmvec.ShmVecEnv` does, over the ``VecEnv`` API of the class after it in
    the MRO (SB3's ``VecEnv``, or :class:`VecBase`): see the module docstring.  The parameters
    are documented on :class:`shmvec.ShmVecEnv`."""

    # Class-level defaults: close() and __del__ are safe on a half-built object.
    closed = True
    waiting = False  # a step was posted and its results are not yet returned
    _constructing = False
    # The results of the step in flight once its wait is over (step_wait() returns them again if
    # a Ctrl-C cut it short), and whether collecting them consumed a pipe message (no second read).
    _done_step: list[list] | None = None
    _consumed = False
    _collecting = False  # the step's wait is over and its results are being read
    # The failure that left this vec env unusable, without its traceback (_errors.FirstFailure).
    _broken = FirstFailure()
    _res: _Resources | None = None
    # How workers reset finished envs (_protocol): SB3 expects the reset within the same step.
    _autoreset: str = P.AUTORESET_SAME_STEP
    _step_actions: tuple | None = None  # step()'s short way, when the spaces allow it (__init__)
    _public_name = "ShmVecEnv"  # the class a user holds (an engine's owner), named in errors
    # A Dict observation batch is an OrderedDict, as DummyVecEnv and SubprocVecEnv return it.
    _batch_dict: type = collections.OrderedDict

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_workers: int | None = None,
        start_method: str | None = None,
        copy: bool = True,
        worker_threads: int | None = 1,
        timeout: float | None = None,
        spin_us: float | tuple[float, float] | None = None,
        mailbox_bytes: int = P.MAILBOX_BYTES,
        on_failure: str = "raise",
        max_restarts: int | None = 100,
        invalid_actions: str = "raise",
        envs_per_worker: int | None = None,
        cpu_affinity: bool | Sequence[int | Sequence[int]] | None = None,
        preload: Sequence[str] | None = None,
        action_masks: bool | None = None,
    ) -> None:
        self._broken = None  # first: read as a plain attribute (FirstFailure)
        # Checked once, here: a wrong type would otherwise fail in a worker, or be coerced silently.
        n_workers = _whole("n_workers", n_workers, 1)
        envs_per_worker = _whole("envs_per_worker", envs_per_worker, 1)
        worker_threads = _whole("worker_threads", worker_threads, 1)
        mailbox_bytes = _whole("mailbox_bytes", mailbox_bytes, 1)
        if isinstance(max_restarts, numbers.Real) and math.isinf(max_restarts) and max_restarts > 0:
            max_restarts = None  # no limit, as None says
        max_restarts = _whole("max_restarts", max_restarts, 0)
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
            timeout = float(timeout)
            if math.isnan(timeout):
                raise ValueError("timeout must be a number of seconds or None, got nan")
        if isinstance(preload, str):
            raise TypeError(f"preload takes a list of module names, e.g. preload=[{preload!r}], not a string")
        # Every constructor argument but the factories, for describe().
        self._config = {k: v for k, v in locals().items() if k not in ("self", "env_fns", "__class__")}
        if isinstance(env_fns, gym.Env) or callable(env_fns) or isinstance(env_fns, (str, bytes)):
            raise TypeError(
                f"env_fns must be a list of factories, got one {type(env_fns).__name__}: "
                "ShmVecEnv([make_env] * n_envs), or make_vec_env(env_id, n_envs, vec_env_cls=ShmVecEnv)."
            )
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if n_envs == 0:
            raise ValueError("ShmVecEnv needs at least one env factory")
        F.check_factories(env_fns)
        if envs_per_worker is not None:
            needed = -(-n_envs // envs_per_worker)
            if n_workers is not None and int(n_workers) != needed:
                raise ValueError(f"n_workers={n_workers} contradicts envs_per_worker={envs_per_worker} for "
                                 f"{n_envs} envs ({needed} workers): pass one of them")
            n_workers = needed
        n_workers = default_n_workers(n_envs) if n_workers is None else n_workers
        if not 1 <= n_workers <= n_envs:
            raise ValueError(f"n_workers must be in [1, {n_envs}] for {n_envs} envs, got {n_workers}")
        start_method = start_method or default_start_method()
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not one of {mp.get_all_start_methods()}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive or None, got {timeout}")
        self._init_recovery(on_failure, max_restarts)
        if invalid_actions not in INVALID_ACTIONS:
            raise ValueError(f"invalid_actions must be one of {INVALID_ACTIONS}, got {invalid_actions!r}")
        self.invalid_actions = invalid_actions
        self._cpu_sets = _machine.cpu_sets(cpu_affinity, n_workers)
        if preload:
            if start_method != "forkserver":
                raise ValueError(f"preload applies to start_method='forkserver' only, not {start_method!r}")
            _machine.set_forkserver_preload(preload)
        # Plain-data descriptions of the factories (or why there is none); the factories are not kept.
        self._descriptions = _describe.describe_env_fns(env_fns)
        self._seed_arg: Any = None
        self._options_arg: Any = None
        self.n_workers = n_workers
        self.start_method = start_method
        self.copy = copy
        self.timeout = timeout
        self.slices = split_envs(n_envs, n_workers)
        self._owner = [w for w, sl in enumerate(self.slices) for _ in sl]  # env index -> its worker
        if spin_us is None:
            spin_us = (DEFAULT_PARENT_SPIN_US if n_workers < _cores() else 0.0, DEFAULT_WORKER_SPIN_US)
        parent_us, worker_us = _spin_pair(spin_us)
        self._parent_spin = max(0.0, parent_us) * 1e-6
        self._worker_spin = max(0.0, worker_us) * 1e-6
        self._want_masks = action_masks
        self._masks_live = action_masks is True  # workers write masks (None: from the first ask)

        payloads = [self._pickle_factories(env_fns, sl) for sl in self.slices]
        self._payloads, self._worker_threads = payloads, worker_threads  # kept to restart a worker
        res = self._res = _Resources()
        _LIVE_RESOURCES.add(res)
        self._finalizer = weakref.finalize(self, res.release)
        res.processes, res.conns, res.crash_conns = [], [], []
        self.closed = False
        step_timeout = timeout
        if timeout is not None:
            self.timeout = max(timeout, _START_TIMEOUT_FLOOR_S)  # read by the pipe waits
        self._constructing = True
        try:
            self._start_workers(mailbox_bytes)
        except BaseException as exc:
            self.closed = True
            if isinstance(exc, WorkerTimeoutError):
                res.release(polite=False)  # a worker stuck in a factory would not answer CLOSE either
            self._finalizer()
            raise
        finally:
            self.timeout = step_timeout
            self._constructing = False

    # ---- construction ------------------------------------------------------------------------------
    @staticmethod
    def _pickle_factories(env_fns: list, sl: range) -> bytes:
        return _pickling.pickle_factories(env_fns, sl)

    def _launch(self, w: int) -> None:
        """Starts worker w, or a new one in place of a stopped worker w (``_recovery``), with its
        command pipe and its crash pipe (shmvec._crash); ``release()`` covers all three from here on."""
        res = self._res
        assert res is not None
        ctx = mp.get_context(self.start_method)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        crash_reader, crash_writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=worker_main,
            args=(w, self.slices[w], self._payloads[w], child_conn, crash_writer, os.getpid(), self._worker_threads,
                  self._worker_spin),
            kwargs={"affinity": self._cpu_sets[w], "autoreset": self._autoreset},
            daemon=True,
            name=f"shmvec-worker-{w}",
        )
        if w == len(res.processes):
            res.conns.append(parent_conn)
            res.crash_conns.append(crash_reader)
            res.processes.append(proc)
        else:
            res.conns[w], res.crash_conns[w], res.processes[w] = parent_conn, crash_reader, proc
        try:
            proc.start()
        except AssertionError as exc:
            if "daemonic" not in str(exc):
                raise
            raise ShmVecEnvError(
                "this process is daemonic (a multiprocessing.Pool worker, or a worker of another vec env), and "
                "multiprocessing lets no daemonic process start processes of its own: build a DummyVecEnv "
                "there, or start this process with daemon=False."
            ) from exc
        finally:
            child_conn.close()
            crash_writer.close()

    def _start_workers(self, mailbox_bytes: int) -> None:
        res = self._res
        assert res is not None
        # Started before any worker so that every worker shares it (fork copies its fd), and an
        # attach in a worker is a no-op for it rather than a tracker of its own.
        resource_tracker.ensure_running()
        for w in range(len(self.slices)):
            self._launch(w)
        self._sentinels = {p.sentinel: w for w, p in enumerate(res.processes)}

        # Handshake 1: every worker reports its spaces (no env is ever built here).
        try:
            hellos = [self._recv(w, "env construction", _START_HINT) for w in range(self.n_workers)]
        except Exception as exc:
            F.explain_construction_error(exc, self.start_method)
            raise
        obs_space, act_space, render_mode, metadata, _ = hellos[0]
        for w, (o, a, *_) in enumerate(hellos[1:], start=1):
            for name, mine, first in (("observation_space", o, obs_space), ("action_space", a, act_space)):
                if mine != first:
                    raise SpaceError(
                        f"env {self.slices[w].start} has {name} {mine}, env 0 has {first}: "
                        "all envs of a vec env must share their spaces."
                    )
        mask_size = _masks.resolve(self._want_masks, all(h[4] for h in hellos), act_space)
        layout = Layout(obs_space, act_space, self.slices[-1].stop, self.n_workers, mailbox_bytes, mask_size)
        res.shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=layout.nbytes)
        try:
            os.posix_fallocate(res.shm._fd, 0, layout.nbytes)  # ENOSPC now, not SIGBUS mid-step
        except (AttributeError, OSError) as exc:
            if getattr(exc, "errno", None) == 28:
                raise ShmVecEnvError(
                    f"/dev/shm has no room for {layout.nbytes} bytes of buffers; enlarge it "
                    "(docker: --shm-size) or use fewer envs or smaller observations."
                ) from exc

        # Handshake 2: every worker attaches; then the name is unlinked, so no segment outlives us.
        # The words exist first: a worker that has attached serves them, and only a CLOSE posted
        # there reaches it if this is interrupted (on the pipe it would wait 5 s for SIGTERM).
        self._words = res.words = Words(res.shm.buf, layout.ctrl_offset, layout.ctrl_words)
        res.ready = set()
        for conn in res.conns:
            conn.send(("attach", (res.shm.name, layout.n_envs, self.n_workers, mailbox_bytes, mask_size,
                                  self._masks_live)))
        for w in range(self.n_workers):
            self._recv(w, "attach", _START_HINT)
            res.ready.add(w)
        res.unlink()

        self._layout = layout
        views = res.views = layout.views(res.shm.buf)
        self._views = views
        self._seq = [0] * self.n_workers
        self._cmd_words = [(P.word(w, P.CMD_SEQ), P.word(w, P.CMD), P.word(w, P.CMD_SLEEPERS))
                           for w in range(self.n_workers)]
        self._result_words = [(P.word(w, P.STATUS), P.word(w, P.RESULT_LEN)) for w in range(self.n_workers)]
        self._obs_view = make_gather(obs_space, views.obs, copy=False, top_dict=self._batch_dict)
        self._obs_copy = make_gather(obs_space, views.obs, copy=True, top_dict=self._batch_dict)
        self._term_obs = make_gather(obs_space, views.term_obs, copy=True)
        self._act_leaves = list(layout.act_leaves)
        self._act_checks = make_action_checks(act_space, [leaf.path for leaf in layout.act_leaves],
                                              self.invalid_actions)
        self._act_fast = make_fast_copies(act_space, [leaf.path for leaf in layout.act_leaves], self.invalid_actions)
        # step()'s short way for the usual spaces: one observation leaf (a Box, Discrete, ...) and
        # one action leaf whose batch copy_actions checks and copies in one C call.
        single_obs = list(views.obs) == [()]
        self._obs_leaf = views.obs[()] if single_obs else None
        # (Not a scalar float Box: its row would come back a numpy scalar; _term_obs gives a 0-d array.)
        self._term_leaf = views.term_obs[()] if single_obs and not scalar_float_box(obs_space) else None
        act_fast = self._act_fast.get(()) if len(self._act_leaves) == 1 else None
        cls = type(self)
        overridden = cls.step_async is not VecCore.step_async or cls.step_wait is not VecCore.step_wait
        self._step_actions = (views.act[()], *act_fast) if act_fast is not None and not overridden else None
        super().__init__(layout.n_envs, obs_space, act_space)
        self.metadata = metadata

    # ---- SB3 VecEnv API -----------------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds from ``seed()`` and options from ``set_options()`` (used once).

        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        :raises WorkerDiedError: a worker died.
        """
        self._check_usable()
        if self.waiting:  # a step left in flight (by a Ctrl-C, or a step_async()): finished, then dropped
            self._complete_step()
            self.waiting = False
        results = self._reset_workers(self._seeds, self._options)
        self.reset_infos = [{} for _ in range(self.num_envs)]
        for items in results:
            for i, info in items:
                self.reset_infos[i] = info
        self._reset_seeds()
        self._reset_options()
        obs = self._obs_copy(slice(None)) if self.copy else self._obs_view(slice(None))
        return self._remember_obs(obs) if self._restart else obs

    def _reset_workers(self, all_seeds: list, all_options: list, mask: np.ndarray | None = None) -> list[list]:
        """Runs RESET (of the envs in ``mask``, or all) with per-env seeds and options; returns the items."""
        # No local name for a view of the buffers here or in _write_actions: the traceback of an
        # exception raised below would keep the mapping (and its fd) alive after close().
        mailbox_bytes = self._layout.mailbox_bytes
        in_pipe: dict[int, bytes] = {}
        for w, sl in enumerate(self.slices):
            seeds = all_seeds[sl.start:sl.stop]
            options = all_options[sl.start:sl.stop]
            has_seeds = any(s is not None for s in seeds)
            has_options = any(bool(o) for o in options)
            arg_len = 0
            if mask is not None:
                data = pickle.dumps((seeds if has_seeds else None, options if has_options else None,
                                     mask[sl.start:sl.stop].tolist()), protocol=5)
            elif has_seeds or has_options:
                data = pickle.dumps((seeds if has_seeds else None, options if has_options else None), protocol=5)
            if mask is not None or has_seeds or has_options:
                if len(data) >= mailbox_bytes:  # sent through the pipe once posted (protocol, step 1)
                    in_pipe[w], arg_len = data, P.ARG_IN_PIPE
                else:
                    self._views.mailbox[w, :len(data)] = np.frombuffer(data, dtype=np.uint8)
                    arg_len = len(data)
            self._words.store(P.word(w, P.ARG_LEN), arg_len)
            if self._restart:  # a worker restarted during this reset gets the same seeds and options
                self._reset_args[w] = data if arg_len else None
        try:
            self._post(P.Cmd.RESET)
            self._send_args(in_pipe, "reset")
            return self._complete("reset")
        except BaseException as exc:
            # Between the three too (a Ctrl-C lands on any call): posted and not waited for, the
            # workers' counters no longer match ours.  Each step marks what happens inside it.
            if self._broken is None:
                self._broken = exc
            raise

    def _send_args(self, in_pipe: dict[int, bytes], command: str) -> None:
        """Sends the posted command's arguments that did not fit in the mailbox (ARG_IN_PIPE)."""
        for w, data in in_pipe.items():
            try:
                self._send_bytes(w, data, command)
            except (BrokenPipeError, ConnectionResetError) as exc:
                if self._restart:
                    continue  # the worker died: the command's completion restarts it
                self._raise_if_died(w, command)
                self._broken = self._broken or exc
                raise
            except WorkerTimeoutError:
                if self._restart:  # alive but not reading: killed, and restarted like a hung step
                    self._broken = None
                    self._res.processes[w].kill()  # type: ignore[union-attr]
                    continue
                raise
            except BaseException as exc:  # interrupted half way: the worker waits for the rest
                self._broken = self._broken or exc
                raise

    def _send_bytes(self, w: int, data: Any, command: str) -> None:
        """``conn.send_bytes(data)`` to worker w, bounded by ``timeout`` like every wait here.

        A message larger than the socket's buffer is written as the worker reads it: a worker
        that is alive but does not read (stopped, or stuck in native code) would block a plain
        send for ever.  Written non-blocking, polling the socket; same framing as
        ``Connection.send_bytes`` (a 4-byte big-endian length, or -1 and 8 bytes above 2 GiB).
        EPIPE/ECONNRESET (the worker died) propagate as from ``send_bytes``.

        :raises WorkerTimeoutError: the worker took none of it for ``timeout`` seconds (the vec
            env is broken: half a message is in the pipe).
        """
        conn = self._res.conns[w]  # type: ignore[union-attr]
        view = memoryview(data).cast("B")
        n = len(view)
        header = n.to_bytes(4, "big", signed=True) if n <= 0x7FFFFFFF else b"\xff\xff\xff\xff" + n.to_bytes(8, "big")
        if n <= 16384:  # fits the socket's buffer: one write, as Connection does
            conn.send_bytes(view)
            return
        fd = conn.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        since = time.monotonic()
        os.set_blocking(fd, False)
        try:
            for part in (memoryview(header), view):
                done = 0
                while done < len(part):
                    try:
                        wrote = os.write(fd, part[done:done + (1 << 20)])
                    except BlockingIOError:
                        wrote = 0
                    if wrote:
                        done += wrote
                        since = time.monotonic()  # the worker reads: the timeout counts idle time
                        continue
                    if poller.poll(int(P.POLL_S * 1000)):
                        continue
                    if not self._res.processes[w].is_alive():  # type: ignore[union-attr]
                        raise BrokenPipeError(f"worker {w} died while {command}'s message was sent")
                    if self.timeout is not None and time.monotonic() - since >= self.timeout:
                        sl = self.slices[w]
                        raise broken_by(self, WorkerTimeoutError(
                            f"{command}: worker {w} (envs {sl.start}..{sl.stop - 1}) did not read its message "
                            f"({n} bytes) within {self.timeout:g} s. The env may hang; call close() (it terminates "
                            "it) and build a new vec env."))
        finally:
            os.set_blocking(fd, True)

    def step_async(self, actions: np.ndarray) -> None:
        """Writes ``actions`` into shared memory and starts every worker.

        :raises ValueError: the actions do not fit the action space (shape, dtype);
            ``InvalidActionError`` (a ValueError): NaN or out of range (see ``invalid_actions``).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError(
                "step_async() while a step is in flight (a step_async() without its step_wait(), or a step "
                "interrupted by Ctrl-C): call step_wait() to collect it, or reset()")
        self._write_actions(actions)
        # Restarted envs that await their truncation report (_recovery) are not stepped.
        self._post(P.Cmd.STEP, skip=self._fresh)  # sets self.waiting

    def step_wait(self) -> VecEnvStepReturn:
        """Waits for the step started by ``step_async`` and returns (obs, rewards, dones, infos).

        :raises NoAsyncCallError: no step is in flight.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
            With ``on_failure="restart"`` the worker is restarted instead, and its envs are
            reported as truncated (``info["shmvec_restarted"]``); ``TooManyRestartsError`` once
            ``max_restarts`` is spent.
        """
        self._check_usable()
        if not self.waiting:
            raise NoAsyncCallError("step_wait() without a preceding step_async()")
        return self._finish_step()

    def step(self, actions: np.ndarray) -> VecEnvStepReturn:
        """``step_async(actions)`` then ``step_wait()`` (SB3's ``VecEnv.step``), the usual case in
        fewer calls: at 8 CartPoles the parent's own Python is a few percent of a step."""
        # (No local holds a view of the block: a traceback that keeps this frame would keep it mapped.)
        own = self.__dict__  # step_async or step_wait replaced on this object: honour them
        if (self._step_actions is None or self.waiting or self.closed or self._broken is not None
                or self._restart or "step_wait" in own or "step_async" in own
                or not copy_actions(actions, *self._step_actions)):
            return super().step(actions)  # everything else, and every check and error message
        self._post(P.Cmd.STEP)  # sets self.waiting
        return self._finish_step()

    def _finish_step(self) -> VecEnvStepReturn:
        """SB3's return of the step in flight; the step is over once it returns (``waiting``
        cleared), or raises an Exception of its own.  Interrupted, it stays for ``step_wait()``."""
        results = self._complete_step()
        try:
            out = self._step_results(results)
        except Exception:
            self.waiting = False  # the step's own failure (an info SB3's dicts cannot take): it is over
            raise
        self.waiting = False
        return out

    def _complete_step(self) -> list[list]:
        """The workers' items of the step in flight (``self.waiting``, which the caller clears once
        it has returned the step): waits for them the first time, returns them again after that.

        A Ctrl-C (any exception a signal handler raises) before or during the wait, or a
        ``KeyboardInterrupt`` after it, leaves the step in flight, to be collected by
        ``step_wait()`` (SB3's ``step_wait``; ``reset()`` and ``close()`` finish it and drop it),
        unless collecting it had consumed a worker's pipe message (that cannot be read twice) or
        restart mode is on (``_complete_restarting`` keeps its own books): the env is then broken.
        So is it when the step failed, or reading its results raised an ``Exception``.
        """
        results = self._done_step
        if results is None:
            try:
                results = self._complete("step")
                self._done_step = results  # in the try: a Ctrl-C may land as _complete returns
            except BaseException as exc:
                if self._broken is None and (self._consumed or self._restart
                                             or (self._collecting and isinstance(exc, Exception))):
                    self._broken = exc
                if self._broken is not None:
                    self.waiting = False
                raise
        return results

    def _step_results(self, results: list[list]) -> VecEnvStepReturn:
        """SB3's (obs, rewards, dones, infos) of the step that just ended; ``results`` are the
        workers' non-empty infos."""
        # No local holds a view of the block while an env's info can raise (one that is not a
        # dict): a traceback keeping this frame would keep the block mapped after close().
        dones = np.empty(self.num_envs, dtype=bool)
        # dones = terminated | truncated; infos[i] = {"TimeLimit.truncated": truncated and not terminated}
        infos, done_indices = step_infos(self._views.terminated, self._views.truncated, dones)
        reset_infos = self.reset_infos
        for i in done_indices:
            reset_infos[i] = {}  # replaced below when the env's reset returned a non-empty info
        for items in results:
            for i, info, reset_info in items:
                if info:
                    info["TimeLimit.truncated"] = infos[i]["TimeLimit.truncated"]
                    infos[i] = info
                if reset_info is not None:
                    reset_infos[i] = reset_info
        term = self._term_leaf
        for i in done_indices:
            infos[i]["terminal_observation"] = term[i].copy() if term is not None else self._term_obs(i)
        if not self.copy:
            obs = self._obs_view(slice(None))
        else:
            obs = self._obs_leaf.copy() if self._obs_leaf is not None else self._obs_copy(slice(None))
        if self._restart:
            self._remember_obs(obs)
        return obs, self._views.rew.astype(np.float32), dones, infos

    def close(self) -> None:
        """Stops the workers and frees the shared memory.  Idempotent, bounded in time.

        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        if self.closed:
            return
        self.closed = True
        res = self._res
        if res is None:
            return
        # Workers that timed out may be stuck in an env: do not wait for them to answer.
        polite = not isinstance(self._broken, WorkerTimeoutError)
        if self.waiting and polite and self._done_step is None:
            try:
                self._complete("step", deadline_s=_CLOSE_JOIN_S)
            except BaseException:
                polite = False
        self.waiting = False
        self._views = None
        self._obs_view = self._obs_copy = self._term_obs = None  # drop views before unmapping
        self._obs_leaf = self._term_leaf = self._step_actions = None
        self._act_leaves = []
        errors = res.release(polite=polite)
        self._finalizer.detach()
        if errors:
            _, packed = errors[0]
            raise unpack_exception(packed, "Everything else was released.")
        if res.died_in_close:
            w, code, report = res.died_in_close[0]
            sl = self.slices[w]
            raise caused(WorkerDiedError(
                f"worker {w} (envs {sl.start}..{sl.stop - 1}) died during close with {describe_exitcode(code)} "
                "(in an env's close(), most likely" + ("; its Python stack is shown above" if report else "")
                + "). Everything was released anyway.",
                worker=w, env_indices=sl, exitcode=code,
            ), WorkerStacks.of(report, "when it died"))

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images."
            )
            return [None for _ in range(self.num_envs)]
        return self._pipe_call("render", None, ())

    def has_attr(self, attr_name: str) -> bool:
        return all(self._pipe_call("has_attr", None, (attr_name,)))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._pipe_call("get_attr", indices, (attr_name,))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._pipe_call("set_attr", indices, (attr_name, value))

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        if method_name == _masks.METHOD and self.masks_in_shm and not method_args and not method_kwargs:
            return list(self.action_masks(indices))
        return self._pipe_call("env_method", indices, (method_name, method_args, method_kwargs))

    @property
    def masks_in_shm(self) -> bool:
        """Whether action masks are served from shared memory (the ``action_masks`` option)."""
        layout = getattr(self, "_layout", None)  # absent on a half-built object
        return layout is not None and layout.mask_size > 0

    def action_masks(self, indices: VecEnvIndices = None) -> np.ndarray:
        """The envs' current action masks, bool ``(len(indices), mask_size)``, read from shared memory.

        Each row is what the env's ``action_masks()`` returned after its last reset or step (or
        ``set_attr``/``env_method`` call), flattened; all False before the first ``reset()``.

        :raises ShmVecEnvError: action masks are off for this vec env.
        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        """
        self._check_usable()
        if not self.masks_in_shm:
            raise ShmVecEnvError(
                "action masks are off for this ShmVecEnv (its envs have no action_masks() method, or "
                "action_masks=False): call env_method('action_masks') instead."
            )
        if self.waiting:
            raise AlreadyPendingCallError("action_masks() while a step is in flight: call step_wait() first")
        if not self._masks_live:  # the first ask: the workers write them now, and after every step
            try:
                self._pipe_call("action_masks", None, ())
            except Exception:
                if self._broken is None:  # one worker's envs failed: the others go back to off
                    self._pipe_call("action_masks_off", None, ())
                raise
            self._masks_live = True
        if indices is None:
            return self._views.mask.copy()
        return self._views.mask[list(self._get_indices(indices))]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._pipe_call("is_wrapped", indices, (wrapper_class,))

    # ---- seeds and plain-data description ------------------------------------------------------------
    def seed(self, seed: int | Sequence[int | None] | np.random.SeedSequence | None = None) -> list[int | None]:
        """Sets the seeds of the next ``reset()``, as SB3 does, and more.

        - an int ``s``: env i gets ``s + i`` (as SB3); None: a random ``s``, then the same;
        - a list of ints, one per env (its length must be ``num_envs``);
        - a ``numpy.random.SeedSequence``: independent per-env seeds derived from it as
          ``SeedSequence.spawn`` does (:func:`shmvec.factories.spawn_seeds`); SB3's ``seed + i``
          gives runs with nearby seeds overlapping envs.

        Seeds go to the envs, not to workers: the same seeds give the same episodes whatever the
        start method and however the envs are split across workers.

        :returns: the per-env seeds.
        :raises ValueError: a list whose length is not ``num_envs``.
        """
        self._seeds, self._seed_arg = _seeds.per_env_seeds(seed, self.num_envs)
        return self._seeds

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        super().set_options(options)
        self._options_arg = options

    def describe(self) -> dict[str, Any]:
        """This vec env as plain, JSON-serializable data, from which :meth:`from_description` rebuilds it.

        Holds each env's factory (an env id with its resolved spec, or an import path, with
        kwargs and wrappers), ``n_envs``, every constructor option (``n_workers``,
        ``start_method``, ...), and the last ``seed()`` and ``set_options()`` arguments.  No
        closure and no pickle: it can be written to JSON, read in another process or on another
        machine, and rebuilt there (where the same packages are installed).

        Factories that can be described: those of :func:`shmvec.make_env`, SB3's ``make_vec_env``
        with an env id, module-level functions or classes of importable modules (and
        ``functools.partial`` of them with plain arguments).

        :raises DescriptionError: a factory (a lambda, a closure, something defined in
            ``__main__``) or an option is not plain data; the message names which.
        """
        return _describe.describe_vec_env(self._descriptions, self._config, n_envs=self.num_envs, n_workers=self.n_workers,
                                          start_method=self.start_method, seed=self._seed_arg, options=self._options_arg)

    @classmethod
    def from_description(cls, description: dict[str, Any], **overrides: Any) -> VecCore:
        """Builds the vec env that :meth:`describe` described (``overrides`` replace constructor options).

        Options tied to the machine that wrote the description (``cpu_affinity``, ``n_workers``)
        can be replaced here: ``ShmVecEnv.from_description(d, cpu_affinity=None, n_workers=None)``.

        The seeds and reset options of the description are set for the first ``reset()``.

        :raises DescriptionError: the description is not one of ours.
        """
        return _describe.rebuild(description, cls, **overrides)

    # ---- internals ------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.closed:
            raise ClosedVecEnvError(f"this {self._public_name} is closed; build a new one")
        if self._broken is not None:
            raise BrokenVecEnvError(
                f"an earlier failure ({type(self._broken).__name__}: {self._broken}) left this "
                f"{self._public_name} unusable; call close() and build a new one"
            ) from self._broken

    def _write_actions(self, actions: Any) -> None:
        if len(self._act_leaves) == 1 and self._act_leaves[0].path == ():
            self._write_leaf(self._act_leaves[0], actions)
            return
        for leaf in self._act_leaves:
            value = actions
            for key in leaf.path:
                value = value[key]
            self._write_leaf(leaf, value)

    def _write_leaf(self, leaf: Any, value: Any) -> None:
        fast = self._act_fast.get(leaf.path)
        if fast is not None and copy_actions(value, self._views.act[leaf.path], *fast):
            return  # an ndarray of the right shape and dtype whose values pass the check
        arr = np.asarray(value)
        shape = (self.num_envs, *leaf.shape)
        if arr.shape != shape:
            rows = rows_reshaped(arr, self.num_envs, leaf.shape)
            if rows is None:
                where = "".join(f"[{k!r}]" for k in leaf.path)
                raise ValueError(
                    f"actions{where} have shape {arr.shape}; expected {shape} "
                    f"(n_envs={self.num_envs} x the action space's {leaf.shape}; one row per env, first)"
                )
            arr = rows
        if arr.dtype != leaf.dtype and (leaf.dtype.kind in "iu" or not np.can_cast(arr.dtype, leaf.dtype, "same_kind")):
            exact = exact_integers(arr, leaf.dtype)  # whole floats, as SB3 sends MultiBinary actions
            if exact is None:
                where = "".join(f"[{k!r}]" for k in leaf.path)
                raise ValueError(
                    f"actions{where} have dtype {arr.dtype}, which does not cast safely to {leaf.dtype} "
                    "(floats or other integers are accepted for an integer space only when every value is a whole "
                    "number that fits)")
            arr = exact
        check = self._act_checks.get(leaf.path)
        if check is not None:
            check(arr)  # NaN, out of range: raises InvalidActionError (or warns) naming the envs
        np.copyto(self._views.act[leaf.path], arr, casting="unsafe")

    def _arm_early_wake(self, cmd: P.Cmd) -> None:
        """Before a post: tells the workers on which core the parent will sleep (STEP only, and
        only when it does not spin), and clears the early-wake flag (protocol, "Early wake")."""
        words = self._words
        cpu = current_cpu() if cmd == P.Cmd.STEP and self._parent_spin == 0.0 else -1
        words.store(P.PARENT_CPU, cpu if cpu >= 0 else P.NO_CPU)
        words.store(P.EARLY_WAKE, 0)

    def _post(self, cmd: P.Cmd, skip: Any = ()) -> None:
        """Posts ``cmd`` to every worker but those in ``skip`` (protocol steps 1-3)."""
        words, seqs = self._words, self._seq
        code = int(cmd)
        posted = 0  # workers whose CMD_SEQ may have changed (counted before the change)
        all_posted = False
        try:
            self._arm_early_wake(cmd)
            words.store(P.PENDING, self.n_workers - len(skip))
            for w, (seq_word, cmd_word, _) in enumerate(self._cmd_words):
                if w not in skip:
                    posted += 1
                    seqs[w] = seq = (seqs[w] + 1) & 0xFFFFFFFF
                    words.store(cmd_word, code)
                    words.store(seq_word, seq)
            all_posted = True
            self._note_posted(code)
            self._wake_posted(skip)
        except BaseException as exc:
            # Interrupted (Ctrl-C).  Before any worker had its command, nothing was sent (the
            # next post stores PENDING again).  Once every worker has a step, it is in flight:
            # the sleepers are woken and step_wait() collects it.  Part way, some workers may
            # run the command and nobody will wait for them; a next command would store PENDING
            # under them and read stale results: the env is broken.
            if all_posted and code == _STEP and self._broken is None:
                self._note_posted(code)
                self._wake_posted(skip)
            elif posted and self._broken is None:
                self._broken = exc
            raise

    def _note_posted(self, code: int) -> None:
        """The command is with every worker: nothing of its results read yet; a step is in flight
        (``waiting`` set here, not in the caller: a Ctrl-C may land as _post returns)."""
        self._consumed = self._collecting = False
        if code == _STEP:
            self._done_step = None
            self.waiting = True

    def _wake_posted(self, skip: Any) -> None:
        # Wake the sleepers only once every worker has its command: a worker woken on this core
        # may take it at once, and the spinning workers must not wait for it to finish.
        words = self._words
        for w, (seq_word, _, sleepers_word) in enumerate(self._cmd_words):
            if w not in skip:
                words.wake_sleepers(seq_word, sleepers_word)

    def _complete(self, command: str, deadline_s: float | None = None) -> list[list]:
        """Waits for PENDING to reach 0, then collects each worker's infos (or error)."""
        try:
            if self._restart and deadline_s is None and command in ("step", "reset"):
                return self._complete_restarting(command)
            return self._complete_or_raise(command, deadline_s)
        except BaseException as exc:
            # Interrupted (KeyboardInterrupt, or any exception a signal handler raised) while the
            # workers still run the command: the counters no longer match, and a next command
            # would read stale results.  Failures found here have set _broken already.  A step's
            # wait can be taken up again (step_wait()): it only reads the shared words, and the
            # mailboxes until a pipe message is consumed (restart mode keeps its own books).
            # Reading the results, only an interrupt (KeyboardInterrupt) leaves them to read again:
            # an Exception there (an info that does not unpickle) would come back every time.
            if self._broken is None and not (command == "step" and deadline_s is None and not self._restart
                                             and not self._consumed
                                             and not (self._collecting and isinstance(exc, Exception))):
                self._broken = exc
            raise

    def _complete_or_raise(self, command: str, deadline_s: float | None) -> list[list]:
        words = self._words
        limit = self.timeout if deadline_s is None else deadline_s
        since = time.monotonic()  # the timeout is real time: a loaded machine makes each poll longer
        pending = words.load(P.PENDING)
        spin = self._parent_spin
        while pending != 0:
            if not spin and words.load(P.EARLY_WAKE):
                spin = P.EARLY_SPIN_S  # the worker on this core is done and asleep: spin for the rest
            value = words.wait_while(P.PENDING, pending, P.POLL_S, spin, P.PARENT_SLEEPERS)
            if value is not None:
                pending = value
                continue
            self._check_workers_alive(command)
            if limit is not None and time.monotonic() - since >= limit:
                late = [w for w in range(self.n_workers) if words.load(P.word(w, P.DONE_SEQ)) != self._seq[w]]
                envs = [i for w in late for i in self.slices[w]]
                at = "".join(f"; worker {w}{where}" for w in late if (where := self._in_env(w)))
                stacks = self._stacks(late)
                raise broken_by(self, WorkerTimeoutError(
                    f"{command}: workers {late} (envs {_ranges(envs)}{at}) did not answer within {limit:g} s. "
                    + ("Where each was is shown above (faulthandler). " if stacks else "")
                    + "The env may hang; call close() (it terminates them) and build a new vec env."
                ), cause=stacks)
            pending = words.load(P.PENDING)
        self._collecting = True
        results: list[list] = []
        error: BaseException | None = None
        for w, (status_word, result_word) in enumerate(self._result_words):
            status = words.load(status_word)
            if status == _ERROR:
                self._consumed = True
                tag, packed = self._recv_raw(w, command)
                exc = unpack_exception(packed, _BROKEN_HINT)
                error = error or exc
                results.append([])
                continue
            n = words.load(result_word)
            results.append(self._read_result(w, n, command) if n else [])
        if error is not None:
            self._broken = error
            try:
                raise error
            finally:
                error = exc = None  # a local holding it would hold this frame (and self) through its traceback
        return results

    def _read_result(self, w: int, n: int, command: str) -> list:
        """Worker ``w``'s result message, ``n`` its RESULT_LEN: the mailbox's first ``n`` bytes (the
        info codec or a pickle, told apart by ``load_result``), or a pickle in the pipe."""
        if n == P.RESULT_IN_PIPE:
            self._consumed = True
            return pickle.loads(self._recv_raw(w, command, raw_bytes=True))
        return load_result(self._views.mailbox[w, :n]) if n else []

    def _check_workers_alive(self, command: str, workers: Any = None) -> None:
        """Raises WorkerDiedError if a worker (of ``workers``, default all) has died."""
        if self.closed:  # by a signal handler that ran in this wait: the processes are gone
            raise ClosedVecEnvError(f"this {self._public_name} was closed during {command} (by a signal handler?)")
        res = self._res
        assert res is not None
        sentinels = list(self._sentinels) if workers is None else [res.processes[w].sentinel for w in workers]
        dead = mp_wait(sentinels, timeout=0)
        if dead:
            # The sentinel is ready once the process has closed its descriptors, which can be a
            # moment before it can be reaped: join(0) would often report it as "still running".
            raise self._died(self._sentinels[dead[0]], f"died during {command}", _DIED_JOIN_S)

    def _death_hint(self, exitcode: int | None) -> str:
        """What usually makes a worker die with ``exitcode``."""
        if exitcode == 1 and self._constructing and self.start_method != "fork":
            main_file = getattr(sys.modules.get("__main__"), "__file__", None)
            if isinstance(main_file, str) and not os.path.exists(main_file):  # "<stdin>": python - < script.py
                return (f"Exit code 1 while starting: your main module is {main_file!r}, which a {self.start_method} "
                        "worker re-imports and cannot (its FileNotFoundError is on stderr). Save the script to a "
                        "file and run that, or use start_method=\"fork\".")
            return ("Exit code 1 while starting, before the worker could report an error, is an exception raised "
                    f"while it imported your main module ({self.start_method} re-imports it; its traceback is on "
                    "stderr): most often the code that builds the vec env is not under "
                    "`if __name__ == \"__main__\":`.")
        if exitcode == -15:
            return ("Something sent it SIGTERM: kill, a job scheduler or process manager, or the exit of a "
                    "process forked from this one by multiprocessing.")
        return "A native crash (SIGSEGV), the OOM killer (SIGKILL) or os._exit in an env are the usual causes."

    def _died(self, w: int, what: str, join_s: float, why: str | None = None) -> WorkerDiedError:
        """WorkerDiedError for worker w (once reaped, within ``join_s``), which breaks the vec env;
        ``why``: what usually causes it (default: by its exit code).  It names the env the worker
        was in, and carries the Python stack faulthandler wrote at a native crash (shmvec._crash)
        as its ``__cause__``."""
        res = self._res
        assert res is not None
        proc = res.processes[w]
        proc.join(join_s)
        if why is None:
            why = self._death_hint(proc.exitcode)
        report = res.crash_report(w)
        if report:
            why += " Its Python stack when it died (faulthandler) is shown above."
        sl = self.slices[w]
        err = WorkerDiedError(
            f"worker {w} (envs {sl.start}..{sl.stop - 1}) {what} with {describe_exitcode(proc.exitcode)}"
            f"{self._in_env(w)}. {why} " + (_START_HINT if self._constructing else _BROKEN_HINT),
            worker=w, env_indices=sl, exitcode=proc.exitcode,
        )
        broken_by(self, err, WorkerStacks.of(report, "when it died"))
        return err

    def _env_of(self, w: int) -> int | None:
        """The env worker w is in by its ENV_AT word (shmvec._protocol: a hint), or None."""
        if self._res is None or self._res.words is None:
            return None
        try:
            i = self._res.words.load(P.word(w, P.ENV_AT))
        except ValueError:  # released
            return None
        return i if i in self.slices[w] else None

    def _in_env(self, w: int) -> str:
        """", in env i" (``_env_of``), or ""."""
        i = self._env_of(w)
        return "" if i is None else f", in env {i}"

    def _stacks(self, workers: Sequence[int]) -> WorkerStacks | None:
        """The Python stacks of live, stuck workers (shmvec._crash.dump_stacks), or None."""
        res = self._res
        assert res is not None
        parts = []
        for w in workers:
            if w < len(res.crash_conns) and _is_alive(res.processes[w]):
                stacks = _crash.dump_stacks(res.processes[w].pid, res.crash_conns[w])
                if stacks:
                    parts.append(f"worker {w}:\n{stacks}" if len(workers) > 1 else stacks)
        return WorkerStacks.of("\n\n".join(parts), "where it hung")

    def _wait_conn(self, w: int, command: str) -> None:
        """Blocks until worker w's pipe has data; raises if the worker dies or the timeout passes."""
        res = self._res
        assert res is not None
        conn = res.conns[w]
        since = time.monotonic()
        while not conn.poll(0):
            ready = mp_wait([conn, res.processes[w].sentinel], timeout=P.POLL_S)
            if conn in ready or conn.poll(0):
                return
            if ready:
                self._check_workers_alive(command, [w])
            if self.timeout is not None and time.monotonic() - since >= self.timeout:
                sl = self.slices[w]
                what = (_START_HINT if self._constructing
                        else "Call close() (it terminates it) and build a new vec env.")
                stacks = self._stacks([w])
                raise broken_by(self, WorkerTimeoutError(
                    f"{command}: worker {w} (envs {sl.start}..{sl.stop - 1}{self._in_env(w)}) did not answer within "
                    f"{self.timeout:g} s. " + ("Where it was is shown above (faulthandler). " if stacks else "") + what
                ), cause=stacks)

    def _recv_raw(self, w: int, command: str, raw_bytes: bool = False) -> Any:
        """The next message from worker w (its bytes with ``raw_bytes``); WorkerDiedError if it died."""
        self._wait_conn(w, command)
        conn = self._res.conns[w]  # type: ignore[union-attr]
        try:
            return conn.recv_bytes() if raw_bytes else conn.recv()
        except (EOFError, OSError):
            self._raise_if_died(w, command)
            raise

    def _raise_if_died(self, w: int, command: str) -> None:
        """After a failed pipe operation: raises WorkerDiedError if worker w is exiting.

        A dead peer shows on the pipe as EOF, ECONNRESET (it died with our message unread) or
        EPIPE, possibly a moment before its sentinel is ready, so wait for the sentinel briefly.
        """
        res = self._res
        assert res is not None
        mp_wait([res.processes[w].sentinel], timeout=_DIED_JOIN_S)
        self._check_workers_alive(command)

    def _recv(self, w: int, command: str, hint: str) -> Any:
        tag, payload = self._recv_raw(w, command)
        if tag == "error":
            raise unpack_exception(payload, hint)
        if tag == "closed":
            self._exited_instead(w, command, payload)
        return payload

    def _exited_instead(self, w: int, command: str, packed: dict | None) -> None:
        """Worker w sent its last message ("closed": it is exiting) where an answer to ``command``
        was awaited: WorkerDiedError with its exit code, and what its envs' close() raised."""
        err = self._died(w, f"exited during {command} without answering,", _CLOSE_JOIN_S,
                         "The worker loop itself failed (see the cause, if any).")
        if packed is not None:
            err.__cause__ = unpack_exception(packed, _BROKEN_HINT)
            self._broken = err  # again, with its cause: _broken keeps a copy
        try:
            raise err
        finally:
            del err  # a local holding it would hold this frame (and self) through its traceback

    def _pipe_call(self, name: str, indices: VecEnvIndices, args: tuple) -> list[Any]:
        self._check_usable()
        if self.waiting:
            raise AlreadyPendingCallError(f"{name}() while a step is in flight: call step_wait() first")
        res = self._res
        assert res is not None
        if self._restart:
            self._recover_dead(name)
        targets = list(self._get_indices(indices))
        groups = group_by_slice(targets, self.slices)  # answers go back by position (see there)
        by_worker = {w: idx for w, (idx, _) in groups.items()}
        positions = {w: pos for w, (_, pos) in groups.items()}
        # Pickled before anything is posted: an argument that does not pickle leaves the env usable.
        if name == "set_wrapper_attr":  # one value per env: each worker gets only its own envs' values
            values = args[1]
            messages = {w: reduction.ForkingPickler.dumps((name, (idx, args[0], {i: values[i] for i in idx})))
                        for w, idx in by_worker.items()}
        else:
            messages = {w: reduction.ForkingPickler.dumps((name, (idx, *args))) for w, idx in by_worker.items()}
        answers: list[Any] = [None] * len(targets)
        error: BaseException | None = None
        try:
            for w in by_worker:  # post, then send (protocol, "Rare commands")
                self._seq[w] = (self._seq[w] + 1) & 0xFFFFFFFF
                self._words.store(P.word(w, P.CMD), P.Cmd.PIPE)
                self._words.store(P.word(w, P.CMD_SEQ), self._seq[w])
                self._words.wake(P.word(w, P.CMD_SEQ))
                try:
                    self._send_bytes(w, messages[w], name)
                except (BrokenPipeError, ConnectionResetError):
                    self._raise_if_died(w, name)
                    raise
            for w, idx in by_worker.items():
                data = self._recv_raw(w, name, raw_bytes=True)
                try:
                    tag, payload = pickle.loads(data)
                except Exception as exc:  # read whole: the pipe is in step, the env stays usable
                    exc.add_note(
                        f"shmvec: the answer of worker {w} (envs {_ranges(idx)}) to {name} pickled there but does "
                        "not unpickle in this process (an object only the worker can rebuild: a CUDA tensor, "
                        "a class the worker imported); return plain data (numbers, numpy arrays) instead."
                    )
                    error = error or exc
                    continue
                if tag == "error":
                    if payload["command"] is None:  # the message did not unpickle in the worker
                        payload["command"] = f"{name} (unpickling its arguments in the worker)"
                    error = error or unpack_exception(payload, _CALL_HINT)
                elif tag == "closed":
                    self._exited_instead(w, name, payload)
                else:
                    for pos, value in zip(positions[w], payload):
                        answers[pos] = value
        except BaseException as exc:
            # Interrupted (or a worker died): an answer left in a pipe would be taken for the
            # next call's, and a worker posted but never sent its message waits for it.
            if self._broken is None:
                self._broken = exc
            raise
        if error is not None:
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and self) through its traceback
        return answers

    def _worker_of(self, i: int) -> int:
        return self._owner[i]

    def __del__(self) -> None:
        if not self.closed:
            try:
                self.close()
            except Exception:
                pass


class VecBase:
    """The parts of SB3's ``VecEnv`` that :class:`VecCore` uses, for the engine of the Gymnasium
    face and the pools (``VecCore`` over ``VecBase``), which must not import SB3.  Each does what
    SB3's method of the same name does (stable_baselines3.common.vec_env.base_vec_env, 2.6 to
    2.9); ``tests/test_vector.py`` checks that they agree."""

    def __init__(self, num_envs: int, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        self.num_envs = num_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self.reset_infos: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self._seeds: list[int | None] = [None for _ in range(num_envs)]
        self._options: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        try:
            render_modes = self.get_attr("render_mode")  # type: ignore[attr-defined]
        except AttributeError:
            warnings.warn("The `render_mode` attribute is not defined in your environment. It will be set to None.")
            render_modes = [None for _ in range(num_envs)]
        if not all(mode == render_modes[0] for mode in render_modes):
            raise ValueError(f"render_mode should be the same for all environments, got {render_modes}")
        self.render_mode = render_modes[0]
        if self.render_mode is None:
            self.metadata: dict[str, Any] = {"render_modes": []}
        elif self.render_mode == "rgb_array":
            self.metadata = {"render_modes": ["human", "rgb_array"]}
        else:
            self.metadata = {"render_modes": [self.render_mode]}

    def _reset_seeds(self) -> None:
        self._seeds = [None for _ in range(self.num_envs)]

    def _reset_options(self) -> None:
        self._options = [{} for _ in range(self.num_envs)]

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        if options is None:
            options = {}
        # deep copies, as SB3 makes them: the caller's dicts stay the caller's
        self._options = deepcopy([options] * self.num_envs if isinstance(options, dict) else options)

    def step(self, actions: np.ndarray) -> VecEnvStepReturn:
        self.step_async(actions)  # type: ignore[attr-defined]
        return self.step_wait()  # type: ignore[attr-defined]

    def _get_indices(self, indices: VecEnvIndices) -> Any:
        if indices is None:
            return range(self.num_envs)
        if isinstance(indices, int):
            return [indices]
        return indices


def _ranges(indices: list[int]) -> str:
    if not indices:
        return "none"
    out, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)
