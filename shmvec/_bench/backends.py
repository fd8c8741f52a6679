"""The vec envs the benchmark compares, in one registry: adding a backend is one ``Backend`` entry.

Every backend is given the same env factory (:class:`shmvec._bench.envs.EnvFactory`), so each
steps exactly the same envs (no ``Monitor``, no wrapper one side lacks).  A backend whose package
is not installed reports why in :meth:`Backend.missing` and is skipped, never an error.

Libraries are imported inside the build functions: this module imports nothing beyond the
standard library, so a helper process in another interpreter (PufferLib's venv) can import it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shmvec._bench.envs import SB3_ENVS, EnvFactory, ParallelEnvFactory, is_multiagent


@dataclass
class BuildSpec:
    """What to build: ``n_envs`` copies of ``env`` on ``workers`` processes (or threads) at most."""

    env: str
    n_envs: int
    workers: int
    start_method: str = "fork"
    shm_defaults: bool = False  # shmvec's front-ends with their default n_workers (not ``workers``)


@dataclass
class Handle:
    """A built vec env: ``step(actions)`` is the backend's own method, ``reset()`` its first reset."""

    venv: Any
    reset: Callable[[], Any]
    sample_actions: Callable[[int], list]
    workers: int | None  # processes or threads stepping envs (None: one per env, or the caller's)
    step_fn: Callable[[Any], Any] | None = None  # instead of venv.step (an async pool's send + recv)
    envs_per_step: int | None = None  # env steps one step() makes (None: all n_envs; multi-agent: all rows)
    close_fn: Callable[[], None] | None = None  # instead of venv.close

    @property
    def step(self) -> Callable[[Any], Any]:
        return self.step_fn or self.venv.step

    def close(self) -> None:
        (self.close_fn or self.venv.close)()


def _single_space_sampler(env: str, n_envs: int) -> Callable[[int], list]:
    """Draws ``count`` batches of random actions from one env's action space (seeded)."""

    def sample(count: int) -> list:
        import numpy as np

        probe = EnvFactory(env)()
        space = probe.action_space
        probe.close()
        space.seed(0)
        return [np.array([space.sample() for _ in range(n_envs)]) for _ in range(count)]

    return sample


def _handle(venv: Any, spec: BuildSpec, reset: Callable[[], Any], workers: int | None) -> Handle:
    return Handle(venv, reset, _single_space_sampler(spec.env, spec.n_envs), workers)


def _dummy(spec: BuildSpec) -> Handle:
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([EnvFactory(spec.env)] * spec.n_envs)
    venv.seed(0)
    return _handle(venv, spec, venv.reset, 1)


def _subproc(spec: BuildSpec) -> Handle:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    venv = SubprocVecEnv([EnvFactory(spec.env)] * spec.n_envs, start_method=spec.start_method)
    venv.seed(0)
    return _handle(venv, spec, venv.reset, None)


def _shm_workers(spec: BuildSpec) -> int | None:
    return None if spec.shm_defaults else min(spec.workers, spec.n_envs)


def _shm(spec: BuildSpec) -> Handle:
    from shmvec import ShmVecEnv

    venv = ShmVecEnv([EnvFactory(spec.env)] * spec.n_envs, n_workers=_shm_workers(spec),
                     start_method=spec.start_method)
    venv.seed(0)
    return _handle(venv, spec, venv.reset, venv.n_workers)


def _gym_sync(spec: BuildSpec) -> Handle:
    from gymnasium.vector import SyncVectorEnv

    venv = SyncVectorEnv([EnvFactory(spec.env)] * spec.n_envs)
    return _handle(venv, spec, lambda: venv.reset(seed=0), 1)


def _gym_async(spec: BuildSpec) -> Handle:
    from gymnasium.vector import AsyncVectorEnv

    venv = AsyncVectorEnv([EnvFactory(spec.env)] * spec.n_envs, shared_memory=True, context=spec.start_method)
    return _handle(venv, spec, lambda: venv.reset(seed=0), None)


def _envpool(spec: BuildSpec) -> Handle:
    import envpool
    import numpy as np

    workers = min(spec.workers, spec.n_envs)
    venv = envpool.make_gymnasium("CartPole-v1", num_envs=spec.n_envs, batch_size=spec.n_envs,
                                  num_threads=workers, seed=0)

    def sample(count: int) -> list:
        rng = np.random.default_rng(0)
        return [rng.integers(0, 2, spec.n_envs, dtype=np.int32) for _ in range(count)]

    return Handle(venv, venv.reset, sample, workers)


