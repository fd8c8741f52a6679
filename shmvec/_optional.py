"""Optional libraries: the error a user gets from a class whose library is not installed.

``pip install shmvec`` brings numpy, Gymnasium and cloudpickle only: ``ShmVectorEnv``,
``make_vec``, ``ShmEnvPool`` and ``ShmParallelEnv`` need nothing more.  The classes that are
Stable-Baselines3 ``VecEnv``s (``ShmVecEnv``, ``ShmMultiAgentVecEnv``, ``ShmVecEnvPool``,
``RayShmVecEnv``) import SB3 (and so torch) when their module is imported; without it that
import raises :func:`missing`'s error, a ``ModuleNotFoundError`` (so an ``ImportError``) that
names the class and the install line, with the original error as its cause.  The module is
not left half-imported: the next import tries again (after ``pip install``, say).
"""

from __future__ import annotations

# The extra that brings each optional library, by top-level module name.
EXTRAS = {
    "stable_baselines3": ("sb3", "stable-baselines3"),
    "torch": ("sb3", "torch"),
    "pettingzoo": ("multiagent", "pettingzoo"),
    "ray": ("ray", "ray"),
}


def missing(what: str, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error to raise (``from exc``) when importing ``what`` failed with ``exc``.

    ``exc`` itself comes back unchanged when the missing module is not one of :data:`EXTRAS`
    (a real bug, or a broken install, must not be dressed up as a missing extra).
    """
    top = (exc.name or "").split(".")[0]
    if top not in EXTRAS:
        return exc
    extra, package = EXTRAS[top]
    return ModuleNotFoundError(
        f"{what} needs {package}, which is not installed in this Python ({exc}). Install it with "
        f'pip install "shmvec[{extra}]" (from a checkout: pip install -c constraints.txt -e ".[{extra}]"), '
        f"or pip install {package}.", name=exc.name)
