"""What the front-ends share: helpers over the engine's public surface that more than one face uses.

A front-end module holds its class; anything two faces need lives here, so that no front-end
imports another's module for a helper (and so that ``ShmParallelEnv``, which needs no
Stable-Baselines3, does not import the SB3 faces' modules):

- :func:`served_masks`, :func:`rendered_images`: action masks in shared memory, SB3's ``get_images``
  (``ShmVecEnv``, ``ShmMultiAgentVecEnv``, ``ShmParallelEnv``);
- :func:`agents_engine`, :func:`agent_step_values`: the multi-agent faces' construction and
  reading of the stacked per-agent values (``ShmMultiAgentVecEnv``, ``ShmParallelEnv``);
- :func:`gym_engine`, :func:`usable_engine`, :func:`env_render_mode`, :func:`refuse_unknown_keywords`
  and ``ENGINE_OPTIONS``: the Gymnasium-style faces' construction and use of their engine
  (``ShmVectorEnv``, ``ShmEnvPool``);
- :func:`checked_send_ids`, :func:`by_env_id`, :class:`InfoBatch`: a pool's ``send`` ids, its
  action errors by env id, its batched infos (``ShmEnvPool``, ``shmvec.ray_pool.RayShmEnvPool``);
- :func:`batch_rows`: rows of a batch nested like its space (dicts and tuples of arrays), the
  one indexer of the faces that reorder, split or join batches (``ShmVecEnvPool``, the Ray faces).

The rules every face applies to its arguments live lower, where the engine's parts and the Ray
faces reach them too: ``env_fns`` (:func:`shmvec.factories.factory_list`), seeds, one value per
env and SB3's ``indices`` (:mod:`shmvec._seeds`), the cast of actions (:mod:`shmvec._actions`).
"""

from __future__ import annotations

import collections
import difflib
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from shmvec import _protocol as P
from shmvec._agents import AgentsFactory
from shmvec._describe import decided_data
from shmvec._engine import Engine
from shmvec._errors import ClosedVecEnvError, InvalidActionError, ShmVecEnvError
from shmvec._options import Options
from shmvec._queue import send_ids_valid
from shmvec._restarts import RESTART_INFO_KEY
from shmvec.factories import factory_list

__all__ = ["ENGINE_OPTIONS", "FLAG_KEYS", "InfoBatch", "agent_step_values", "agents_engine", "batch_rows", "by_env_id",
           "checked_send_ids", "env_render_mode", "gym_engine", "refuse_unknown_keywords",
           "rendered_images", "served_masks", "usable_engine"]


def served_masks(engine: Engine, owner: str) -> np.ndarray:
    """The mask buffer in shared memory (a view), the workers writing into it from now on (the
    first ask turns them on: shmvec._masks).

    :raises ShmVecEnvError: action masks are off for this vec env (``owner``: the class in hand).
    :raises ClosedVecEnvError, BrokenVecEnvError, AlreadyPendingCallError: misuse.
    """
    engine.check_usable()
    if not engine.masks_in_shm:
        raise ShmVecEnvError(
            f"action masks are off for this {owner} (its envs have no action_masks() method, or "
            "action_masks=False): call env_method('action_masks') instead.")
    engine.check_idle("action_masks")
    if not engine.masks_live:  # the first ask: the workers write them now, and after every step
        try:
            engine.call(P.Call.ACTION_MASKS, None, ())
        except Exception:
            if engine.failure is None:  # one worker's envs failed: the others go back to off
                engine.call(P.Call.ACTION_MASKS_OFF, None, ())
            raise
        engine.masks_live = True
    return engine.mask_buffer


def rendered_images(engine: Engine, render_mode: str | None, n_envs: int) -> list:
    """SB3's ``VecEnv.get_images``: each env's ``render()``, or ``n_envs`` Nones (with SB3's warning)
    when the render mode is not ``rgb_array``."""
    if render_mode != "rgb_array":
        warnings.warn(f"The render mode is {render_mode}, but this method assumes it is `rgb_array` to obtain images.")
        return [None for _ in range(n_envs)]
    return engine.call(P.Call.RENDER, None, ())


