"""Gymnasium's registry: ``gymnasium.make_vec(id, n)`` that builds a :class:`shmvec.ShmVectorEnv`.

Gymnasium builds a registered env's vector form with its spec's ``vector_entry_point`` (called
as ``entry_point(num_envs=n, **env_kwargs)``) when ``vectorization_mode`` is
``"vector_entry_point"``, or is left out and the spec has one.  :func:`register_shm` gives a
registered id such an entry point::

    import gymnasium as gym
    from shmvec.integrations.gymnasium_registry import register_shm

    register_shm("CartPole-v1", n_workers=2)              # the id itself: make_vec's default from now on
    envs = gym.make_vec("CartPole-v1", num_envs=8)         # a ShmVectorEnv
    register_shm("CartPole-v1", new_id="shmvec/CartPole-v1")   # or a new id beside it

or, for an env of one's own, the entry point at registration::

    gym.register("MyEnv-v0", entry_point="my_pkg.envs:MyEnv",
                 vector_entry_point=ShmVectorEntryPoint("MyEnv-v0", n_workers=2))

Gymnasium refuses ``vector_kwargs`` and ``wrappers`` in this mode: ShmVectorEnv's options are
those given to the entry point, or a ``shmvec_options`` dict among ``make_vec``'s keyword
arguments (for one call); every other keyword argument goes to each env's ``gymnasium.make``.
A registration changes the registry of the process that makes it, and no other: RLlib's remote env
runners (Ray actors) do not see it; :mod:`shmvec.integrations.rllib` reaches them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

from shmvec.shm_vector_env import ShmVectorEnv, make_vec

#: The keyword argument of ``gymnasium.make_vec`` that carries ShmVectorEnv's options for one call.
OPTIONS_KEY = "shmvec_options"


class ShmVectorEntryPoint:
    """A ``vector_entry_point`` for Gymnasium's registry: ``shmvec.make_vec(env_id, num_envs, ...)``.

    Plain data (picklable by reference): ``env_id`` and ShmVectorEnv's options.

    :param env_id: the registered id whose ``entry_point`` (and kwargs, ``max_episode_steps``,
        wrappers of the spec) builds each env in the workers.
    :param vector_kwargs: options of :class:`shmvec.ShmVectorEnv` (``n_workers``,
        ``autoreset_mode``, ...).
    """

    def __init__(self, env_id: str, **vector_kwargs: Any) -> None:
        self.env_id = env_id
        self.vector_kwargs = vector_kwargs

    def __call__(self, num_envs: int = 1, **kwargs: Any) -> ShmVectorEnv:
        options = {**self.vector_kwargs, **(kwargs.pop(OPTIONS_KEY, None) or {})}
        # The spec without this entry point: the workers build single envs from it with gymnasium.make.
        spec = dataclasses.replace(gym.spec(self.env_id), vector_entry_point=None)
        return make_vec(spec, num_envs, vector_kwargs=options, **kwargs)

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.vector_kwargs.items())
        return f"{type(self).__name__}({self.env_id!r}{opts})"


def register_shm(env_id: str, *, new_id: str | None = None, **vector_kwargs: Any) -> str:
    """Gives registered ``env_id`` (or a copy of its spec named ``new_id``) a ``vector_entry_point``
    that builds a :class:`shmvec.ShmVectorEnv`; returns the id that has it.

    Without ``new_id``, ``gymnasium.make_vec(env_id, n)`` builds a ShmVectorEnv from now on in
    this process (Gymnasium takes the entry point when ``vectorization_mode`` is left out);
    ``vectorization_mode="sync"``/``"async"`` still give Gymnasium's own.  ``gymnasium.make``
    is unchanged.  Worker processes need no registration of their own.

    :param vector_kwargs: options of :class:`shmvec.ShmVectorEnv` for every ``make_vec`` of the id.
    :raises gymnasium.error.Error: ``env_id`` is not registered.
    """
    spec = gym.spec(env_id)
    entry = ShmVectorEntryPoint(spec.id, **vector_kwargs)
    target = spec.id if new_id is None else new_id
    if new_id is not None and new_id in gym.registry:
        raise gym.error.Error(f"{new_id} is registered already: pick another new_id")
    gym.registry[target] = dataclasses.replace(spec, id=target, vector_entry_point=entry)
    return target
