"""Action masks in shared memory, for sb3-contrib's ``MaskablePPO``.

``MaskablePPO`` asks the vec env for ``env_method("action_masks")`` before
every step.  Through a pipe that is one round trip per worker per step.  When
masks are on, each worker instead calls ``env.action_masks()`` right after the
env's ``reset``/``step`` (after the automatic reset that ends an episode, as
``DummyVecEnv`` would see it) and writes the result into a bool buffer of
shape ``(n_envs, mask_size)`` in the shared block; the parent answers
``env_method("action_masks")`` from that buffer without talking to anyone.

By default (``action_masks=None``) the buffer exists from the start but the
workers write nothing until masks are first asked for: the parent then sends
one "action_masks" pipe command, each worker writes its envs' current masks and
goes on after every step and reset.  Until then no ``action_masks()`` runs, as
with ``DummyVecEnv``: a mask method with side effects (one that draws from
``np_random``) must not change the episodes of an algorithm that never asks.
A restarted worker attaches with the state the parent has.

A mask is flat, as ``MaskablePPO`` flattens it anyway: ``n`` entries for
``Discrete(n)``, ``sum(nvec)`` for ``MultiDiscrete(nvec)``, ``2 * n`` for
``MultiBinary(n)`` (MaskablePPO's layout for each of them).  This module
imports nothing heavy (workers import it).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec._errors import ObservationError, SpaceError

METHOD = "action_masks"


def mask_size(action_space: spaces.Space) -> int | None:
    """Entries of a flat mask for ``action_space``; None when MaskablePPO cannot mask it."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    if isinstance(action_space, spaces.MultiBinary):
        return 2 * int(np.prod(action_space.shape))
    return None


def has_action_masks(env: gym.Env) -> bool:
    """Whether ``env`` (or a wrapper of it) has a callable ``action_masks``."""
    try:
        return callable(env.get_wrapper_attr(METHOD))
    except AttributeError:
        return False


def resolve(requested: bool | None, envs_have_masks: bool, action_space: spaces.Space) -> int:
    """The mask size the vec env uses (0: masks off), from the user's ``action_masks`` option.

    :raises SpaceError: masks were asked for (True) but the envs have no ``action_masks``
        method or the action space cannot be masked.
    """
    if requested is False:
        return 0
    size = mask_size(action_space)
    if requested is None:
        return size if (envs_have_masks and size) else 0
    if not envs_have_masks:
        raise SpaceError(
            "action_masks=True, but the envs have no action_masks() method: add one to the env (or a wrapper, "
            "e.g. sb3_contrib's ActionMasker), or leave action_masks at None."
        )
    if not size:
        raise SpaceError(
            f"action_masks=True, but the action space {action_space} cannot be masked: MaskablePPO masks "
            "Discrete, MultiDiscrete and MultiBinary actions."
        )
    return size


def write_mask(buffer: np.ndarray, i: int, env: gym.Env) -> None:
    """Calls ``env.action_masks()`` and writes it, flattened to bool, into row ``i`` of ``buffer``.

    :raises ObservationError: the mask does not have ``buffer.shape[1]`` entries.
    """
    mask: Any = env.get_wrapper_attr(METHOD)()
    flat = np.asarray(mask, dtype=bool).reshape(-1)
    if flat.shape[0] != buffer.shape[1]:
        raise ObservationError(
            f"action_masks() returned {np.shape(mask)} ({flat.shape[0]} entries); the action space "
            f"{env.action_space} needs {buffer.shape[1]}. Return one bool per action (MaskablePPO's layout), "
            "or pass action_masks=False to ShmVecEnv to send masks through the pipe as they are."
        )
    buffer[i] = flat
