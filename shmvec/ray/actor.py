"""The Ray actor: a local shmvec engine (ShmVecEnv, or ShmEnvPool for the pool) over one slice of the envs.

Each actor runs in a Ray worker process on some node and answers the driver's calls with
local env indices (0 .. slice length - 1); the driver (:mod:`shmvec.ray.group`) maps them.
Every method attaches its traceback to what it raises (:func:`~shmvec.ray.failures.keeps_traceback`).
The driver kills the actor after ``close()`` (``ray.kill``), so ``close()`` runs now what
would otherwise wait for the process's exit.
"""

from __future__ import annotations

import os
import types
from typing import Any

import cloudpickle
import numpy as np
import ray

from shmvec.ray.batching import pack_pool_rows, pack_step_infos
from shmvec.ray.failures import keeps_traceback

__all__ = ["remote_actor_class"]


def remote_actor_class() -> Any:
    """The Ray actor class to create the actors from (``.options(...).remote()``).

    Its body keeps its private name: Ray titles the actor's process after it (``ray::_ShmVecActor``).
    """
    return ray.remote(_ShmVecActor)


class _ShmVecActor:
    """The body of each Ray actor: a local ShmVecEnv over one slice of the envs.

    Methods take and return local indices (0 .. slice length - 1); the driver maps them.
    """

    def __init__(self) -> None:
        self.venv: Any = None

    @keeps_traceback
    def start(self, env_fns_bytes: bytes, shm_kwargs: dict[str, Any],
              pool_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Builds the envs: a ShmVecEnv, or a ShmEnvPool given ``pool_kwargs`` (batch size, autoreset)."""
        try:
            env_fns = cloudpickle.loads(env_fns_bytes)
        except ImportError as exc:
            raise ImportError(
                f"{exc}: the env factories refer to a module this node cannot import. Install it on every node, "
                "or ship it with ray.init(runtime_env={'py_modules': [...]} or {'working_dir': ...})."
            ) from exc
        if pool_kwargs is None:
            from shmvec.shm_vec_env import ShmVecEnv

            self.venv = ShmVecEnv(env_fns, **shm_kwargs)
            spaces_of = self.venv
        else:
            from shmvec.env_pool import ShmEnvPool

            self.venv = ShmEnvPool(env_fns, **pool_kwargs, **shm_kwargs)
            spaces_of = types.SimpleNamespace(observation_space=self.venv.single_observation_space,
                                              action_space=self.venv.single_action_space)
        ctx = ray.get_runtime_context()
        return {
            "observation_space": spaces_of.observation_space,
            "action_space": spaces_of.action_space,
            "render_mode": self.venv.render_mode,
            "metadata": self.venv.metadata,
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "n_workers": self.venv.n_workers,
        }

    @keeps_traceback
    def reset(self, seeds: list, options: list) -> tuple[Any, list]:
        venv = self.venv
        venv._seeds = list(seeds)  # the per-env seed list of SB3's VecEnv, read by reset()
        venv.set_options(list(options))
        obs = venv.reset()
        return obs, venv.reset_infos

    @keeps_traceback
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, bytes]:
        venv = self.venv
        obs, rewards, dones, infos = venv.step(actions)
        return obs, rewards, dones, pack_step_infos(infos, dones, venv.reset_infos)

    @keeps_traceback
    def call(self, method: str, local_indices: list[int] | None, args: tuple, kwargs: dict) -> Any:
        venv = self.venv
        if method == "get_images":
            return venv.get_images()
        if method == "has_attr":
            return venv.has_attr(*args)
        if method == "env_method":
            name, margs, mkwargs = args
            return venv.env_method(name, *margs, indices=local_indices, **mkwargs)
        return getattr(venv, method)(*args, indices=local_indices, **kwargs)

    # ---- pool mode (the engine is a ShmEnvPool; see shmvec.ray.pool) -----------------------------------
    @keeps_traceback
    def pool_reset(self, seeds: list, options: dict[str, Any] | list | None) -> tuple:
        """Resets every env of the slice; returns the first local batch."""
        self.venv.async_reset(seed=list(seeds), options=options)
        return self._pool_batch()

    @keeps_traceback
    def pool_send(self, actions: Any, local_ids: np.ndarray, recv: bool) -> tuple | None:
        """Sends actions to local envs; with ``recv``, then waits for the next local batch."""
        self.venv.send(actions, local_ids)
        return self._pool_batch() if recv else None

    @keeps_traceback
    def pool_recv(self) -> tuple:
        return self._pool_batch()

    @keeps_traceback
    def pool_call(self, name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.venv, name)(*args, **kwargs)

    def _pool_batch(self) -> tuple:
        """The next local batch as (local ids, obs, rewards, terminated, truncated, pickled row infos)."""
        obs, rewards, terminated, truncated, infos = self.venv.recv()
        ids = infos["env_id"]
        payload = pack_pool_rows(infos, len(ids), self.venv.row_infos)  # each row's own (info, reset info)
        return ids, obs, rewards, terminated, truncated, payload

    @keeps_traceback
    def close(self) -> None:
        """The actor's last call: the driver kills it next (``ray.kill``), which runs no atexit handler."""
        venv, self.venv = self.venv, None
        try:
            if venv is not None:
                venv.close()
        finally:
            _remove_multiprocessing_tempdir()


def _remove_multiprocessing_tempdir() -> None:
    """Runs now the clean-up that multiprocessing leaves to the process's exit: removing its
    ``pymp-*`` temp folder, which holds the forkserver's socket.  Ray kills an actor without
    running atexit handlers, so every actor left one in the node's temp dir (40 per run of the
    Ray tests).  The forkserver itself exits once the actor is gone (its "alive" pipe closes).

    The finalizer is multiprocessing's own (``util.get_temp_dir`` registers it); calling it
    runs it once and takes it off the registry.  These are private names: if a Python version
    lacks them, the folder is left as before."""
    import multiprocessing.util as mp_util

    remove = getattr(mp_util, "_remove_temp_dir", None)
    registry = getattr(mp_util, "_finalizer_registry", None)
    if remove is None or not isinstance(registry, dict):
        return
    for finalizer in list(registry.values()):
        if getattr(finalizer, "_callback", None) is remove:
            try:
                finalizer()
            except Exception:  # noqa: BLE001 - a folder already gone: nothing left to remove
                pass