FLAG_KEYS = ("rew", "term", "trunc", "active")


def agents_engine(env_fns: Sequence[Callable[[], Any]], pad: bool, public_name: str,
                  **options: Any) -> tuple[Engine, list[str]]:
    """An :class:`Engine` of :class:`shmvec._agents.AgentsEnv`s built from ``env_fns``, and the
    envs' ``possible_agents`` (the multi-agent front-ends' shared construction).  ``options``
    are the engine's (every ``ShmVecEnv`` option).  Closes what it built if reading the agents
    fails."""
    env_fns = factory_list(env_fns, public_name, agents=True)
    factories = [AgentsFactory(fn, i, pad) for i, fn in enumerate(env_fns)]
    engine = Engine(factories, batch_dict=collections.OrderedDict, public_name=public_name, **options)
    try:
        agents = list(engine.call(P.Call.GET_ATTR, [0], ("possible_agents",))[0])
    except BaseException:
        engine.close()
        raise
    return engine, agents


def agent_step_values(engine: Engine, results: list[list]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the envs that ended this step, the step's per-agent ``rew``/``term``/``trunc``/``active``
    as new ``(n_envs, n_agents)`` arrays).  An env that ended has been reset already, so its
    values are read from the terminal stack; a restarted env's (whose last stack is that of the
    step before: nothing new happened) have reward 0 and every agent truncated, not terminated (a
    restart cuts the episode: docs/failures.md, as for single-agent envs)."""
    leaves = engine.obs_buffers()[0]  # (block 0, or the lease block the workers wrote them to: zero_copy)
    ended = np.flatnonzero(engine.terminated | engine.truncated)
    values = {}
    for key in FLAG_KEYS:
        arr = leaves[(key,)].copy()
        if ended.size:
            arr[ended] = engine.term_buffers[(key,)][ended]
        values[key] = arr
    for items in results:
        for e, info, _ in items:
            if info and RESTART_INFO_KEY in info:
                values["rew"][e] = 0.0
                values["term"][e], values["trunc"][e] = False, True
    return ended, values


# ---- the Gymnasium-style faces (ShmVectorEnv, ShmEnvPool) --------------------------------------------
# The engine options a user may pass by keyword (those of Options.build that the faces do not set themselves).
ENGINE_OPTIONS = frozenset(inspect.signature(Options.build).parameters) - {"env_fns", "autoreset", "public_name",
                                                                         "restartable"}


def gym_engine(env_fns: Sequence[Callable[[], gym.Env]], autoreset: str, owner: str, **options: Any) -> Engine:
    """An engine for the Gymnasium-style faces (ShmVectorEnv, the pools): a plain dict batch, no
    SB3 (so no torch in the parent), no restarts, masks only through ``call``."""
    options.setdefault("action_masks", False)  # Gymnasium's API has no env_method("action_masks") fast path
    return Engine(env_fns, batch_dict=dict, autoreset=autoreset, public_name=owner, restartable=False, **options)


def usable_engine(owner: Any) -> Engine:
    """``owner._engine`` (of ShmVectorEnv or ShmEnvPool) when it can take a call; raises otherwise."""
    engine = owner._engine
    if engine is None or owner.closed:
        raise ClosedVecEnvError(f"this {type(owner).__name__} is closed; build a new one")
    engine.check_usable()
    return engine


def decided_of(owner: Any) -> dict[str, Any]:
    """Every face's ``decided()``: what the defaults became on this machine (the workers, their
    spin, torch's threads in this process, where the workers run), and why, as plain data."""
    return decided_data(usable_engine(owner).explain())