def puffer_workers(workers: int, n_envs: int, n_cores: int) -> int:
    """PufferLib's worker count: its main process busy-waits on the workers, so with as many
    workers as cores three spinning processes share two cores and it collapses (a few hundred
    steps/s); it gets one worker less than the cores (at least one), and a divisor of n_envs."""
    w = max(1, min(workers, n_cores - 1, n_envs))
    while n_envs % w:  # PufferLib needs num_envs divisible by num_workers
        w -= 1
    return w


def _puffer(spec: BuildSpec) -> Handle:
    import pufferlib.emulation
    import pufferlib.vector

    from shmvec._bench.measures import cores

    workers = puffer_workers(spec.workers, spec.n_envs, cores())
    venv = pufferlib.vector.make(
        _PufferCreator(spec.env), backend=pufferlib.vector.Multiprocessing, num_envs=spec.n_envs,
        num_workers=workers, batch_size=spec.n_envs, overwork=True,
    )
    draw = _single_space_sampler(spec.env, spec.n_envs)
    # PufferLib's shared action buffer of a Discrete space is int32.
    return Handle(venv, lambda: venv.reset(seed=0), lambda count: [a.astype("int32") for a in draw(count)], workers)


class _PufferCreator:
    """PufferLib wants a creator returning its emulation wrapper around the env (picklable)."""

    def __init__(self, env: str) -> None:
        self.env = env

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import pufferlib.emulation

        return pufferlib.emulation.GymnasiumPufferEnv(env_creator=EnvFactory(self.env), buf=kwargs.get("buf"))


def _agent_rows_sampler(env: str, rows: int) -> Callable[[int], list]:
    """Draws ``count`` batches of random actions, one per agent row, from the first agent's space (seeded)."""

    def sample(count: int) -> list:
        import numpy as np

        probe = ParallelEnvFactory(env)()
        space = probe.action_space(probe.possible_agents[0])
        probe.close()
        space.seed(0)
        return [np.array([space.sample() for _ in range(rows)]) for _ in range(count)]

    return sample


def _shm_multiagent(spec: BuildSpec) -> Handle:
    from shmvec.multi_agent_vec_env import ShmMultiAgentVecEnv

    venv = ShmMultiAgentVecEnv([ParallelEnvFactory(spec.env)] * spec.n_envs,
                               n_workers=min(spec.workers, spec.n_envs), start_method=spec.start_method)
    venv.seed(0)
    return Handle(venv, venv.reset, _agent_rows_sampler(spec.env, venv.num_envs), venv.n_workers,
                  envs_per_step=venv.num_envs)


def _supersuit(multiprocess: bool) -> Callable[[BuildSpec], Handle]:
    """SuperSuit's path for SB3: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), n_envs,
    num_cpus, base_class="stable_baselines3")``, with ``num_cpus`` = the workers (processes of its
    own, started by multiprocessing's default method, each stepping a slice of the envs) or 0 (every
    env stepped in this process).  It clones one live env per env with cloudpickle."""

    def build(spec: BuildSpec) -> Handle:
        import supersuit as ss

        num_cpus = min(spec.workers, spec.n_envs) if multiprocess else 0
        venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(ParallelEnvFactory(spec.env)()), spec.n_envs,
                                     num_cpus=num_cpus, base_class="stable_baselines3")

        def reset() -> Any:
            obs, venv.reset_infos = venv.venv.reset(seed=0)  # its SB3 wrapper has no seed()
            return obs

        def close() -> None:
            venv.close()
            for proc in getattr(venv.venv, "procs", ()):  # it kills a process that outlives its timeout, unjoined
                proc.join(5)

        return Handle(venv, reset, _agent_rows_sampler(spec.env, venv.num_envs), num_cpus or 1,
                      envs_per_step=venv.num_envs, close_fn=close)

    return build


# ---------------------------------------------------------------------------------------------
# Other RL libraries' parallel envs, each beside shmvec through the same library's API
# (``shmvec.integrations``): a pair measured like for like.  Run only when named in ``--backends``.
# ---------------------------------------------------------------------------------------------


class _TorchRLCreator:
    """TorchRL's ``ParallelEnv`` wants a picklable function building one TorchRL env."""

    def __init__(self, env: str) -> None:
        self.env = env

    def __call__(self) -> Any:
        from torchrl.envs import GymWrapper

        return GymWrapper(EnvFactory(self.env)())


