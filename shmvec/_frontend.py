"""What the front-ends share: helpers over the engine's public surface that more than one face uses.

A front-end module holds its class; anything two faces need lives here, so that no front-end
imports another's module for a helper (and so that ``ShmParallelEnv``, which needs no
Stable-Baselines3, does not import the SB3 faces' modules):

- :func:`served_masks`, :func:`rendered_images`: action masks in shared memory, SB3's ``get_images``
  (``ShmVecEnv``, ``ShmMultiAgentVecEnv``, ``ShmParallelEnv``);
- :func:`agents_engine`, :func:`obs_leaves`, :func:`agent_step_values`: the multi-agent faces'
  construction and reading of the stacked per-agent values (``ShmMultiAgentVecEnv``, ``ShmParallelEnv``).
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shmvec import _protocol as P
from shmvec._agents import AgentsFactory
from shmvec._engine import Engine
from shmvec._errors import ShmVecEnvError
from shmvec._restarts import RESTART_INFO_KEY

__all__ = ["FLAG_KEYS", "agent_step_values", "agents_engine", "obs_leaves", "rendered_images", "served_masks"]


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
            if engine.status.failure is None:  # one worker's envs failed: the others go back to off
                engine.call(P.Call.ACTION_MASKS_OFF, None, ())
            raise
        engine.masks_live = True
    return engine.views.mask


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
    factories = [AgentsFactory(fn, i, pad) for i, fn in enumerate(env_fns)]
    engine = Engine(factories, batch_dict=collections.OrderedDict, public_name=public_name, **options)
    try:
        agents = list(engine.call(P.Call.GET_ATTR, [0], ("possible_agents",))[0])
    except BaseException:
        engine.close()
        raise
    return engine, agents


def obs_leaves(engine: Engine) -> dict:
    """The buffers of the stacked observations of the last step or reset: block 0, or the lease
    block the workers wrote them to (``zero_copy``, shmvec._leases)."""
    leases = engine.leases
    return engine.views.obs_blocks[leases.block] if leases is not None else engine.views.obs


def agent_step_values(engine: Engine, results: list[list]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the envs that ended this step, the step's per-agent ``rew``/``term``/``trunc``/``active``
    as new ``(n_envs, n_agents)`` arrays).  An env that ended has been reset already, so its
    values are read from the terminal stack; a restarted env's (whose last stack is that of the
    step before: nothing new happened) have reward 0 and every agent truncated, not terminated (a
    restart cuts the episode: docs/failures.md, as for single-agent envs)."""
    views, leaves = engine.views, obs_leaves(engine)
    ended = np.flatnonzero(views.terminated | views.truncated)
    values = {}
    for key in FLAG_KEYS:
        arr = leaves[(key,)].copy()
        if ended.size:
            arr[ended] = views.term_obs[(key,)][ended]
        values[key] = arr
    for items in results:
        for e, info, _ in items:
            if info and RESTART_INFO_KEY in info:
                values["rew"][e] = 0.0
                values["term"][e], values["trunc"][e] = False, True
    return ended, values
