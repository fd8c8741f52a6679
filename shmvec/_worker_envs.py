"""A worker's envs before it serves: building its slice, capping threads, and the spaces it reports.

Start-up as :mod:`shmvec._protocol` ("Start-up") writes it, the worker's side, before the block
exists: :func:`build_envs` runs the slice's factories (after the parent's registrations are
registered, :mod:`shmvec._registrations`), :func:`cap_threads` caps the thread pools of the
libraries the envs use (environment variables before, threadpoolctl and torch after), and
:func:`hello` is the first message on the pipe: the spaces, render mode, metadata and mask
support the parent checks and builds the block's layout from (no env is ever built in the
parent).  :func:`is_wrapped` answers the ``env_is_wrapped`` rare command.  Nothing here touches
the shared block; :mod:`shmvec._worker` drives it.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import gymnasium as gym

from shmvec import _protocol as P
from shmvec._layout import check_same_spaces
from shmvec._masks import has_action_masks
from shmvec._pickling import dumps
from shmvec.factories import not_an_env_error

__all__ = ["cap_threads", "is_wrapped", "build_envs", "hello"]

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS")


def cap_threads(n: int | None, after_envs: bool) -> None:
    """Caps the envs' thread pools at ``n`` (None: no cap): the environment variables the
    libraries read as they load (before the envs are built), then the pools already loaded."""
    if n is None:
        return
    if not after_envs:
        for var in _THREAD_VARS:
            os.environ[var] = str(n)
        return
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except Exception:  # threadpoolctl is best effort: a library it cannot drive keeps its threads
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


def is_wrapped(env: gym.Env, wrapper_class: type) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return False


def build_envs(env_fns_bytes: bytes, env_range: range, envs: list[gym.Env], at: list[int | None],
               public_name: str = "ShmVecEnv") -> None:
    """Builds the slice's envs into ``envs`` (what was built is there if it raises, for closing);
    ``at[0]`` is the env being built or checked."""
    env_fns = cloudpickle.loads(env_fns_bytes)
    seen: dict[int, int] = {}
    for i, fn in zip(env_range, env_fns):
        at[0] = i
        env = fn()
        if not isinstance(env, gym.Env):
            error = not_an_env_error(f"env_fns[{i}]", env, public_name)
            if not isinstance(env, type) and callable(getattr(env, "close", None)):
                try:  # a vector env's processes, a multi-agent env's simulator
                    env.close()
                except Exception:
                    pass  # the error to report is that it is no gymnasium.Env
            raise error
        key = id(env.unwrapped)
        if key in seen:
            raise ValueError(
                f"env_fns[{i}] returned the same env instance as env_fns[{seen[key]}]. Each factory must build a "
                "new env (use gymnasium.make(...) inside it, not `lambda: env`)."
            )
        seen[key] = i
        envs.append(env)
    first = envs[0]
    for i, env in zip(env_range, envs):
        at[0] = i
        # Observation spaces are checked by the parent, which gets every env's in the hello
        # (ShmVectorEnv's observation_mode lets them differ in bounds), before any layout is built.
        check_same_spaces(i, (first.observation_space, env.action_space), env_range.start,
                          (first.observation_space, first.action_space))  # (the action space only)
    at[0] = None


def hello(envs: list[gym.Env]) -> bytes:
    """The SPACES message, pickled: the first env's spaces, render mode and metadata, whether
    every env has action masks, and every env's observation space where they differ.

    :raises Exception: something in them does not pickle (with a note that says what goes).
    """
    first = envs[0]
    obs_spaces = [env.observation_space for env in envs]
    try:
        return dumps((P.Pipe.SPACES, (first.observation_space, first.action_space,
                                      getattr(first, "render_mode", None), dict(first.metadata),
                                      all(has_action_masks(env) for env in envs),
                                      None if all(s == obs_spaces[0] for s in obs_spaces) else obs_spaces)))
    except Exception as exc:
        exc.add_note("shmvec: the first env's observation_space, action_space, render_mode and metadata "
                     "go to the parent pickled (cloudpickle for lambdas and classes of your script): keep open "
                     "handles (locks, sockets, files) out of them.")
        raise