class _TensorDictLoop:
    """What ``EnvBase.rollout`` does each step: set the action, ``step_and_maybe_reset`` (which
    resets the envs that ended), keep the next root TensorDict."""

    def __init__(self, env: Any) -> None:
        self.env, self.td = env, None

    def reset(self) -> None:
        self.td = self.env.reset()

    def step(self, action: Any) -> Any:
        td = self.td
        td.set("action", action)
        _, self.td = self.env.step_and_maybe_reset(td)
        return self.td


def _tensordict_handle(env: Any, workers: int | None) -> Handle:
    import torch

    loop = _TensorDictLoop(env)

    def sample(count: int) -> list:
        torch.manual_seed(0)
        spec = env.full_action_spec["action"]
        return [spec.rand() for _ in range(count)]

    return Handle(env, loop.reset, sample, workers, step_fn=loop.step)


def _torchrl_parallel(spec: BuildSpec) -> Handle:
    from torchrl.envs import ParallelEnv

    env = ParallelEnv(spec.n_envs, _TorchRLCreator(spec.env), mp_start_method=spec.start_method)
    env.set_seed(0)
    return _ParallelEnvHandle(**vars(_tensordict_handle(env, None)))


class _ParallelEnvHandle(Handle):
    """TorchRL 0.14 keeps the last ParallelEnv built alive after ``close()`` (frames of the metadata
    probe in its constructor stay referenced), and with it the shared-memory tensors of its buffers,
    one file descriptor each: after closing, drop the env's references to them, and collect the
    TensorDicts' reference cycles now rather than at the next collection."""

    def close(self) -> None:
        import gc

        env = self.venv
        env.close()
        for key, value in list(vars(env).items()):
            if type(value).__module__.startswith("tensordict"):
                setattr(env, key, None)
        self.reset = self.step_fn = self.sample_actions = None  # type: ignore[assignment]
        gc.collect()


def _torchrl_shm(spec: BuildSpec) -> Handle:
    from torchrl.envs import GymWrapper

    from shmvec.shm_vector_env import ShmVectorEnv

    # make_torchrl_env(env_id, n) is this for a registered id; the bench's envs are factories.
    vec = ShmVectorEnv([EnvFactory(spec.env)] * spec.n_envs, autoreset_mode="Disabled",
                       n_workers=min(spec.workers, spec.n_envs), start_method=spec.start_method)
    try:
        env = GymWrapper(vec)
    except BaseException:
        vec.close()
        raise
    env.set_seed(0)
    return _tensordict_handle(env, vec.n_workers)


class _TianshouLoop:
    """What Tianshou's collectors do each step: step every env, reset those that ended by index."""

    def __init__(self, venv: Any) -> None:
        self.venv = venv

    def reset(self) -> Any:
        self.venv.seed(0)
        return self.venv.reset()

    def step(self, actions: Any) -> Any:
        import numpy as np

        out = self.venv.step(actions)
        ended = np.flatnonzero(np.logical_or(out[2], out[3]))
        if ended.size:
            self.venv.reset(env_id=ended)
        return out


def _tianshou_handle(venv: Any, spec: BuildSpec, workers: int | None) -> Handle:
    loop = _TianshouLoop(venv)
    return Handle(venv, loop.reset, _single_space_sampler(spec.env, spec.n_envs), workers, step_fn=loop.step)


def _tianshou_subproc(spec: BuildSpec) -> Handle:
    from tianshou.env import SubprocVectorEnv

    context = spec.start_method if spec.start_method in ("fork", "spawn") else None
    venv = SubprocVectorEnv([EnvFactory(spec.env)] * spec.n_envs, context=context)
    return _tianshou_handle(venv, spec, None)


def _tianshou_shm(spec: BuildSpec) -> Handle:
    from shmvec.integrations.tianshou import ShmTianshouVectorEnv

    workers = min(spec.workers, spec.n_envs)
    venv = ShmTianshouVectorEnv([EnvFactory(spec.env)] * spec.n_envs, n_workers=workers,
                                start_method=spec.start_method)
    return _tianshou_handle(venv, spec, workers)



