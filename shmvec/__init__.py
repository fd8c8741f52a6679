"""shmvec: shared-memory vectorized environments for reinforcement learning.

``from shmvec import ShmVecEnv`` imports Stable-Baselines3 (and so torch); worker
processes import only the light private modules, so the public names are loaded
lazily here.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "ShmVecEnv",
    "ShmVectorEnv",
    "ShmMultiAgentVecEnv",
    "ShmParallelEnv",
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
    "ConcurrentCallError",
    "ForkedVecEnvError",
    "UnknownAgentError",
    "SpaceError",
    "ObservationError",
    "RemoteEnvError",
    "TooManyRestartsError",
    "InvalidActionError",
    "WorkerRestartWarning",
    "InvalidActionWarning",
    "ParentThreadsWarning",
    "make_env",
    "EnvFactory",
    "rebuild",
    "set_forkserver_preload",
    "spawn_seeds",
    "UnpicklableFactoryError",
    "DescriptionError",
]


if TYPE_CHECKING:  # pragma: no cover
    from shmvec._errors import (
        AlreadyPendingCallError,
        BrokenVecEnvError,
        ClosedVecEnvError,
        ConcurrentCallError,
        ForkedVecEnvError,
        InvalidActionError,
        InvalidActionWarning,
        NoAsyncCallError,
        ObservationError,
        ParentThreadsWarning,
        RemoteEnvError,
        ShmVecEnvError,
        SpaceError,
        TooManyRestartsError,
        UnknownAgentError,
        WorkerDiedError,
        WorkerRestartWarning,
        WorkerTimeoutError,
    )
    from shmvec._machine import set_forkserver_preload
    from shmvec._pickling import UnpicklableFactoryError
    from shmvec._seeds import spawn_seeds
    from shmvec.factories import DescriptionError, EnvFactory, make_env
    from shmvec.shm_vec_env import ShmVecEnv
    from shmvec.shm_vector_env import ShmVectorEnv, make_vec
    from shmvec.multi_agent_vec_env import ShmMultiAgentVecEnv
    from shmvec.parallel_env import ShmParallelEnv
    from shmvec.env_pool import ShmEnvPool
    from shmvec.vec_env_pool import PoolReplayBuffer, ShmVecEnvPool


def __getattr__(name: str) -> Any:
    if name == "ShmVecEnv":
        from shmvec.shm_vec_env import ShmVecEnv

        return ShmVecEnv
    if name == "ShmMultiAgentVecEnv":
        from shmvec.multi_agent_vec_env import ShmMultiAgentVecEnv

        return ShmMultiAgentVecEnv
    if name == "ShmParallelEnv":
        from shmvec.parallel_env import ShmParallelEnv

        return ShmParallelEnv
    if name in ("ShmVectorEnv", "make_vec"):
        from shmvec import shm_vector_env

        return getattr(shm_vector_env, name)
    if name == "ShmEnvPool":
        from shmvec.env_pool import ShmEnvPool

        return ShmEnvPool
    if name in ("ShmVecEnvPool", "PoolReplayBuffer"):
        from shmvec import vec_env_pool

        return getattr(vec_env_pool, name)
    if name in ("make_env", "EnvFactory", "DescriptionError"):
        from shmvec import factories

        return getattr(factories, name)
    if name == "UnpicklableFactoryError":
        from shmvec._pickling import UnpicklableFactoryError

        return UnpicklableFactoryError
    if name == "set_forkserver_preload":
        from shmvec._machine import set_forkserver_preload

        return set_forkserver_preload
    if name == "spawn_seeds":
        from shmvec._seeds import spawn_seeds

        return spawn_seeds
    if name in __all__:  # the errors and warnings (ConcurrentCallError, ForkedVecEnvError, ...)
        from shmvec import _errors

        return getattr(_errors, name)
    raise AttributeError(f"module 'shmvec' has no attribute {name!r}")


def rebuild(description: Mapping[str, Any], cls: Any = None, **overrides: Any) -> Any:
    """The vec env ``describe()`` described, of the class that described it (a :class:`ShmVecEnv`
    or a :class:`ShmVectorEnv`) unless ``cls`` is given (``overrides`` replace constructor options).

    ``shmvec.rebuild(json.load(f))`` is ``ShmVecEnv.from_description(json.load(f))`` for a
    ``ShmVecEnv``'s description.  Defined here, above the front-ends, so that
    :func:`shmvec._describe.rebuild` (which takes the class to build) need not know them.

    :raises DescriptionError: ``description`` is not a description of ours, or a ``RayShmVecEnv``'s
        (``RayShmVecEnv.from_description`` builds it, on a Ray cluster).
    """
    from shmvec import _describe
    from shmvec.factories import DescriptionError

    maker = description.get("vec_env") if isinstance(description, Mapping) else None
    if cls is None:
        if maker == "shmvec.ShmVectorEnv":
            from shmvec.shm_vector_env import ShmVectorEnv as cls
        elif maker is not None:
            raise DescriptionError(
                f"a description of a {maker}: rebuild it with {maker}.from_description(description)")
        else:
            from shmvec.shm_vec_env import ShmVecEnv as cls
    return _describe.rebuild(description, cls, maker, **overrides)
