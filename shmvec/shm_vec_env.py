"""ShmVecEnv: a Stable-Baselines3 ``VecEnv`` whose workers step slices of envs in shared memory.

The engine is :class:`shmvec._vec_core.VecCore`; this module gives it SB3's ``VecEnv`` as its
base.  The protocol between the engine and its workers is written down in
:mod:`shmvec._protocol`; the buffers are laid out by :mod:`shmvec._layout`.
"""

from __future__ import annotations

from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from shmvec._vec_core import (  # noqa: F401 - names that callers import from here
    DEFAULT_PARENT_SPIN_US,
    DEFAULT_WORKER_SPIN_US,
    VecCore,
    _cores,
    _Resources,
    default_n_workers,
    default_start_method,
)

__all__ = ["ShmVecEnv"]


class ShmVecEnv(VecCore, VecEnv):
    """A vectorized environment whose workers step slices of the envs in shared memory.

    A drop-in for SB3's ``SubprocVecEnv``::

        env = make_vec_env("CartPole-v1", n_envs=64, vec_env_cls=ShmVecEnv)

    :param env_fns: callables that each build a new ``gymnasium.Env``; lambdas and closures are
        fine (they are sent with cloudpickle).  For an env registered at run time, use
        ``shmvec.make_env(env_id)``: it carries the resolved spec to spawned workers.
    :param n_workers: worker processes; each steps a contiguous slice of the envs.  Default: the
        number of cores this process may use, at most ``len(env_fns)``.
    :param start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default as SB3 (forkserver
        where available, else spawn).
    :param copy: when True (default), ``reset``/``step_wait`` return arrays of their own.  When
        False, observations are views of the shared buffers: no copy, but **the next step
        overwrites them**, so copy whatever you keep (SB3's algorithms keep ``_last_obs``: leave
        ``copy=True`` for them).
    :param worker_threads: cap on BLAS/OpenMP/torch threads in each worker (None: leave as is).
    :param timeout: seconds to wait for the workers on any command before raising
        ``WorkerTimeoutError`` (None: wait as long as they are alive).  Starting workers (at
        construction, and restarts) waits at least 60 s whatever this is: a new worker imports
        its modules and builds its envs, which a step-sized timeout does not allow for.
    :param spin_us: microseconds a waiting side spins (yielding its core between bursts) before
        it sleeps on the futex, as ``(parent, worker)`` or one number for both.  Default: the
        parent spins up to 1000 us only when there are fewer workers than cores (a core of its
        own), and not at all otherwise; workers spin up to
        5000 us, but only while the parent usually answers within that (a stepping loop, or a
        small policy's forward pass between steps), and sleep at once when it does not (a
        policy update between rollouts).
    :param mailbox_bytes: per-worker shared buffer for infos and reset arguments; larger results
        travel through the worker's pipe instead.
    :param on_failure: what a failed worker (it died, one of its envs raised in ``step``/``reset``,
        or it did not answer within ``timeout``) does to the vec env.  ``"raise"`` (default): the
        call raises (``WorkerDiedError``, ``WorkerTimeoutError`` or the env's own exception) and
        the vec env is broken.  ``"restart"``: the worker is restarted, its envs rebuilt from
        their factories and reset, and their episodes reported as truncated with
        ``info["shmvec_restarted"]`` saying why (see :mod:`shmvec._recovery`); a
        ``WorkerRestartWarning`` is emitted each time.  With ``copy=False`` it costs one copy of
        the observations per step (the terminal observation of a restarted env must survive).
    :param max_restarts: with ``on_failure="restart"``, how many restarts a vec env may do in
        its life; the next failure raises ``TooManyRestartsError``.  None: no limit.
    :param invalid_actions: NaN in a float ``Box`` action, or a ``Discrete``/``MultiDiscrete``/
        ``MultiBinary`` action out of range: ``"raise"`` (default) raises
        ``InvalidActionError`` (a ``ValueError`` naming the envs) before anything is sent,
        ``"warn"`` warns (``InvalidActionWarning``) and sends them, ``"ignore"`` skips the check.
    :param envs_per_worker: at most this many envs per worker (sets ``n_workers`` to
        ``ceil(n_envs / envs_per_worker)``); ``envs_per_worker=1`` runs each env in a process of its
        own, for simulators that allow one instance per process.
    :param cpu_affinity: pin workers to cores (Linux): True pins worker w to the w-th core this
        process may use (cycling); a list gives worker w entry ``w % len(list)``, a core or a
        collection of cores.  None (default): no pinning.
    :param preload: module names the forkserver imports once (e.g. ``["torch"]``), so that workers
        forked from it do not import them again; ``start_method="forkserver"`` only.  The
        forkserver is one per process and started once: see :func:`shmvec.set_forkserver_preload`.
    :param action_masks: serve ``env_method("action_masks")`` (sb3-contrib's ``MaskablePPO``
        calls it every step) from shared memory: the workers call ``action_masks()`` after every
        reset and step and write it into a bool buffer, and the parent answers without a pipe
        round trip (see :mod:`shmvec._masks`).  None (default): on when every env has an
        ``action_masks`` method and the action space is Discrete, MultiDiscrete or MultiBinary,
        from the first time masks are asked for (``env_method("action_masks")`` or
        :meth:`action_masks`): until then no ``action_masks()`` is called, as with
        ``DummyVecEnv`` (a plain PPO on such envs calls none).  True: on from the start.
        False: off (``env_method("action_masks")`` goes through the pipe like any other call).

    :raises TypeError: ``env_fns`` holds something that is not callable (an env instance).
    :raises UnpicklableFactoryError: a factory cannot be pickled; the message names the object.
    :raises SpaceError: the envs' spaces differ or cannot live in shared memory.
    :raises WorkerDiedError: a worker died while starting.
    :raises ValueError: an option is out of its range.
    """
