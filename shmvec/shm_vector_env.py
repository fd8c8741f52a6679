"""ShmVectorEnv: a Gymnasium ``VectorEnv`` on the same shared-memory engine as ``ShmVecEnv``.

It holds an :class:`shmvec._engine.Engine` (as ``ShmVecEnv`` does), built with the worker
autoreset mode that matches Gymnasium's ``AutoresetMode``, and only turns its raw results (shared
buffers plus the sparse infos the workers sent) into Gymnasium's batched return values.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from shmvec import _protocol as P
from shmvec._copyguard import Uncopyable
from shmvec._engine import Engine
from shmvec._errors import AlreadyPendingCallError, ClosedVecEnvError, ShmVecEnvError
from shmvec._state import serialized

_WORKER_MODE = {
    AutoresetMode.NEXT_STEP: P.AUTORESET_NEXT_STEP,
    AutoresetMode.SAME_STEP: P.AUTORESET_SAME_STEP,
    AutoresetMode.DISABLED: P.AUTORESET_DISABLED,
}


def usable_engine(owner: Any) -> Engine:
    """``owner._engine`` (of ShmVectorEnv or ShmEnvPool) when it can take a call; raises otherwise."""
    engine = owner._engine
    if engine is None or owner.closed:
        raise ClosedVecEnvError(f"this {type(owner).__name__} is closed; build a new one")
    engine.check_usable()
    return engine


def per_env_values(values: Any, num_envs: int) -> list:
    """set_attr's values of the Gymnasium-style faces: one per env (a list or tuple), or one for all."""
    if not isinstance(values, (list, tuple)):
        return [values] * num_envs
    if len(values) != num_envs:
        raise ValueError(f"{len(values)} values for {num_envs} envs")
    return list(values)


