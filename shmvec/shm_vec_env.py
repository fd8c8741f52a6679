"""ShmVecEnv: a Stable-Baselines3 ``VecEnv`` whose workers step slices of envs in shared memory.

It holds an :class:`shmvec._engine.Engine` and speaks SB3's ``VecEnv`` API over it: SB3's
``dones``/``infos`` (``TimeLimit.truncated``, ``terminal_observation``), ``reset_infos``, seeds
and options for the next ``reset()``, ``describe()``.  The engine does the rest: workers, shared
memory, the protocol (:mod:`shmvec._protocol`), failures and restarts.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec._optional import missing

try:  # Stable-Baselines3 is the extra shmvec[sb3] (shmvec._optional)
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ModuleNotFoundError as exc:
    raise missing("ShmVecEnv", exc) from exc

from shmvec import _protocol as P
from shmvec._copyguard import Uncopyable
from shmvec._describe import describe_vec_env, rebuild
from shmvec._engine import Engine
from shmvec._errors import NoAsyncCallError
from shmvec._masks import METHOD as MASKS_METHOD
from shmvec._pickled_leaves import stack_values
from shmvec._rows import copy_actions, step_infos
from shmvec._seeds import per_env_seeds
from shmvec._frontend import decided_of, rendered_images, served_masks
from shmvec._state import IDLE, serialized

__all__ = ["ShmVecEnv"]


class ShmVecEnv(Uncopyable, VecEnv):
    """A vectorized environment whose workers step slices of the envs in shared memory.

    A drop-in for SB3's ``SubprocVecEnv``::

        env = make_vec_env("CartPole-v1", n_envs=64, vec_env_cls=ShmVecEnv)

    :param env_fns: callables that each build a new ``gymnasium.Env``; lambdas and closures are
        fine (they are sent with cloudpickle).  An env registered at run time in the script
        (``gym.register``) is registered in spawn and forkserver workers too.
    :param n_workers: worker processes; each steps a contiguous slice of the envs.  Default: the
        number of cores this process may use, at most ``len(env_fns)``.
    :param start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default as SB3 (forkserver
        where available, else spawn).
    :param copy: when True (default), ``reset``/``step_wait`` return arrays of their own.  When
        False, observations are views of the shared buffers: no copy, but **the next step
        overwrites them**, so copy whatever you keep (SB3's algorithms keep ``_last_obs``: leave
        ``copy=True`` for them).
    :param worker_threads: cap on BLAS/OpenMP/torch threads in each worker (None: leave as is).
    :param timeout: seconds to wait for the workers on any command before raising
        ``WorkerTimeoutError`` (None: wait as long as they are alive).  Starting workers (at
        construction, and restarts) waits at least 60 s whatever this is: a new worker imports
        its modules and builds its envs, which a step-sized timeout does not allow for.
    :param spin_us: microseconds a waiting side spins (yielding its core between bursts) before
        it sleeps on the futex, as ``(parent, worker)`` or one number for both.  Default: the
        parent spins up to 1000 us only when there are fewer workers than cores (a core of its
        own), and not at all otherwise; workers spin up to
        5000 us, but only while the parent usually answers within that (a stepping loop, or a
        small policy's forward pass between steps), and sleep at once when it does not (a
        policy update between rollouts).
    :param mailbox_bytes: per-worker shared buffer for infos and reset arguments; larger results
        travel through the worker's pipe instead.
    :param on_failure: what a failed worker (it died, one of its envs raised in ``step``/``reset``,
        or it did not answer within ``timeout``) does to the vec env.  ``"raise"`` (default): the
        call raises (``WorkerDiedError``, ``WorkerTimeoutError`` or the env's own exception) and
        the vec env is broken.  ``"restart"``: the worker is restarted, its envs rebuilt from
        their factories and reset, and their episodes reported as truncated with
        ``info["shmvec_restarted"]`` saying why (see docs/failures.md); a
        ``WorkerRestartWarning`` is emitted each time.  With ``copy=False`` it costs one copy of
        the observations per step (the terminal observation of a restarted env must survive).
    :param max_restarts: with ``on_failure="restart"``, how many restarts a vec env may do in
        its life; the next failure raises ``TooManyRestartsError``.  None: no limit.
    :param invalid_actions: NaN in a float ``Box`` action, or a ``Discrete``/``MultiDiscrete``/
        ``MultiBinary`` action out of range: ``"raise"`` (default) raises
        ``InvalidActionError`` (a ``ValueError`` naming the envs) before anything is sent,
        ``"warn"`` warns (``InvalidActionWarning``) and sends them, ``"ignore"`` skips the check.
    :param envs_per_worker: at most this many envs per worker (sets ``n_workers`` to
        ``ceil(n_envs / envs_per_worker)``); ``envs_per_worker=1`` runs each env in a process of its
        own, for simulators that allow one instance per process.
    :param cpu_affinity: pin workers to cores (Linux): True pins worker w to the w-th core this
        process may use (cycling); a list gives worker w entry ``w % len(list)``, a core or a
        collection of cores.  None (default): no pinning; where a worker shares the parent's core,
        shmvec measures whether moving the workers off it makes the loop faster, and keeps the
        faster (docs/design.md, "Placement").  False: no pinning and no such move.
    :param preload: module names the forkserver imports once (e.g. ``["torch"]``), so that workers
        forked from it do not import them again; ``start_method="forkserver"`` only.  The
        forkserver is one per process and started once: see :func:`shmvec.set_forkserver_preload`.
    :param action_masks: serve ``env_method("action_masks")`` (sb3-contrib's ``MaskablePPO``
        calls it every step) from shared memory: the workers call ``action_masks()`` after every
        reset and step and write it into a bool buffer, and the parent answers without a pipe
        round trip (see :mod:`shmvec._masks`).  None (default): on when every env has an
        ``action_masks`` method and the action space is Discrete, MultiDiscrete or MultiBinary,
        from the first time masks are asked for (``env_method("action_masks")`` or
        :meth:`action_masks`): until then no ``action_masks()`` is called, as with
        ``DummyVecEnv`` (a plain PPO on such envs calls none).  True: on from the start.
        False: off (``env_method("action_masks")`` goes through the pipe like any other call).
    :param zero_copy: with ``copy=True``, hand out the observations in the shared memory the
        workers wrote them to, without copying them, and never let a later step write into
        memory whose observations you still hold (any array or view of them): the workers write
        into another block of shared memory, up to 8 (and 1 GiB), then into one that is copied
        as without it (docs/design.md, "Observations without the copy").  None (default): on when
        a step's observations weigh 32 KiB or more (images), where it is faster.  True: on
        whatever the size.  False: off.  It cannot go with ``copy=False``, ``on_failure="restart"``
        or observations without a fixed size (``Text``, ...).
    :param parent_threads: torch's intra-op threads in this process while the workers run.
        ``"auto"`` (default): when torch is loaded here and runs more threads than the cores the
        workers leave free (at least 1), it is set to that many (``torch.set_num_threads``) until the
        vec env closes, with a ``ParentThreadsWarning`` once per process: its idle threads spin on
        the workers' cores after each forward pass (docs/benchmarks.md, "Training").  Left alone
        where ``OMP_NUM_THREADS`` is set.  A number: set to that many.  None: torch is left as it is.

    :raises TypeError: ``env_fns`` holds something that is not callable (an env instance).
    :raises UnpicklableFactoryError: a factory cannot be pickled; the message names the object.
    :raises SpaceError: the envs' spaces differ or are not Gymnasium spaces; or a space without a
        fixed size (``Text``, ``Sequence``, ...: its values travel pickled, docs/sb3.md) with
        ``on_failure="restart"``.
    :raises WorkerDiedError: a worker died while starting.
    :raises ValueError: an option is out of its range.
    """

    _engine: Engine | None = None  # class-level: close() and __del__ are safe on a half-built object
    _fast: tuple | None = None

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
        zero_copy: bool | None = None,
        parent_threads: str | int | None = "auto",
    ) -> None:
        self._engine = engine = Engine(
            env_fns, batch_dict=collections.OrderedDict, pickled_batch=stack_values, public_name=type(self).__name__,
            n_workers=n_workers,
            start_method=start_method, copy=copy, worker_threads=worker_threads, timeout=timeout, spin_us=spin_us,
            mailbox_bytes=mailbox_bytes, on_failure=on_failure, max_restarts=max_restarts,
            invalid_actions=invalid_actions, envs_per_worker=envs_per_worker, cpu_affinity=cpu_affinity,
            preload=preload, action_masks=action_masks, zero_copy=zero_copy, parent_threads=parent_threads,
        )
        self._seed_arg: Any = None
        self._options_arg: Any = None
        try:
            super().__init__(engine.num_envs, engine.observation_space, engine.action_space)
        except BaseException:
            self.close()
            raise
        self.metadata = engine.metadata
        cls = type(self)
        overridden = cls.step_async is not ShmVecEnv.step_async or cls.step_wait is not ShmVecEnv.step_wait
        # step()'s short way (one C call checks and copies the actions), unless a subclass
        # replaced step_async or step_wait, or restarts keep books of their own.
        self._fast = engine.step_actions if not overridden and not engine.options.restart else None

    # ---- options, as attributes ---------------------------------------------------------------------
    n_workers = property(lambda self: self._engine.n_workers)
    start_method = property(lambda self: self._engine.options.start_method)
    copy = property(lambda self: self._engine.options.copy)

    @property
    def zero_copy(self) -> bool:
        """Whether observations are handed out without a copy (the ``zero_copy`` option, resolved)."""
        return self._engine is not None and self._engine.zero_copy
    slices = property(lambda self: self._engine.slices)
    invalid_actions = property(lambda self: self._engine.options.invalid_actions)
    on_failure = property(lambda self: self._engine.options.on_failure)
    max_restarts = property(lambda self: self._engine.options.max_restarts)

    @property
    def timeout(self) -> float | None:
        return self._engine.timeout

    @property
    def restarts(self) -> int:
        """Workers restarted so far (``on_failure="restart"``)."""
        return self._engine.restarted

    @property
    def closed(self) -> bool:
        return self._engine is None or self._engine.closed

    @property
    def waiting(self) -> bool:
        """A step is in flight (``step_async`` without its ``step_wait``, or a step cut short by Ctrl-C)."""
        return self._engine is not None and self._engine.waiting

    # ---- SB3 VecEnv API -----------------------------------------------------------------------------
    @serialized
    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds from ``seed()`` and options from ``set_options()`` (used once).

        :raises ClosedVecEnvError, BrokenVecEnvError: misuse.
        :raises WorkerDiedError: a worker died.
        """
        engine = self._engine
        engine.check_usable()
        results = engine.reset(self._seeds, self._options)
        self.reset_infos = [{} for _ in range(self.num_envs)]
        for items in results:
            for i, info in items:
                self.reset_infos[i] = info
        self._reset_seeds()
        self._reset_options()
        return engine.obs_out(engine.options.copy)

    @serialized
    def step_async(self, actions: np.ndarray) -> None:
        """Writes ``actions`` into shared memory and starts every worker.

        ``actions``: the batched form (an ``(n_envs, ...)`` array per leaf of the action space,
        nested like it), or a list of ``n_envs`` per-env actions, as ``DummyVecEnv`` takes them.

        :raises ValueError: the actions do not fit the action space (shape, dtype, the number of
            per-env actions); ``InvalidActionError`` (a ValueError): NaN or out of range (see
            ``invalid_actions``).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        self._engine.post_step(actions)

    @serialized
    def step_wait(self) -> VecEnvStepReturn:
        """Waits for the step started by ``step_async`` and returns (obs, rewards, dones, infos).

        :raises NoAsyncCallError: no step is in flight.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
            With ``on_failure="restart"`` the worker is restarted instead, and its envs are
            reported as truncated (``info["shmvec_restarted"]``); ``TooManyRestartsError`` once
            ``max_restarts`` is spent.
        """
        engine = self._engine
        engine.check_usable()
        if not engine.waiting:
            raise NoAsyncCallError("step_wait() without a preceding step_async()")
        engine.check_poster("step_wait")
        return self._finish_step()

    def step(self, actions: np.ndarray) -> VecEnvStepReturn:
        """``step_async(actions)`` then ``step_wait()`` (SB3's ``VecEnv.step``), in fewer calls."""
        # (No local holds a view of the block: a traceback that keeps this frame would keep it mapped.)
        engine, own = self._engine, self.__dict__  # step_async/step_wait set on the object
        with engine.lock:  # (serialized, as every public call: shmvec._state, "Threads")
            if (self._fast is None or engine.state is not IDLE or "step_wait" in own or "step_async" in own
                    or not copy_actions(actions, *self._fast)):
                return super().step(actions)  # everything else, and every check and error message
            engine.post(P.Cmd.STEP)  # state POSTED
            return self._finish_step()

    def _finish_step(self) -> VecEnvStepReturn:
        """SB3's return of the step in flight; the step is over once it returns, or raises an
        Exception of its own.  Interrupted, it stays for ``step_wait()``."""
        engine = self._engine
        results = engine.complete_step()
        try:
            out = self._step_results(engine, results)
        except Exception:
            engine.finish_step()  # the step's own failure (an info SB3's dicts cannot take): it is over
            raise
        engine.finish_step()
        return out

    def _step_results(self, engine: Engine, results: list[list]) -> VecEnvStepReturn:
        """SB3's (obs, rewards, dones, infos) of the step that just ended; ``results`` are the
        workers' non-empty infos."""
        # No local holds a view of the block while an env's info can raise (one that is not a
        # dict): a traceback keeping this frame would keep the block mapped after close().
        dones = np.empty(self.num_envs, dtype=bool)
        # dones = terminated | truncated; infos[i] = {"TimeLimit.truncated": truncated and not terminated}
        infos, done_indices = step_infos(engine.terminated, engine.truncated, dones)
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
        term = engine.term_leaf
        for i in done_indices:
            infos[i]["terminal_observation"] = term[i].copy() if term is not None else engine.term_obs(i)
        return engine.obs_out(engine.options.copy), engine.rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        """Stops the workers and frees the shared memory.  Idempotent, bounded in time.

        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        engine = self._engine
        if engine is None:
            return
        with engine.closing():
            self._fast = None  # a view of the block: dropped before it is unmapped
            engine.close()

    @serialized
    def get_images(self) -> Sequence[np.ndarray | None]:
        return rendered_images(self._engine, self.render_mode, self.num_envs)

    @serialized
    def has_attr(self, attr_name: str) -> bool:
        return all(self._engine.call(P.Call.HAS_ATTR, None, (attr_name,)))

    @serialized
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._engine.call(P.Call.GET_ATTR, indices, (attr_name,))

    @serialized
    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._engine.call(P.Call.SET_ATTR, indices, (attr_name, value))

    @serialized
    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        if method_name == MASKS_METHOD and self.masks_in_shm and not method_args and not method_kwargs:
            return list(self.action_masks(indices))
        return self._engine.call(P.Call.ENV_METHOD, indices, (method_name, method_args, method_kwargs))

    @serialized
    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._engine.call(P.Call.IS_WRAPPED, indices, (wrapper_class,))

    @property
    def masks_in_shm(self) -> bool:
        """Whether action masks are served from shared memory (the ``action_masks`` option)."""
        return self._engine is not None and self._engine.masks_in_shm

    @serialized
    def action_masks(self, indices: VecEnvIndices = None) -> np.ndarray:
        """The envs' current action masks, bool ``(len(indices), mask_size)``, read from shared memory.

        Each row is what the env's ``action_masks()`` returned after its last reset or step (or
        ``set_attr``/``env_method`` call), flattened; all False before the first ``reset()``.

        :raises ShmVecEnvError: action masks are off for this vec env.
        :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
        """
        engine = self._engine
        masks = served_masks(engine, type(self).__name__)
        return masks.copy() if indices is None else masks[list(engine.indices(indices))]

    # ---- seeds and plain-data description ------------------------------------------------------------
    @serialized
    def seed(self, seed: int | Sequence[int | None] | np.random.SeedSequence | None = None) -> list[int | None]:
        """Sets the seeds of the next ``reset()``, as SB3 does, and more.

        - an int ``s``: env i gets ``s + i`` (as SB3); None: a random ``s``, then the same;
        - a list of ints, one per env (its length must be ``num_envs``);
        - a ``numpy.random.SeedSequence``: independent per-env seeds derived from it as
          ``SeedSequence.spawn`` does (:func:`shmvec.spawn_seeds`).

        Seeds go to the envs, not to workers: the same seeds give the same episodes whatever the
        start method and however the envs are split across workers.

        :returns: the per-env seeds.
        :raises ValueError: a list whose length is not ``num_envs``.
        """
        self._seeds, self._seed_arg = per_env_seeds(seed, self.num_envs)
        return self._seeds

    @serialized
    def set_options(self, options: list[dict] | dict | None = None) -> None:
        super().set_options(options)
        self._options_arg = options

    @serialized
    def describe(self) -> dict[str, Any]:
        """This vec env as plain, JSON-serializable data, from which :meth:`from_description` rebuilds it.

        Holds each env's factory (an env id with its resolved spec, or an import path, with
        kwargs and wrappers), ``n_envs``, every constructor option, and the last ``seed()`` and
        ``set_options()`` arguments: no closure and no pickle (docs/multiprocessing.md).

        :raises DescriptionError: a factory (a lambda, a closure, something defined in
            ``__main__``) or an option is not plain data; the message names which.
        """
        engine = self._engine
        return describe_vec_env(engine.descriptions, dict(engine.options.given), n_envs=self.num_envs,
                                n_workers=engine.n_workers, start_method=engine.options.start_method,
                                seed=self._seed_arg, options=self._options_arg, decided=engine.explain())

    @serialized
    def decided(self) -> dict[str, Any]:
        """What the defaults became on this machine, and why: the workers, their spin, torch's
        threads in this process, where the workers run (``describe()["decided"]``, also for
        factories that cannot be described)."""
        return decided_of(self)

    @classmethod
    def from_description(cls, description: dict[str, Any], **overrides: Any) -> ShmVecEnv:
        """Builds the vec env that :meth:`describe` described (``overrides`` replace constructor options).

        Options tied to the machine that wrote the description (``cpu_affinity``, ``n_workers``)
        can be replaced here: ``ShmVecEnv.from_description(d, cpu_affinity=None, n_workers=None)``.
        The seeds and reset options of the description are set for the first ``reset()``.

        :raises DescriptionError: the description is not one of ours.
        """
        return rebuild(description, cls, **overrides)

    def __del__(self) -> None:
        engine = self._engine
        if engine is not None and not engine.closed:
            try:
                self.close()
            except Exception:
                pass
