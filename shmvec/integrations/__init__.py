"""Ways into shmvec from other RL libraries, one module per library (docs/integrations.md).

Each module imports its library only when used (or, for ``rl_zoo``, only when it is imported,
which is what RL Zoo's ``--gym-packages`` does); this package itself imports none of them:

- :mod:`shmvec.integrations.torchrl`: ``make_torchrl_env``, TorchRL's ``GymWrapper`` over a
  ``ShmVectorEnv``;
- :mod:`shmvec.integrations.gymnasium_registry`: ``register_shm``, so that
  ``gymnasium.make_vec(id, ...)`` builds a ``ShmVectorEnv`` (in the process that registers);
- :mod:`shmvec.integrations.rllib`: ``use_shmvec(config)``, every RLlib env runner (local and
  remote) steps a ``ShmVectorEnv``;
- :mod:`shmvec.integrations.rl_zoo`: ``--gym-packages shmvec.integrations.rl_zoo`` trains and
  evaluates RL Zoo's agents on ``ShmVecEnv``;
- :mod:`shmvec.integrations.tianshou`: ``ShmTianshouVectorEnv``, Tianshou's vector env API over
  ``ShmEnvPool``.
"""
