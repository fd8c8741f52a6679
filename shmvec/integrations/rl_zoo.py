"""RL Zoo (rl_zoo3): train and evaluate on :class:`shmvec.ShmVecEnv` with one argument::

    python -m rl_zoo3.train --algo ppo --env CartPole-v1 --gym-packages shmvec.integrations.rl_zoo
    python -m rl_zoo3.enjoy --algo ppo --env CartPole-v1 --gym-packages shmvec.integrations.rl_zoo -f logs/

``--gym-packages`` imports this module before the zoo builds its envs; importing it sets
``rl_zoo3.exp_manager.ExperimentManager.default_vec_env_cls``, the vec env class that
``train`` uses for its training and evaluation envs and ``enjoy`` for its own (it takes
precedence over ``--vec-env``, whose choices are only ``dummy`` and ``subproc``).  ShmVecEnv
then runs with its defaults (``n_workers``: one per core of the CPU budget); to set options,
point ``default_vec_env_cls`` at a subclass of your own in a module of your own.

What runs is said twice: ``train`` prints ``Vec env: shmvec.ShmVecEnv (...)`` when its experiment
starts, and the run's ``args.yml`` (the arguments the zoo saves beside the model) gets a
``vec_env_cls`` entry with the class's import path; its ``vec_env`` entry stays the ``--vec-env``
given (``dummy`` by default), which this class replaces.  ``enjoy`` builds its env with the same
class but writes no file.

Importing this module imports rl_zoo3 (and SB3, torch): it is meant for ``--gym-packages``.
"""

from __future__ import annotations

from typing import Any

from rl_zoo3.exp_manager import ExperimentManager

from shmvec.shm_vec_env import ShmVecEnv


# The zoo's own methods, wrapped once by install() so that a run says what it uses.
_ZOO_INIT = ExperimentManager.__init__
_ZOO_SAVE_CONFIG = ExperimentManager._save_config


def class_path(cls: type) -> str:
    """``shmvec.ShmVecEnv`` for shmvec's classes (their public name), ``module.Class`` for others."""
    import shmvec

    if cls.__module__.startswith("shmvec.") and getattr(shmvec, cls.__name__, None) is cls:
        return f"shmvec.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _init_and_say(self: ExperimentManager, args: Any, *rest: Any, **kwargs: Any) -> None:
    _ZOO_INIT(self, args, *rest, **kwargs)
    given = getattr(args, "vec_env", None)
    print(f"Vec env: {class_path(self.vec_env_class)} (set by --gym-packages {__name__}"
          + (f"; --vec-env {given} is not used)" if given else ")"), flush=True)


def _save_config_with_class(self: ExperimentManager, saved_hyperparams: dict[str, Any]) -> None:
    self.args.vec_env_cls = class_path(self.vec_env_class)
    _ZOO_SAVE_CONFIG(self, saved_hyperparams)


def install(vec_env_cls: type = ShmVecEnv) -> None:
    """Makes ``vec_env_cls`` RL Zoo's vec env class in this process (done once on import), printed
    when an experiment starts and saved in its ``args.yml`` as ``vec_env_cls``."""
    ExperimentManager.default_vec_env_cls = vec_env_cls
    ExperimentManager.__init__ = _init_and_say  # type: ignore[method-assign]
    ExperimentManager._save_config = _save_config_with_class  # type: ignore[method-assign]


install()
