"""Imported with ``--gym-packages`` beside ``shmvec.integrations.rl_zoo`` in the RL Zoo test: writes the
number of envs of each ShmVecEnv built in the process to the file named by $SHMVEC_ZOO_PROBE, so that
the test sees that the zoo built its envs with ShmVecEnv (it changes nothing else)."""

import os

from shmvec.shm_vec_env import ShmVecEnv

_init = ShmVecEnv.__init__


def _recording_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    with open(os.environ["SHMVEC_ZOO_PROBE"], "a") as f:
        f.write(f"{type(self).__name__} {self.num_envs}\n")


ShmVecEnv.__init__ = _recording_init
