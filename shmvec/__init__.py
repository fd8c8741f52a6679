"""shmvec: shared-memory vectorized environments for reinforcement learning.

``from shmvec import ShmVecEnv`` imports Stable-Baselines3 (and so torch); worker
processes import only the light private modules, so the public names are loaded
lazily here.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "ShmVecEnv",
    "ShmVectorEnv",
    "make_vec",
    "ShmEnvPool",
    "ShmVecEnvPool",
    "PoolReplayBuffer",
    "ShmVecEnvError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "ClosedVecEnvError",
    "BrokenVecEnvError",
    "AlreadyPendingCallError",
    "NoAsyncCallError",
    "SpaceError",
    "ObservationError",
    "RemoteEnvError",
    "TooManyRestartsError",
    "InvalidActionError",
    "WorkerRestartWarning",
    "InvalidActionWarning",
    "make_env",
    "EnvFactory",
    "rebuild",
    "set_forkserver_preload",
    "spawn_seeds",
    "UnpicklableFactoryError",
    "DescriptionError",
]

_FACTORY_NAMES = frozenset({"make_env", "EnvFactory", "rebuild", "set_forkserver_preload", "spawn_seeds",
                            "UnpicklableFactoryError", "DescriptionError"})

if TYPE_CHECKING:  # pragma: no cover
    from shmvec._errors import (
        AlreadyPendingCallError,
        BrokenVecEnvError,
        ClosedVecEnvError,
        InvalidActionError,
        InvalidActionWarning,
        NoAsyncCallError,
        ObservationError,
        RemoteEnvError,
        ShmVecEnvError,
        SpaceError,
        TooManyRestartsError,
        WorkerDiedError,
        WorkerRestartWarning,
        WorkerTimeoutError,
    )
    from shmvec.factories import (
        DescriptionError,
        EnvFactory,
        UnpicklableFactoryError,
        make_env,
        rebuild,
        set_forkserver_preload,
        spawn_seeds,
    )
    from shmvec.shm_vec_env import ShmVecEnv
    from shmvec.shm_vector_env import ShmVectorEnv, make_vec
    from shmvec.env_pool import ShmEnvPool
    from shmvec.vec_env_pool import PoolReplayBuffer, ShmVecEnvPool


def __getattr__(name: str) -> Any:
    if name == "ShmVecEnv":
        from shmvec.shm_vec_env import ShmVecEnv

        return ShmVecEnv
    if name in ("ShmVectorEnv", "make_vec"):
        from shmvec import shm_vector_env

        return getattr(shm_vector_env, name)
    if name == "ShmEnvPool":
        from shmvec.env_pool import ShmEnvPool

        return ShmEnvPool
    if name in ("ShmVecEnvPool", "PoolReplayBuffer"):
        from shmvec import vec_env_pool

        return getattr(vec_env_pool, name)
    if name in _FACTORY_NAMES:
        from shmvec import factories

        return getattr(factories, name)
    if name in __all__:
        from shmvec import _errors

        return getattr(_errors, name)
    raise AttributeError(f"module 'shmvec' has no attribute {name!r}")
