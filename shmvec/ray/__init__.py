"""shmvec over a Ray cluster: :class:`RayShmVecEnv`, one SB3 ``VecEnv`` whose envs run in Ray actors.

Install with ``pip install -c constraints.txt -e ".[ray]"`` in the checkout.  The pool over the
same actors is :class:`shmvec.ray_pool.RayShmEnvPool` (and its SB3 face ``RayShmVecEnvPool``).

The package, by responsibility (each module imports its siblings, never this one):

- :mod:`~shmvec.ray.actor`: the Ray actor, a local ShmVecEnv or ShmEnvPool over one slice of the envs;
- :mod:`~shmvec.ray.group`: the actors as a group (placement, start, calls, replacement, close)
  and the front-ends' state;
- :mod:`~shmvec.ray.failures`: :class:`RayActorDiedError`, and how failed calls become shmvec errors;
- :mod:`~shmvec.ray.batching`: actions split per actor, observations and infos joined;
- :mod:`~shmvec.ray.vec_env`: :class:`RayShmVecEnv`; :mod:`~shmvec.ray.pool`: the pools.
"""

from shmvec._errors import TooManyRestartsError, WorkerRestartWarning
from shmvec.ray.failures import RayActorDiedError
from shmvec.ray.vec_env import RayShmVecEnv

# Public names of shmvec.ray before it was a package, outside __all__ as they were then.
from shmvec._protocol import RESTART_INFO_KEY  # noqa: F401 - the key of info["shmvec_restarted"]
from shmvec.ray.batching import row_infos  # noqa: F401
from shmvec.ray.group import ON_FAILURE  # noqa: F401

__all__ = ["RayShmVecEnv", "RayActorDiedError", "TooManyRestartsError", "WorkerRestartWarning"]
