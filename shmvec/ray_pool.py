"""The asynchronous pool over Ray actors: :class:`RayShmEnvPool` and its SB3 face :class:`RayShmVecEnvPool`.

This module keeps the public import path; the code is :mod:`shmvec.ray.pool`.
"""

from shmvec.ray.failures import RayActorDiedError
from shmvec.ray.pool import RayShmEnvPool, RayShmVecEnvPool

__all__ = ["RayShmEnvPool", "RayShmVecEnvPool", "RayActorDiedError"]
