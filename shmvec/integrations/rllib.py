"""RLlib: every env runner, local and remote, steps its envs through shmvec, in one call.

::

    from ray.rllib.algorithms.ppo import PPOConfig
    from shmvec.integrations.rllib import use_shmvec

    config = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=1, num_envs_per_env_runner=8)
    algo = use_shmvec(config).build_algo()     # each runner's 8 CartPoles run in a ShmVectorEnv

How RLlib reaches it: its ``SingleAgentEnvRunner`` builds its env with ``gymnasium.make_vec``.
For an env registered with ``ray.tune.registry.register_env`` it registers, in each runner, an
id whose ``vector_entry_point`` calls the creator with ``env_config | {"num_envs": n}``, and uses
that entry point when ``gym_env_vectorize_mode`` is ``"vector_entry_point"``.  :func:`use_shmvec`
registers such a creator (:class:`ShmEnvCreator`: plain data, pickled by reference) under
``"shmvec:<env>"``, points the config at it and sets that mode.  Ray keeps registered creators
in its cluster-wide store (a registration made before ``ray.init`` is uploaded at init), so
remote runners find it; ``register_shm`` (shmvec.integrations.gymnasium_registry) changes the
Gymnasium registry of the driver only, which remote runners do not share.

What the creator builds: with ``num_envs`` in its config (the vector entry point), a
``ShmVectorEnv`` of that many envs; without (RLlib asks for one env, to read its spaces), one
plain env.  Each env is ``gymnasium.make(env, **env_config)`` for a Gymnasium id, or the user's
own creator (an env registered with ``register_env``) called with ``env_config``.  Workers: the
``n_workers`` given, else the CPUs Ray assigned to the runner's actor (``num_cpus_per_env_runner``,
1 by default) in a remote runner, else shmvec's default (the cores this process may use) in the
local runner (``num_env_runners=0``).  Multi-agent runners (``MultiAgentEnvRunner``) are not
covered: they do not build their envs with ``gymnasium.make_vec``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from shmvec.shm_vector_env import ShmVectorEnv, make_vec

PREFIX = "shmvec:"


def runner_cpus() -> int | None:
    """The CPUs Ray assigned to this process's actor (an env runner), or None outside an actor."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        if context.worker.mode != ray.WORKER_MODE:  # the driver: the local env runner
            return None
        cpus = context.get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - no Ray, or an API that moved: shmvec's own default
        return None
    return max(1, int(cpus)) if cpus else None


class ShmEnvCreator:
    """An RLlib env creator (``creator(env_config)``) whose vector form is a :class:`ShmVectorEnv`.

    :param env: a Gymnasium id (``"CartPole-v1"``, ``"module:Env-v0"``), or the name of an env
        registered with ``ray.tune.registry.register_env`` (its creator builds each env, in the workers).
    :param vector_kwargs: options of :class:`ShmVectorEnv` (``n_workers``, ``start_method``, ...).
    """

    def __init__(self, env: str, **vector_kwargs: Any) -> None:
        self.env = env
        self.vector_kwargs = vector_kwargs

    def __repr__(self) -> str:
        return f"ShmEnvCreator({self.env!r}, **{self.vector_kwargs!r})"

    def _user_creator(self) -> Any:
        from ray.tune.registry import ENV_CREATOR, _global_registry

        if _global_registry.contains(ENV_CREATOR, self.env):
            return _global_registry.get(ENV_CREATOR, self.env)
        return None

    def __call__(self, env_config: Mapping[str, Any] | None = None) -> gym.Env | ShmVectorEnv:
        config = dict(env_config or {})
        num_envs = config.pop("num_envs", None)
        options = dict(self.vector_kwargs)
        if options.get("n_workers") is None:
            cpus = runner_cpus()
            if cpus is not None:
                options["n_workers"] = cpus
        user = self._user_creator()
        if num_envs is None:
            return user(config) if user is not None else gym.make(self.env, **config)
        if user is not None:
            from functools import partial

            return ShmVectorEnv([partial(user, config)] * int(num_envs), **options)
        return make_vec(self.env, int(num_envs), vector_kwargs=options, **config)


def use_shmvec(config: Any, env: str | None = None, **vector_kwargs: Any) -> Any:
    """Makes every env runner of ``config`` (an RLlib ``AlgorithmConfig``) step its envs in a
    :class:`ShmVectorEnv`; returns ``config``.

    :param env: the env, a Gymnasium id or a name given to ``register_env``; by default the
        config's own (``config.environment(...)``).
    :param vector_kwargs: options of :class:`ShmVectorEnv`, for every runner (``n_workers``: see
        the module's docstring for the default).
    :raises ValueError: the config has no env and none is given, or its env is not a name (a
        class or a callable: register it with ``register_env`` and pass the name).
    """
    from ray.tune.registry import register_env

    env = env if env is not None else config.env
    if env is None:
        raise ValueError("use_shmvec: the config has no env: call config.environment('CartPole-v1') first, "
                         "or pass env='CartPole-v1'")
    if not isinstance(env, str):
        raise ValueError(f"use_shmvec: the env must be a Gymnasium id or a name given to register_env, not "
                         f"{type(env).__name__}: register it (ray.tune.registry.register_env('my-env', creator)) "
                         "and pass env='my-env'")
    if env.startswith(PREFIX):  # already done: keep the creator registered then
        return config
    name = PREFIX + env
    register_env(name, ShmEnvCreator(env, **vector_kwargs))
    config.environment(name)
    config.env_runners(gym_env_vectorize_mode="vector_entry_point")
    return config