@dataclass(frozen=True)
class Backend:
    """One vec env implementation the benchmark can run."""

    name: str
    library: str  # who provides it, as the table says it
    modules: tuple[str, ...]  # must be importable (in the interpreter that runs it)
    build: Callable[[BuildSpec], Handle]
    envs: tuple[str, ...] | None = None  # the only envs it can run (None: any Python env)
    remote: bool = False  # runs in another interpreter (``--puffer-python``), in a helper process
    note: str = ""
    multiagent: bool = False  # runs the multi-agent (PettingZoo) envs, and only those
    versus: str = ""  # shmvec through a library's API: the library's own parallel env it is measured against
    by_default: bool = True  # False: runs only when named in ``--backends``
    tensordict: bool = False  # steps TensorDicts (TorchRL's API), not arrays

    def missing(self) -> str | None:
        """Why this backend cannot run here (a module is not importable), or None."""
        for module in self.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                if module == "stable_baselines3":  # the extra shmvec[sb3] (shmvec._optional)
                    return 'stable_baselines3 is not installed (pip install -c constraints.txt -e ".[sb3]" adds it)'
                return f"{module} is not installed"
        return None

    def unsupported(self, env: str) -> str | None:
        """Why this backend cannot run ``env``, or None."""
        if is_multiagent(env) != self.multiagent:
            return "runs multi-agent (PettingZoo) envs only" if self.multiagent else "runs single-agent envs only"
        if self.remote and env in SB3_ENVS:
            return "its interpreter has no stable-baselines3"
        if self.envs is not None and env not in self.envs:
            return f"runs only its own envs ({', '.join(self.envs)})"
        return None

    def supports(self, env: str) -> bool:
        return self.unsupported(env) is None


