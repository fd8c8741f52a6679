"""ShmVectorEnv: a Gymnasium ``VectorEnv`` on the same shared-memory engine as ``ShmVecEnv``.

It holds an :class:`shmvec._engine.Engine` (as ``ShmVecEnv`` does), built with the worker
autoreset mode that matches Gymnasium's ``AutoresetMode``, and only turns its raw results (shared
buffers plus the sparse infos the workers sent) into Gymnasium's batched return values.  It takes
``AsyncVectorEnv``'s constructor arguments and its asynchronous pairs (``step_async``/``step_wait``,
``reset_async``/``reset_wait``, ``call_async``/``call_wait``, each wait with its ``timeout``).
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from shmvec import _protocol as P
from shmvec._copyguard import Uncopyable
from shmvec._describe import describe_vec_env, rebuild
from shmvec._engine import Engine
from shmvec._errors import AlreadyPendingCallError, NoAsyncCallError, ShmVecEnvError
from shmvec._frontend import (ENGINE_OPTIONS, decided_of, env_render_mode, gym_engine, refuse_unknown_keywords,
                              usable_engine)
from shmvec._seeds import gym_reset_mask, gym_vector_seeds, per_env_values
from shmvec._state import IDLE, serialized
from shmvec.factories import DescriptionError, factory_list, make_env

_WORKER_MODE = {
    AutoresetMode.NEXT_STEP: P.AUTORESET_NEXT_STEP,
    AutoresetMode.SAME_STEP: P.AUTORESET_SAME_STEP,
    AutoresetMode.DISABLED: P.AUTORESET_DISABLED,
}
# The "vec_env" of ShmVectorEnv's descriptions (a ShmVecEnv's has none; RayShmVecEnv's has its own).
DESCRIBED_AS = "shmvec.ShmVectorEnv"
# What AsyncVectorEnv's worker refuses to run through call(): they have methods of their own.
_NOT_BY_CALL = ("reset", "step", "close")


def async_vector_args(num_envs: int, start_method: str | None, context: str | None, worker: Any,
                      observation_mode: Any, max_concurrency: Any, n_workers: Any, envs_per_worker: Any) -> tuple:
    """AsyncVectorEnv's arguments as the engine takes them: ``(start_method, n_workers, observation_mode)``.

    :raises ValueError: ``context`` and ``start_method`` disagree; a custom ``worker``; an
        ``observation_mode`` that is not "same", "different" or ``(batched space, single space)``;
        a ``max_concurrency`` that is not a positive int, or below ``n_workers``.
    :raises TypeError: ``observation_mode`` a pair that is not of two spaces (as AsyncVectorEnv).
    """
    if worker is not None:
        raise ValueError(
            "ShmVectorEnv takes no custom worker (worker=...): its workers are shmvec's own loop, each stepping a "
            "slice of the envs through shared memory, not AsyncVectorEnv's one-env-per-pipe _async_worker, so a "
            "worker written for AsyncVectorEnv cannot run there. Change what an env does in step or reset with a "
            "gymnasium.Wrapper inside its factory, or keep AsyncVectorEnv for a custom worker.")
    if context is not None and start_method is not None and context != start_method:
        raise ValueError(f"context={context!r} and start_method={start_method!r} disagree: they are the same option "
                         "(AsyncVectorEnv's name and shmvec's), pass one")
    if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
        if not all(isinstance(space, gym.Space) for space in observation_mode):
            raise TypeError(f"Expected both elements of observation_mode to be Spaces, got "
                            f"{type(observation_mode[0])} and {type(observation_mode[1])}")
        mode = observation_mode[1]  # every env's space must have its shapes and dtypes
    elif isinstance(observation_mode, str) and observation_mode in ("same", "different"):
        mode = observation_mode
    else:
        hint = (" (a space alone: pass (batched space, single space), as AsyncVectorEnv takes it)"
                if isinstance(observation_mode, gym.Space) else "")
        raise ValueError(f"Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
                         f"observation space, actual got {observation_mode}{hint}")
    if max_concurrency is not None:
        # One worker steps its envs one after the other: at most n_workers envs run at once.
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, (int, np.integer)):
            raise ValueError(f"`max_concurrency` must be an integer or None, got {type(max_concurrency)}.")
        if max_concurrency < 1:
            raise ValueError(f"`max_concurrency` must be a positive or None, got {max_concurrency}.")
        workers = n_workers if envs_per_worker is None else -(-num_envs // envs_per_worker)
        if workers is None:
            n_workers = min(int(max_concurrency), num_envs)
        elif workers > max_concurrency:
            raise ValueError(f"{workers} workers step up to {workers} envs at once, more than "
                             f"max_concurrency={max_concurrency}: pass n_workers <= max_concurrency (or only one)")
    return start_method or context, n_workers, mode


class ShmVectorEnv(Uncopyable, VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose workers step slices of the envs in shared memory.

    A drop-in where ``gymnasium.vector.AsyncVectorEnv`` or ``SyncVectorEnv`` is used::

        envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 8, n_workers=2)
        envs = shmvec.make_vec("CartPole-v1", num_envs=8, vector_kwargs={"n_workers": 2})

    Every ``reset``/``step`` equals ``SyncVectorEnv``'s with the same ``autoreset_mode`` on the
    same seeds: observations, rewards (float64), ``terminated``, ``truncated`` and infos (a dict
    of arrays with ``_key`` masks, built by Gymnasium's own ``VectorEnv._add_info``).

    Autoreset modes (``metadata["autoreset_mode"]``):

    - ``NEXT_STEP`` (default): an env that ended on a step is reset on the next ``step`` instead
      of being stepped: its action is ignored, its reward is 0, both flags are False, its info is
      the reset info.
    - ``SAME_STEP``: the env is reset within the step that ended it; the observation is the reset
      observation, ``infos["final_obs"]``/``infos["final_info"]`` (masks ``_final_obs``,
      ``_final_info``) hold the last observation and info of the episode.
    - ``DISABLED``: nothing is reset on its own; reset ended envs with
      ``reset(options={"reset_mask": mask})`` before stepping them again (stepping an env that
      ended and was not reset raises ``ShmVecEnvError``).

    As ``AsyncVectorEnv``: ``step_async``/``step_wait``, ``reset_async``/``reset_wait``,
    ``call_async``/``call_wait``; a wait past its ``timeout`` raises ``multiprocessing.TimeoutError``
    and leaves the call in flight, for a later wait to collect (``AsyncVectorEnv`` forgets it, and
    its next wait reads the late answer in place of its own).  ``reset()`` finishes and drops a
    step left in flight (a Ctrl-C, or ``step_async`` without ``step_wait``).

    One difference from ``SyncVectorEnv``: an empty ``options`` dict is not passed on to the envs'
    ``reset`` (as SB3 does); ``reset(options={"reset_mask": m})`` alone resets with no options.

    :param env_fns: callables that each build a new ``gymnasium.Env`` (sent with cloudpickle).
    :param autoreset_mode: an ``AutoresetMode`` or its value (``"NextStep"``, ``"SameStep"``,
        ``"Disabled"``).
    :param copy: when True (default), observations returned are arrays of their own; when False
        they are views of the shared buffers that **the next step overwrites**.
    :param zero_copy: with ``copy=True``, observations handed out without a copy, in shared memory
        that no later step writes into while you hold them: as for :class:`shmvec.ShmVecEnv`
        (None, the default: on for observations of 32 KiB a step or more).
    :param n_workers, start_method, worker_threads, timeout, spin_us, mailbox_bytes: as for
        :class:`shmvec.ShmVecEnv`; so are further keyword arguments (``envs_per_worker``,
        ``cpu_affinity``, ``preload``, ...).  ``timeout`` breaks the vector env when workers do
        not answer in time; a wait's own ``timeout=`` does not.
    :param context: ``AsyncVectorEnv``'s name for ``start_method`` (give one, or the same).
    :param observation_mode: ``"same"`` (default): every env has the same observation space.
        ``"different"``: the envs' spaces may differ in bounds (``Box`` low/high, ``Discrete`` n), not
        in shapes, dtypes or structure, since each part of the observations is one buffer in shared
        memory; ``observation_space`` is then Gymnasium's ``batch_differing_spaces`` of them.
        ``(batched space, single space)``: taken as ``observation_space`` and
        ``single_observation_space``; every env's space must have the single space's shapes and dtypes.
    :param max_concurrency: at most this many envs step at once: each worker steps its envs one
        after another, so ``n_workers`` defaults to it (and may not exceed it).
    :param shared_memory: taken for ``AsyncVectorEnv``'s sake: shmvec always uses shared memory,
        and ``False`` changes nothing (results are the same either way).
    :param daemon: taken for ``AsyncVectorEnv``'s sake: the workers are always daemonic processes,
        so an env cannot start processes of its own (``daemon=False`` does not change that).
    :param worker: must be None: a custom worker is refused (ValueError), see above.

    :raises TypeError: ``env_fns`` is not a list of factories (the message says what to write), or
        an unknown keyword argument.
    :raises ValueError: an unknown ``autoreset_mode``; a custom ``worker``; ``context`` and
        ``start_method`` that disagree; a bad ``observation_mode`` or ``max_concurrency``.
    :raises SpaceError: the envs' spaces differ (beyond ``observation_mode``) or cannot live in
        shared memory (a ``RuntimeError``, as ``AsyncVectorEnv`` raises); a leaf without a fixed size
        (``Text``, ``Sequence``, ...) travels pickled, batched as a tuple.
    :raises WorkerDiedError: a worker died while starting.
    """

    _engine: Engine | None = None
    shared_memory = True  # always: AsyncVectorEnv's attribute
    daemon = True  # the workers always are
    worker = None

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        n_workers: int | None = None,
        start_method: str | None = None,
        worker_threads: int | None = 1,
        timeout: float | None = None,
        spin_us: float | tuple[float, float] | None = None,
        mailbox_bytes: int = P.MAILBOX_BYTES,
        *,
        context: str | None = None,
        observation_mode: str | tuple[gym.Space, gym.Space] = "same",
        max_concurrency: int | None = None,
        zero_copy: bool | None = None,
        shared_memory: bool = True,
        daemon: bool = True,
        worker: Any = None,
        **engine_kwargs: Any,
    ) -> None:
        owner = type(self)
        env_fns = factory_list(env_fns, owner.__name__, autoreset_mode)
        refuse_unknown_keywords(owner, engine_kwargs, ENGINE_OPTIONS)
        if isinstance(autoreset_mode, (bool, np.bool_)):
            raise TypeError(f"{owner.__name__}'s second argument is autoreset_mode, not AsyncVectorEnv's shared_memory "
                            "(got a bool): pass AsyncVectorEnv's options by keyword (shared_memory=, copy=, context=)")
        self.autoreset_mode = (
            autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        )
        start_method, n_workers, mode = async_vector_args(
            len(env_fns), start_method, context, worker, observation_mode, max_concurrency, n_workers,
            engine_kwargs.get("envs_per_worker"))
        self.copy = copy
        self.observation_mode = observation_mode
        self.max_concurrency = max_concurrency
        self._engine = engine = gym_engine(
            env_fns, _WORKER_MODE[self.autoreset_mode], owner.__name__, n_workers=n_workers,
            start_method=start_method, copy=copy, worker_threads=worker_threads, timeout=timeout, spin_us=spin_us,
            mailbox_bytes=mailbox_bytes, observation_mode=mode, zero_copy=zero_copy, **engine_kwargs,
        )
        self.num_envs = engine.num_envs
        self.zero_copy = engine.zero_copy  # the option, resolved
        self.context = engine.options.start_method
        self.metadata = dict(engine.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        try:
            self.render_mode = env_render_mode(engine)
        except BaseException:
            self.close()
            raise
        if isinstance(observation_mode, tuple):
            self.observation_space, self.single_observation_space = observation_mode
        elif observation_mode == "different":
            self.single_observation_space = engine.env_observation_spaces[0]
            self.observation_space = batch_differing_spaces(engine.env_observation_spaces)
        else:
            self.single_observation_space = engine.observation_space
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.single_action_space = engine.action_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        # DISABLED: envs that ended and were not reset since (stepping them is refused).
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)
        # step() in one call under the lock, unless a subclass changes step_async or step_wait.
        self._plain_step = owner.step_async is ShmVectorEnv.step_async and owner.step_wait is ShmVectorEnv.step_wait
        self._reset_mask: np.ndarray | None = None  # the mask of the reset_async() in flight

    @classmethod
    def from_id(
        cls,
        id: str | gym.envs.registration.EnvSpec,
        num_envs: int = 1,
        vector_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] | None = None,
        **kwargs: Any,
    ) -> "ShmVectorEnv":
        """As ``gymnasium.make_vec(id, num_envs, vector_kwargs=..., wrappers=..., **kwargs)``, on ShmVectorEnv.

        :param vector_kwargs: arguments of :class:`ShmVectorEnv` (``autoreset_mode``, ``n_workers``, ...).
        :param wrappers: wrapper callables applied to each env in its worker, in order.
        :param kwargs: passed to ``gymnasium.make`` for each env.
        """
        return make_vec(id, num_envs=num_envs, vector_kwargs=vector_kwargs, wrappers=wrappers, **kwargs)

    # ---- reset -------------------------------------------------------------------------------------------
    @serialized
    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``), as ``SyncVectorEnv.reset``.

        A step left in flight (a Ctrl-C, or ``step_async`` without ``step_wait``) is finished and dropped first.

        :param seed: None (unseeded), an int (env i gets ``seed + i``) or one seed (or None) per env.
        :param options: passed to each env's ``reset``; ``"reset_mask"`` (a bool array of shape
            ``(num_envs,)``) selects the envs to reset (the others keep their observation).
        :raises ValueError, TypeError: a seed list or reset mask of the wrong length, type or shape.
        :raises AlreadyPendingCallError: a ``reset_async`` or ``call_async`` is in flight.
        :raises ClosedVecEnvError, BrokenVecEnvError: the vector env is closed or broken.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
        """
        seeds, per_env, mask = self._reset_args(seed, options)
        engine = self._usable("reset", finish_step=True)
        return self._reset_return(engine.reset(seeds, per_env, mask), mask)

    @serialized
    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Starts the reset that :meth:`reset_wait` collects (the arguments and errors of :meth:`reset`)."""
        seeds, per_env, mask = self._reset_args(seed, options)
        engine = self._usable("reset_async", finish_step=True)
        engine.reset(seeds, per_env, mask, wait=False)
        self._reset_mask = mask

    @serialized
    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The ``(observations, infos)`` of the reset started by :meth:`reset_async`.

        :raises multiprocessing.TimeoutError: ``timeout`` seconds passed and workers still reset;
            the reset stays in flight (a later ``reset_wait()`` collects it).
        :raises NoAsyncCallError: no ``reset_async`` in flight.
        """
        engine = self._waiting_for("reset")
        return self._reset_return(engine.reset_wait(timeout), self._reset_mask)

    def _reset_args(self, seed: Any, options: dict[str, Any] | None) -> tuple[list, list, np.ndarray | None]:
        """Per-env seeds and options, and the reset mask, checked before anything is sent."""
        seeds = gym_vector_seeds(seed, self.num_envs)
        options, mask = gym_reset_mask(options, self.num_envs)
        return seeds, [options] * self.num_envs, mask

    def _reset_return(self, results: list[list], mask: np.ndarray | None) -> tuple[Any, dict[str, Any]]:
        if mask is None:
            self._ended[:] = False
        else:
            self._ended[mask] = False
        infos: dict[str, Any] = {}
        for items in results:
            for i, info in items:
                infos = self._add_info(infos, info, i)
        return self._observations(), infos

    # ---- step --------------------------------------------------------------------------------------------
    @serialized
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env with its action; returns (obs, rewards, terminated, truncated, infos).

        :raises ValueError: the actions do not fit the batched action space (their number included).
        :raises ShmVecEnvError: ``DISABLED`` autoreset and an env that ended was not reset.
        :raises ClosedVecEnvError, BrokenVecEnvError: the vector env is closed or broken.
        :raises AlreadyPendingCallError: a step (a Ctrl-C left it, or ``step_async``), a
            ``reset_async`` or a ``call_async`` is in flight.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
        """
        engine, own = self._engine, self.__dict__
        if engine is None or not self._plain_step or "step_async" in own or "step_wait" in own:
            self.step_async(actions)  # a subclass's or an object's own step_async/step_wait
            return self.step_wait()
        with engine.lock:  # (serialized, as every public call: shmvec._state, "Threads")
            if (engine.state is not IDLE or self.closed
                    or (self.autoreset_mode == AutoresetMode.DISABLED and self._ended.any())):
                self.step_async(actions)  # raises, with every check's message
                return self.step_wait()
            engine.post_step(actions)
            return self._collect_step(engine, None)

    @serialized
    def step_async(self, actions: Any) -> None:
        """Writes ``actions`` into shared memory and starts every worker (:meth:`step_wait` collects
        the step); the errors of :meth:`step`."""
        engine = self._usable("step_async")
        if self.autoreset_mode == AutoresetMode.DISABLED and self._ended.any():
            raise ShmVecEnvError(
                f"envs {np.flatnonzero(self._ended).tolist()} ended (terminated or truncated) and autoreset_mode is "
                "DISABLED: reset them with reset(options={'reset_mask': mask}) before the next step."
            )
        engine.post_step(actions)

    @serialized
    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The step started by :meth:`step_async` (or left in flight by a Ctrl-C or a timeout).

        :raises multiprocessing.TimeoutError: ``timeout`` seconds passed and workers still step;
            the step stays in flight (a later ``step_wait()`` collects it, ``reset()`` drops it).
        :raises NoAsyncCallError: no step in flight.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
        """
        engine = self._waiting_for("step")
        engine.check_poster("step_wait")
        return self._collect_step(engine, timeout)

    def _collect_step(self, engine: Engine, timeout: float | None) -> tuple:
        """The step in flight, waited for and returned; over once it returns or raises an Exception."""
        # A Ctrl-C here leaves the step in flight until its return is built: step_wait() collects
        # it, reset() finishes it and drops it.  A failed step (the engine is broken) leaves nothing.
        results = engine.complete_step(timeout)
        try:
            out = self._step_return(engine, results, self.autoreset_mode)
        except Exception:
            engine.finish_step()  # the step's own failure (an info Gymnasium's dicts cannot take): it is over
            raise
        engine.finish_step()
        return out

    def _step_return(self, engine: Engine, results: list[list], mode: AutoresetMode) -> tuple:
        """``step``'s return for the step just collected; run again if a Ctrl-C cut it short (the
        bookkeeping, ``_ended``, takes the same envs twice)."""
        # Copies; no local keeps a view of the shared block: a traceback that keeps this frame
        # (an info Gymnasium's _add_info cannot batch raises below) would keep it mapped after close().
        terminated = engine.terminated.copy()
        truncated = engine.truncated.copy()
        rewards = engine.rewards.copy()
        infos: dict[str, Any] = {}
        if mode == AutoresetMode.SAME_STEP:
            by_env = {i: (info, reset_info) for items in results for i, info, reset_info in items}
            ended = set(np.flatnonzero(terminated | truncated).tolist())
            for i in sorted(ended | set(by_env)):
                info, reset_info = by_env.get(i, ({}, None))
                if i in ended:
                    infos = self._add_info(infos, {"final_obs": engine.term_obs(i), "final_info": info}, i)
                    info = reset_info or {}
                infos = self._add_info(infos, info, i)
        else:
            for items in results:
                for i, info, _ in items:
                    infos = self._add_info(infos, info, i)
            if mode == AutoresetMode.DISABLED:
                self._ended |= terminated | truncated
        return self._observations(), rewards, terminated, truncated, infos

    # ---- calls to the envs -------------------------------------------------------------------------------
    @serialized
    def render(self) -> tuple[Any, ...] | None:
        """The frames of every env's ``render()``, as a tuple."""
        return tuple(self._usable("render").call(P.Call.RENDER, None, ()))

    @serialized
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or returns attribute ``name`` if it is not callable).

        :raises ValueError: ``name`` is ``reset``, ``step`` or ``close`` (call those directly), as AsyncVectorEnv.
        """
        _callable_by_name(name)
        return tuple(self._usable("call").call(P.Call.CALL, None, (name, args, kwargs)))

    @serialized
    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Starts :meth:`call` (``call_wait`` collects it); its arguments are pickled here, so one
        that does not pickle raises now and changes nothing."""
        _callable_by_name(name)
        self._usable("call_async").call_async(P.Call.CALL, None, (name, args, kwargs))

    @serialized
    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The answers of the call started by :meth:`call_async`, or an env's error (as :meth:`call`).

        :raises multiprocessing.TimeoutError: ``timeout`` seconds passed with answers missing;
            the call stays in flight (a later ``call_wait()`` collects it).
        :raises NoAsyncCallError: no ``call_async`` in flight.
        """
        return tuple(self._waiting_for("call").call_wait(timeout))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env, as Gymnasium does it (through :meth:`call`)."""
        return self.call(name)

    @serialized
    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute ``name`` of every env: one value each (a list or tuple), or the same value.

        :raises ValueError: a list or tuple whose length is not ``num_envs``.
        """
        values = per_env_values(values, self.num_envs)
        self._usable("set_attr").call(P.Call.SET_WRAPPER_ATTR, None, (name, values))

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The ``np_random_seed`` of every env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """The ``np_random`` generator of every env (copies: the envs' own live in the workers)."""
        return self.get_attr("np_random")

    @property
    def n_workers(self) -> int:
        return usable_engine(self).n_workers

    # ---- as plain data -----------------------------------------------------------------------------------
    @serialized
    def describe(self) -> dict[str, Any]:
        """This vector env as plain data, as ``ShmVecEnv.describe`` (docs/multiprocessing.md), with
        the face's options and no seed (it goes to ``reset``); :raises DescriptionError: as there."""
        engine = usable_engine(self)
        if not isinstance(self.observation_mode, str):
            raise DescriptionError("option observation_mode is a pair of spaces, not plain data: pass them again to "
                                   "the rebuilt one, ShmVectorEnv.from_description(d, observation_mode=(...))")
        options = {**engine.options.given, "autoreset_mode": self.autoreset_mode.value,
                   "observation_mode": self.observation_mode, "max_concurrency": self.max_concurrency}
        return describe_vec_env(engine.descriptions, options, n_envs=self.num_envs, n_workers=engine.n_workers,
                                start_method=engine.options.start_method, seed=None, options=None,
                                decided=engine.explain(), vec_env=DESCRIBED_AS)

    @serialized
    def decided(self) -> dict[str, Any]:
        """What the defaults became on this machine, and why, as ``ShmVecEnv.decided``."""
        return decided_of(self)

    @classmethod
    def from_description(cls, description: dict[str, Any], **overrides: Any) -> ShmVectorEnv:
        """The vector env :meth:`describe` described (``overrides`` replace options); :raises
        DescriptionError: not a ShmVectorEnv's description (``shmvec.rebuild(d)`` builds any)."""
        return rebuild(description, cls, DESCRIBED_AS, **overrides)

    # ---- the end -----------------------------------------------------------------------------------------
    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stops the workers and frees the shared memory (``close()`` calls it once; its keyword
        arguments come here).  A step or ``reset_async`` in flight is finished first.

        :param timeout: seconds to wait for that (default 5; then the workers are terminated).
        :param terminate: terminate the workers at once (the envs' ``close()`` does not run).
        """
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close(terminate=terminate, timeout=timeout)

    def __enter__(self) -> "ShmVectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True) and self._engine is not None:
            try:
                self.close()
            except Exception:
                pass

    # ---- internals ---------------------------------------------------------------------------------------
    def _usable(self, what: str, finish_step: bool = False) -> Engine:
        """The engine, if it can take ``what``.  A step left in flight (a Ctrl-C, ``step_async``
        without ``step_wait``, a ``step_wait`` past its timeout) is finished and dropped when
        ``finish_step`` (reset); anything else in flight raises AlreadyPendingCallError, in
        Gymnasium's words and then ours."""
        engine = usable_engine(self)
        pending = engine.in_flight_call
        if pending == "step" and finish_step:
            engine.complete_step()  # raises what the step raised (the env is then broken)
            if self.autoreset_mode == AutoresetMode.DISABLED:  # the envs that ended in it still need a reset
                self._ended |= engine.terminated | engine.truncated
            engine.finish_step()
        elif pending is not None:
            hint = ("step_async() not collected yet by step_wait(), or a step interrupted by Ctrl-C: call "
                    "step_wait() to collect it, or call reset() (it finishes the step and drops it)"
                    if pending == "step" else f"call {pending}_wait() to collect it")
            raise AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{pending}` to complete ({hint}).", pending)
        return engine

    def _waiting_for(self, pending: str) -> Engine:
        """The engine, if ``pending`` ("step", "reset", "call") is in flight; NoAsyncCallError otherwise."""
        engine = usable_engine(self)
        if engine.in_flight_call != pending:
            raise NoAsyncCallError(f"Calling `{pending}_wait` without any prior call to `{pending}_async`.", pending)
        return engine

    def _observations(self) -> Any:
        engine = self._engine
        assert engine is not None
        return engine.obs_out(self.copy)


def _callable_by_name(name: str) -> None:
    """``call(name)`` refuses the env methods that have vector counterparts, as AsyncVectorEnv's worker does."""
    if name in _NOT_BY_CALL:
        raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` directly instead.")


def make_vec(
    id: str | gym.envs.registration.EnvSpec,
    num_envs: int = 1,
    vectorization_mode: str | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] | None = None,
    *,
    autoreset_mode: str | AutoresetMode | None = None,
    **kwargs: Any,
) -> ShmVectorEnv:
    """``gymnasium.make_vec`` with :class:`ShmVectorEnv` as the vectorizer (same signature).

    Each worker builds its envs with ``gymnasium.make(id, **kwargs)`` followed by ``wrappers``;
    ``vector_kwargs`` go to :class:`ShmVectorEnv`.  ``id`` may be ``"module:Env-v0"`` (the module
    is imported first) or an ``EnvSpec``, also the ``spec`` of a vector env made by this function
    (its ``num_envs``, ``vector_kwargs`` and ``wrappers`` are taken from it, as Gymnasium does).
    The returned env's ``spec`` records the arguments, as ``gymnasium.make_vec`` does.

    :param vectorization_mode: ``None``, ``"shmvec"`` or ``"async"``: all three vectorize with
        ``ShmVectorEnv`` (``"async"`` is taken so that ``gym.make_vec(..., vectorization_mode="async")``
        becomes ``shmvec.make_vec(...)`` by changing the function alone; ShmVectorEnv is
        asynchronous in the same sense, its workers step while the caller waits).  For
        ``"sync"`` and ``"vector_entry_point"`` call ``gymnasium.make_vec``.
    :param autoreset_mode: ``ShmVectorEnv``'s ``autoreset_mode`` (``"NextStep"``, ``"SameStep"``,
        ``"Disabled"`` or an ``AutoresetMode``), as a plain keyword; the same as
        ``vector_kwargs={"autoreset_mode": ...}`` (TorchRL's ``GymWrapper`` needs ``"SameStep"``
        or ``"Disabled"``).
    :raises gymnasium.error.Error: an unknown id, or an id that is neither a str nor an EnvSpec.
    :raises ValueError: another ``vectorization_mode``; ``autoreset_mode`` given twice (here and
        in ``vector_kwargs``) with different values.
    """
    if isinstance(id, gym.envs.registration.EnvSpec):
        env_spec = id
    elif isinstance(id, str):
        find = getattr(gym.envs.registration, "_find_spec", gym.spec)  # "module:Env-v0" imports the module
        env_spec = find(id)
    else:
        raise gym.error.Error(f"Invalid id type: {type(id).__name__}. Expected `str` or `EnvSpec`")
    env_spec = _copy.deepcopy(env_spec)
    env_kwargs = dict(env_spec.kwargs)
    env_spec.kwargs = {}
    # A vector env's own spec (this function's, or gymnasium.make_vec's) carries these: as Gymnasium
    # does, they are arguments of the vectorization, not of the env.
    num_envs = env_kwargs.pop("num_envs", num_envs)
    vectorization_mode = env_kwargs.pop("vectorization_mode", vectorization_mode)
    vector_kwargs = env_kwargs.pop("vector_kwargs", vector_kwargs)
    wrappers = env_kwargs.pop("wrappers", wrappers)
    env_kwargs.update(kwargs)
    mode = getattr(vectorization_mode, "value", vectorization_mode)
    if mode not in (None, "shmvec", "async"):
        raise ValueError(
            f"shmvec.make_vec vectorizes with ShmVectorEnv (vectorization_mode None, 'shmvec' or 'async'), got "
            f"vectorization_mode={vectorization_mode!r}: for 'sync' and 'vector_entry_point' call gymnasium.make_vec"
        )
    vector_kwargs = dict(vector_kwargs or {})
    if autoreset_mode is not None:
        given = vector_kwargs.get("autoreset_mode")
        if given is not None and AutoresetMode(getattr(given, "value", given)) != AutoresetMode(
                getattr(autoreset_mode, "value", autoreset_mode)):
            raise ValueError(f"autoreset_mode={autoreset_mode!r} and vector_kwargs['autoreset_mode']={given!r} differ")
        vector_kwargs["autoreset_mode"] = autoreset_mode
    wrappers = list(wrappers or [])
    # gym.make(env_spec, **env_kwargs), then the wrappers, as one factory of plain data (the spec
    # resolved here, "__main__:Name" objects provided in the workers): describe() can write it
    # unless a wrapper is a lambda or lives in __main__.
    factory = make_env(env_spec, wrappers=[(w, {}) for w in wrappers], **env_kwargs)
    env = ShmVectorEnv([factory] * num_envs, **vector_kwargs)
    spec = _copy.deepcopy(env_spec)
    spec.kwargs = dict(env_kwargs)
    if num_envs != 1:
        spec.kwargs["num_envs"] = num_envs
    spec.kwargs["vectorization_mode"] = "shmvec"
    if vector_kwargs:
        spec.kwargs["vector_kwargs"] = vector_kwargs
    if wrappers:
        spec.kwargs["wrappers"] = wrappers
    env.spec = spec
    return env