def env_render_mode(engine: Engine) -> str | None:
    """The envs' common ``render_mode`` (as SB3's ``VecEnv.__init__`` finds it), for the faces
    that are not SB3's: a warning and None if the envs have none."""
    try:
        modes = engine.call(P.Call.GET_ATTR, None, ("render_mode",))
    except AttributeError:
        warnings.warn("The `render_mode` attribute is not defined in your environment. It will be set to None.")
        modes = [None] * engine.num_envs
    if not all(mode == modes[0] for mode in modes):
        raise ValueError(f"render_mode should be the same for all environments, got {modes}")
    return modes[0]


def refuse_unknown_keywords(owner: type, given: dict[str, Any], known: Any) -> None:
    """Python's own TypeError for a keyword that neither ``owner.__init__`` nor the engine takes,
    naming ``owner.__init__()`` (not the engine's function it would reach), with the nearest name."""
    for name in given:
        if name not in known:
            names = sorted(set(known) | set(inspect.signature(owner.__init__).parameters) - {"self", "engine_kwargs"})
            near = difflib.get_close_matches(name, names, n=1)
            raise TypeError(f"{owner.__name__}.__init__() got an unexpected keyword argument {name!r}"
                            + (f"; did you mean {near[0]!r}?" if near else ""))


# ---- the pools (ShmEnvPool, RayShmEnvPool) -----------------------------------------------------------
class InfoBatch:
    """Stands in for a VectorEnv of ``batch_size`` envs so that Gymnasium's own ``_add_info`` builds the infos."""

    def __init__(self, n: int) -> None:
        self.num_envs = n

    _add_info = VectorEnv._add_info


def by_env_id(exc: InvalidActionError, ids: np.ndarray) -> InvalidActionError:
    """``exc`` (raised for rows of a ``send``'s actions) naming env ``ids[row]`` instead of the rows."""
    env_ids = [int(ids[r]) for r in exc.env_indices]
    return InvalidActionError(f"{exc} (rows {list(exc.env_indices)} of this send(): env ids {env_ids})", env_ids)


def checked_send_ids(env_ids: Any, num_envs: int, in_flight: np.ndarray) -> np.ndarray:
    """``env_ids`` of a ``send`` as int64 indices (None: every env), checked once here.

    :raises ValueError: an id that is not an integer, out of ``[0, num_envs)``, repeated, or of an
        env in flight already.
    """
    if env_ids is None:
        ids = np.arange(num_envs, dtype=np.int64)
    else:
        ids = np.asarray(env_ids)
        if ids.ndim > 1:
            raise ValueError(f"env_ids must be a 1-D sequence of env indices, got shape {ids.shape}")
        ids = ids.reshape(-1)
        if ids.size and ids.dtype.kind not in "iu":  # 0.7 or "3" truncated, a bool mask read as 0/1
            raise ValueError(f"env_ids must be integers, got {ids.tolist()} ({ids.dtype})")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
    if send_ids_valid(in_flight.view(np.uint8), ids):  # the usual case, in one C pass
        return ids
    if ids.size and (ids.min() < 0 or ids.max() >= num_envs):
        raise ValueError(f"env_ids must be in [0, {num_envs}), got {ids.tolist()}")
    if np.unique(ids).size != ids.size:
        raise ValueError(f"env_ids must be distinct, got {ids.tolist()}")
    busy = ids[in_flight[ids]]
    if busy.size:
        raise ValueError(f"envs {busy.tolist()} are in flight already (sent and not received yet): recv() them first")
    return ids


# ---- batches nested like their space -----------------------------------------------------------------
def batch_rows(batch: Any, index: Any, copy: bool = False) -> Any:
    """``batch[index]`` for a batch nested like its space: each leaf of its dicts and tuples
    indexed by ``index`` (an env's row, a slice, an array of rows), the nesting kept (a dict is
    returned as a plain dict).  A slice keeps a leaf's type (a list stays a list); any other
    index reads the leaf as an array.  ``copy``: arrays of their own even where numpy would
    give a view (an int or a slice)."""
    if isinstance(batch, dict):
        return {key: batch_rows(value, index, copy) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(batch_rows(value, index, copy) for value in batch)
    out = batch[index] if isinstance(index, slice) else np.asarray(batch)[index]
    return np.array(out) if copy else out