def _optional_module(name: str) -> bool:
    """Whether ``name`` is importable; for ``shmvec.*``, only from this copy of shmvec (an editable
    install elsewhere on the machine must not lend this one modules it lacks)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if name.startswith("shmvec.") and spec.origin:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return os.path.abspath(spec.origin).startswith(here + os.sep)
    return True


REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in [
        Backend("DummyVecEnv", "SB3", ("stable_baselines3",), _dummy,
                note="all envs stepped one after the other in this process"),
        Backend("SubprocVecEnv", "SB3", ("stable_baselines3",), _subproc,
                note="one process per env, pickles through pipes"),
        Backend("ShmVecEnv", "shmvec", ("shmvec._sync", "shmvec._queue", "shmvec._rows", "shmvec._codec",
                                        "stable_baselines3"), _shm,
                note="workers step slices of envs in shared memory"),
        Backend("SyncVectorEnv", "Gymnasium", ("gymnasium",), _gym_sync,
                note="all envs stepped one after the other in this process"),
        Backend("AsyncVectorEnv", "Gymnasium", ("gymnasium",), _gym_async,
                note="one process per env, observations in shared memory, pickles the rest"),
        Backend("EnvPool", "EnvPool", ("envpool",), _envpool, envs=("CartPole-v1",),
                note="its own C++ CartPole, not the Python env: can pass the Python limit"),
        Backend("PufferLib", "PufferLib", ("pufferlib",), _puffer, remote=True,
                note="pufferlib.vector.Multiprocessing in the interpreter given by --puffer-python; "
                     "one worker less than the cores (its main process busy-waits)"),
        # Multi-agent: steps/s count agent steps (rows); the reference is SuperSuit-loop.
        Backend("ShmMultiAgentVecEnv", "shmvec", ("shmvec._sync", "pettingzoo", "stable_baselines3"), _shm_multiagent, multiagent=True,
                note="PettingZoo ParallelEnvs in shmvec's workers, one SB3 row per agent"),
        Backend("SuperSuit-mp", "SuperSuit", ("supersuit", "stable_baselines3"), _supersuit(True), multiagent=True,
                note="concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), n, num_cpus=workers, "
                     "base_class='stable_baselines3')"),
        Backend("SuperSuit-loop", "SuperSuit", ("supersuit", "stable_baselines3"), _supersuit(False),
                multiagent=True, note="the same with num_cpus=0: every env stepped in this process"),
    ]
}

# The rest of shmvec's front-ends: registered when the installed shmvec has them.
if _optional_module("shmvec.shm_vector_env"):  # pragma: no cover - depends on the shmvec version

    def _shm_vector(spec: BuildSpec) -> Handle:
        from shmvec.shm_vector_env import ShmVectorEnv  # type: ignore[import-not-found]

        venv = ShmVectorEnv([EnvFactory(spec.env)] * spec.n_envs, n_workers=_shm_workers(spec),
                            start_method=spec.start_method)
        return _handle(venv, spec, lambda: venv.reset(seed=0), venv.n_workers)

    REGISTRY["ShmVectorEnv"] = Backend("ShmVectorEnv", "shmvec", ("shmvec.shm_vector_env",), _shm_vector,
                                       note="shmvec's Gymnasium VectorEnv")


if _optional_module("shmvec.env_pool"):  # pragma: no cover - depends on the shmvec version

    class _PoolLoop:
        """An EnvPool-style loop over shmvec's async pool: send actions to the envs the last recv
        returned, recv the next ``batch_size`` that finish."""

        def __init__(self, pool: Any) -> None:
            self.pool, self.ids = pool, None

        def reset(self) -> None:
            _, infos = self.pool.reset(seed=0)
            self.ids = infos["env_id"]

        def step(self, actions: Any) -> Any:
            self.pool.send(actions[: len(self.ids)], self.ids)
            out = self.pool.recv()
            self.ids = out[4]["env_id"]
            return out

    def _shm_pool(spec: BuildSpec) -> Handle:
        from shmvec.env_pool import ShmEnvPool  # type: ignore[import-not-found]

        batch = max(1, spec.n_envs // 2)
        pool = ShmEnvPool([EnvFactory(spec.env)] * spec.n_envs, batch_size=batch,
                          n_workers=min(spec.workers, spec.n_envs), start_method=spec.start_method)
        loop = _PoolLoop(pool)
        return Handle(pool, loop.reset, _single_space_sampler(spec.env, spec.n_envs), min(spec.workers, spec.n_envs),
                      step_fn=loop.step, envs_per_step=batch)

    REGISTRY["ShmEnvPool"] = Backend("ShmEnvPool", "shmvec", ("shmvec.env_pool",), _shm_pool,
                                     note="shmvec's async pool, batch_size = n_envs / 2 (steps/s counts envs returned)")


# The other libraries' parallel envs and shmvec through each library's API, in pairs.
REGISTRY.update({
    b.name: b
    for b in [
        Backend("TorchRL-Parallel", "TorchRL", ("torchrl",), _torchrl_parallel, by_default=False, tensordict=True,
                note="TorchRL's ParallelEnv of GymWrapper envs, one process per env; steps as env.rollout does"),
        Backend("TorchRL-shmvec", "shmvec", ("torchrl", "shmvec.shm_vector_env"), _torchrl_shm, by_default=False,
                tensordict=True, versus="TorchRL-Parallel",
                note="make_torchrl_env: TorchRL's GymWrapper over a ShmVectorEnv (autoreset Disabled)"),
        Backend("Tianshou-Subproc", "Tianshou", ("tianshou",), _tianshou_subproc, by_default=False,
                note="Tianshou's SubprocVectorEnv, one process per env; envs that ended reset by index"),
        Backend("Tianshou-shmvec", "shmvec", ("tianshou", "shmvec.env_pool"), _tianshou_shm, by_default=False,
                versus="Tianshou-Subproc",
                note="ShmTianshouVectorEnv; envs that ended reset by index, as Tianshou's collectors do"),
    ]
})


def backend_names(multiagent: bool = False, all_: bool = False) -> list[str]:
    """The single-agent backends a run measures by default, or the multi-agent ones; with ``all_``,
    also those that run only when named in ``--backends``."""
    return [name for name, b in REGISTRY.items() if b.multiagent == multiagent and (all_ or b.by_default)]


def reference(env: str) -> str:
    """The backend every other is compared with at ``env``: stepping every env in this process."""
    return "SuperSuit-loop" if is_multiagent(env) else "DummyVecEnv"


def ours(env: str) -> str:
    """shmvec's backend at ``env``, whose ratios to the others the table states."""
    return "ShmMultiAgentVecEnv" if is_multiagent(env) else "ShmVecEnv"


def get(name: str) -> Backend:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}: choose from {', '.join(REGISTRY)}") from None


def build(name: str, spec: BuildSpec) -> Handle:
    """Builds ``spec`` on backend ``name`` in this interpreter."""
    return get(name).build(spec)


def import_modules(name: str) -> None:
    """Imports what backend ``name`` needs (so that start-up timings leave import time out)."""
    for module in get(name).modules:
        importlib.import_module(module)
    if name in ("DummyVecEnv", "SubprocVecEnv", "ShmVecEnv"):
        importlib.import_module("stable_baselines3.common.vec_env")
    if name == "ShmVecEnv":
        importlib.import_module("shmvec.shm_vec_env")
    if name in ("SyncVectorEnv", "AsyncVectorEnv"):
        importlib.import_module("gymnasium.vector")