def gym_vector_seeds(seed: Any, num_envs: int) -> list:
    """reset's ``seed`` of the Gymnasium-style faces as one seed (or None) per env: None (unseeded),
    an int (env i gets ``seed + i``, as Gymnasium's vector envs) or a list of one per env."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        seeds = [int(seed) + i for i in range(num_envs)]
    else:
        seeds = list(seed)
        if len(seeds) != num_envs:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={num_envs} but got length={len(seeds)}."
            )
    # Checked here, as each env's reset would (Gymnasium's np_random), so that a bad seed breaks
    # nothing: raised in a worker, it would break the vector env.  numpy ints are taken as ints.
    for i, s in enumerate(seeds):
        if s is None:
            continue
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise gym.error.Error(f"Seed must be a python integer, actual type: {type(s)} (env {i})")
        seeds[i] = s = int(s)
        if s < 0:
            raise gym.error.Error(f"Seed must be greater or equal to zero, actual value: {s} (env {i})")
    return seeds


def gym_engine(env_fns: Sequence[Callable[[], gym.Env]], autoreset: str, owner: str, **options: Any) -> Engine:
    """An engine for the Gymnasium-style faces (ShmVectorEnv, the pools): a plain dict batch, no
    SB3 (so no torch in the parent), no restarts, masks only through ``call``."""
    options.setdefault("action_masks", False)  # Gymnasium's API has no env_method("action_masks") fast path
    return Engine(env_fns, batch_dict=dict, autoreset=autoreset, public_name=owner, restartable=False, **options)


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

    One difference from ``SyncVectorEnv``: an empty ``options`` dict is not passed on to the envs'
    ``reset`` (as SB3 does); ``reset(options={"reset_mask": m})`` alone resets with no options.

    :param env_fns: callables that each build a new ``gymnasium.Env`` (sent with cloudpickle).
    :param autoreset_mode: an ``AutoresetMode`` or its value (``"NextStep"``, ``"SameStep"``,
        ``"Disabled"``).
    :param copy: when True (default), observations returned are arrays of their own; when False
        they are views of the shared buffers that **the next step overwrites**.
    :param n_workers, start_method, worker_threads, timeout, spin_us, mailbox_bytes: as for
        :class:`shmvec.ShmVecEnv`; so are further keyword arguments (``envs_per_worker``,
        ``cpu_affinity``, ``preload``, ...).

    :raises TypeError: ``env_fns`` holds something that is not callable.
    :raises ValueError: an unknown ``autoreset_mode``.
    :raises SpaceError: the envs' spaces differ or are not Gymnasium spaces (a space without a
        fixed size, ``Text``, ``Sequence``, ...: its values travel pickled, batched as a tuple).
    :raises WorkerDiedError: a worker died while starting.
    """

    _engine: Engine | None = None

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
        **engine_kwargs: Any,
    ) -> None:
        self.autoreset_mode = (
            autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        )
        self.copy = copy
        self._engine = engine = gym_engine(
            env_fns, _WORKER_MODE[self.autoreset_mode], type(self).__name__, n_workers=n_workers,
            start_method=start_method, copy=copy, worker_threads=worker_threads, timeout=timeout, spin_us=spin_us,
            mailbox_bytes=mailbox_bytes, **engine_kwargs,
        )
        self.num_envs = engine.num_envs
        self.metadata = dict(engine.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        try:
            self.render_mode = engine.env_render_mode()
        except BaseException:
            self.close()
            raise
        self.single_observation_space = engine.observation_space
        self.single_action_space = engine.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        # DISABLED: envs that ended and were not reset since (stepping them is refused).
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)

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

    # ---- Gymnasium VectorEnv API -----------------------------------------------------------------------
    @serialized
    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``), as ``SyncVectorEnv.reset``.

        :param seed: None (unseeded), an int (env i gets ``seed + i``) or one seed (or None) per env.
        :param options: passed to each env's ``reset``; ``"reset_mask"`` (a bool array of shape
            ``(num_envs,)``) selects the envs to reset (the others keep their observation).
        :raises ValueError, TypeError: a seed list or reset mask of the wrong length, type or shape.
        :raises ClosedVecEnvError, BrokenVecEnvError: the vector env is closed or broken.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
        """
        seeds = gym_vector_seeds(seed, self.num_envs)
        engine = self._usable(finish_step=True)
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (self.num_envs,):
                raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
            if not np.any(mask):
                raise ValueError(
                    "`options['reset_mask']` must contain a boolean array with at least one True value, "
                    f"got reset_mask={mask}"
                )
        results = engine.reset(seeds, [options] * self.num_envs, mask)
        if mask is None:
            self._ended[:] = False
        else:
            self._ended[mask] = False
        infos: dict[str, Any] = {}
        for items in results:
            for i, info in items:
                infos = self._add_info(infos, info, i)
        return self._observations(), infos

    @serialized
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env with its action; returns (obs, rewards, terminated, truncated, infos).

        :raises ValueError: the actions do not fit the batched action space.
        :raises ShmVecEnvError: ``DISABLED`` autoreset and an env that ended was not reset.
        :raises ClosedVecEnvError, BrokenVecEnvError: the vector env is closed or broken.
        :raises AlreadyPendingCallError: a step interrupted by Ctrl-C is still in flight: call
            ``reset()``, which finishes it and drops it.
        :raises WorkerDiedError: a worker died; the original exception type if an env raised.
        """
        engine = self._usable()
        mode = self.autoreset_mode
        if mode == AutoresetMode.DISABLED and self._ended.any():
            raise ShmVecEnvError(
                f"envs {np.flatnonzero(self._ended).tolist()} ended (terminated or truncated) and autoreset_mode is "
                "DISABLED: reset them with reset(options={'reset_mask': mask}) before the next step."
            )
        # A Ctrl-C once the step is posted leaves it in flight until its return is built:
        # reset() finishes it and drops it.  Refused actions (nothing posted) and a failed step
        # (the engine is broken) leave nothing in flight.
        engine.post_step(actions)
        results = engine.complete_step()
        try:
            out = self._step_return(engine, results, mode)
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
        terminated = engine.views.terminated.copy()
        truncated = engine.views.truncated.copy()
        rewards = engine.views.rew.copy()
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

    @serialized
    def render(self) -> tuple[Any, ...] | None:
        """The frames of every env's ``render()``, as a tuple."""
        return tuple(self._usable().call(P.Call.RENDER, None, ()))

    @serialized
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or returns attribute ``name`` if it is not callable)."""
        return tuple(self._usable().call(P.Call.CALL, None, (name, args, kwargs)))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env, as Gymnasium does it (through :meth:`call`)."""
        return self.call(name)

    @serialized
    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute ``name`` of every env: one value each (a list or tuple), or the same value.

        :raises ValueError: a list or tuple whose length is not ``num_envs``.
        """
        engine = self._usable()
        if not isinstance(values, (list, tuple)):
            values = [values for _ in range(self.num_envs)]
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        engine.call(P.Call.SET_WRAPPER_ATTR, None, (name, list(values)))

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The ``np_random_seed`` of every env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """The ``np_random`` generator of every env (copies: the envs' own live in the workers)."""
        return self.get_attr("np_random")

    def close_extras(self, **kwargs: Any) -> None:
        """Stops the workers and frees the shared memory (``close()`` calls it once)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    @property
    def n_workers(self) -> int:
        return self._usable().n_workers

    # ---- internals ------------------------------------------------------------------------------------
    def _usable(self, finish_step: bool = False) -> Engine:
        """The engine, if it can take a call.  A step that a Ctrl-C left in flight (Gymnasium's
        API has no step_wait() to collect it) is finished and dropped by ``finish_step`` (reset);
        any other call raises AlreadyPendingCallError saying to reset."""
        engine = usable_engine(self)
        if engine.status.waiting:
            if not finish_step:
                raise AlreadyPendingCallError(
                    f"a step interrupted (Ctrl-C) is still in flight in this {type(self).__name__}: call reset() "
                    "(it finishes the step and drops it), or close()")
            engine.complete_step()  # raises what the step raised (the env is then broken)
            if self.autoreset_mode == AutoresetMode.DISABLED:  # the envs that ended in it still need a reset
                self._ended |= engine.views.terminated | engine.views.truncated
            engine.finish_step()
        return engine

    def _observations(self) -> Any:
        engine = self._engine
        assert engine is not None
        return engine.obs_copy(slice(None)) if self.copy else engine.obs_view(slice(None))

    def __del__(self) -> None:
        if not getattr(self, "closed", True) and self._engine is not None:
            try:
                self.close()
            except Exception:
                pass


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

    def create_single_env() -> gym.Env:
        env = gym.make(env_spec, **env_kwargs)
        for wrapper in wrappers:
            env = wrapper(env)
        return env

    env = ShmVectorEnv([create_single_env for _ in range(num_envs)], **vector_kwargs)
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
