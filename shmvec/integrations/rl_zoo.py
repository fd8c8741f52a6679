"""RL Zoo (rl_zoo3): train and evaluate on :class:`shmvec.ShmVecEnv` with one argument::

    python -m rl_zoo3.train --algo ppo --env CartPole-v1 --gym-packages shmvec.integrations.rl_zoo
    python -m rl_zoo3.enjoy --algo ppo --env CartPole-v1 --gym-packages shmvec.integrations.rl_zoo -f logs/

``--gym-packages`` imports this module before the zoo builds its envs; importing it sets
``rl_zoo3.exp_manager.ExperimentManager.default_vec_env_cls``, the vec env class that
``train`` uses for its training and evaluation envs and ``enjoy`` for its own (it takes
precedence over ``--vec-env``, whose choices are only ``dummy`` and ``subproc``).  ShmVecEnv
then runs with its defaults (``n_workers``: one per core of the CPU budget); to set options,
point ``default_vec_env_cls`` at a subclass of your own in a module of your own.

Importing this module imports rl_zoo3 (and SB3, torch): it is meant for ``--gym-packages``.
"""

from __future__ import annotations

from rl_zoo3.exp_manager import ExperimentManager

from shmvec.shm_vec_env import ShmVecEnv


def install(vec_env_cls: type = ShmVecEnv) -> None:
    """Makes ``vec_env_cls`` RL Zoo's vec env class in this process (done once on import)."""
    ExperimentManager.default_vec_env_cls = vec_env_cls


install()
