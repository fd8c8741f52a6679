"""TorchRL: its ``GymWrapper`` over a :class:`shmvec.ShmVectorEnv`.

TorchRL wraps a Gymnasium ``VectorEnv`` whose ``autoreset_mode`` is ``SAME_STEP`` or
``DISABLED`` (it refuses ``NEXT_STEP``, shmvec's default); ``DISABLED`` is the one TorchRL
prefers (it resets the envs that ended through ``reset(options={"reset_mask": ...})``)::

    from shmvec.integrations.torchrl import make_torchrl_env

    env = make_torchrl_env("CartPole-v1", num_envs=8)        # batch_size [8]
    rollout = env.rollout(100, break_when_any_done=False)

which is ``GymWrapper(shmvec.make_vec("CartPole-v1", 8, autoreset_mode="Disabled"))``.
TorchRL is imported when the function is called, not with this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from shmvec.shm_vector_env import make_vec

#: The autoreset modes TorchRL's GymWrapper takes (gymnasium >= 1.1).
TORCHRL_AUTORESET_MODES = (AutoresetMode.DISABLED, AutoresetMode.SAME_STEP)


def make_torchrl_env(
    env_id: str | gym.envs.registration.EnvSpec,
    num_envs: int = 1,
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.DISABLED,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] | None = None,
    torchrl_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """TorchRL's ``GymWrapper`` over ``shmvec.make_vec(env_id, num_envs, ...)``: an ``EnvBase`` of
    batch size ``[num_envs]`` (for ``SAME_STEP``, the ``TransformedEnv`` TorchRL builds over it).

    Closing the returned env closes the ``ShmVectorEnv`` (its workers and shared memory).

    :param autoreset_mode: ``"Disabled"`` (default, TorchRL's preference) or ``"SameStep"``.
    :param vector_kwargs: further options of :class:`shmvec.ShmVectorEnv` (``n_workers``, ...).
    :param wrappers: Gymnasium wrappers applied to each env in its worker, as ``gymnasium.make_vec``.
    :param torchrl_kwargs: arguments of ``GymWrapper`` (``device``, ``categorical_action_encoding``,
        ``from_pixels``, ...).
    :param kwargs: passed to ``gymnasium.make`` for each env.
    :raises ValueError: ``autoreset_mode`` is ``NextStep`` (TorchRL cannot take it).
    :raises ImportError: TorchRL is not installed.
    """
    mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
    if mode not in TORCHRL_AUTORESET_MODES:
        raise ValueError(
            f"TorchRL's GymWrapper takes autoreset_mode Disabled or SameStep, not {mode.value}: "
            "Disabled is the one TorchRL prefers"
        )
    from torchrl.envs import GymWrapper  # here: importing shmvec must not import torch

    vec = make_vec(env_id, num_envs, vector_kwargs=vector_kwargs, wrappers=wrappers, autoreset_mode=mode, **kwargs)
    try:
        return GymWrapper(vec, **(torchrl_kwargs or {}))
    except BaseException:
        vec.close()
        raise
