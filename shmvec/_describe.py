"""A whole vec env as plain data, and back: the body of ``describe()`` and ``from_description()``.

A description holds each env's factory (:func:`shmvec.factories.describe_factory`, run-length
encoded), ``n_envs``, the constructor options (those :data:`shmvec._options.OPTIONS` declares, as
:attr:`shmvec._options.Options.given` holds them, each written as its declaration says), and the
last ``seed()`` and ``set_options()`` arguments: JSON, no closure and no pickle.  :func:`rebuild` builds the vec env it describes.

:func:`rebuild` takes the class to build from its caller: this layer does not know the
front-ends.  ``ShmVecEnv.from_description`` (and ``RayShmVecEnv.from_description``) pass their
own class; ``shmvec.rebuild(d)`` (in ``shmvec/__init__.py``, the layer above the front-ends) passes
``ShmVecEnv``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shmvec._options import plain_option
from shmvec._seeds import seed_from_plain
from shmvec.factories import DescriptionError, describe_factory, factory_from_description, jsonable

__all__ = ["DESCRIPTION_VERSION", "describe_env_fns", "describe_vec_env", "rebuild", "run_length"]

DESCRIPTION_VERSION = 1


def run_length(items: list[Any]) -> list[dict[str, Any]]:
    """``[a, a, b]`` -> ``[{"repeat": 2, "factory": a}, {"repeat": 1, "factory": b}]``."""
    out: list[dict[str, Any]] = []
    for item in items:
        if out and out[-1]["factory"] == item:
            out[-1]["repeat"] += 1
        else:
            out.append({"repeat": 1, "factory": item})
    return out


def describe_env_fns(env_fns: Sequence[Any]) -> list[dict[str, Any] | DescriptionError]:
    """Each factory's description, or the DescriptionError saying why it has none (raised later, by describe())."""
    out: list[dict[str, Any] | DescriptionError] = []
    for fn in env_fns:
        try:
            out.append(describe_factory(fn))
        except DescriptionError as exc:
            # A fresh exception: the caught one's traceback would keep the factory (and whatever
            # its closure holds) alive for as long as the vec env.
            out.append(DescriptionError(str(exc)))
    return out


def decided_data(decided: Mapping[str, Any]) -> dict[str, Any]:
    """``decided()`` of the faces, and ``describe()["decided"]``: the engine's ``explain()`` as plain data."""
    return jsonable(dict(decided), "decided")


def describe_vec_env(descriptions: Sequence[dict[str, Any] | Exception], config: Mapping[str, Any], *, n_envs: int,
                     n_workers: int, start_method: str, seed: Any, options: Any,
                     decided: Mapping[str, Any] | None = None, vec_env: str | None = None) -> dict[str, Any]:
    """The body of ``ShmVecEnv.describe()``: factories (run-length encoded), options, seeds, and
    ``decided``: what the defaults resolved to on this machine, and why (read by people; a
    rebuild resolves its defaults again where it runs).  ``vec_env``: the class that describes,
    for the faces other than ``ShmVecEnv`` (whose descriptions have none)."""
    factories = []
    for i, d in enumerate(descriptions):
        if isinstance(d, Exception):
            raise DescriptionError(f"env_fns[{i}] cannot be described as plain data: {d} (decided() still says what "
                                   "the defaults became on this machine, and why)") from d
        factories.append(d)
    plain_options = {}
    for name, value in config.items():
        value = plain_option(name, value)  # as the option's declaration writes it (shmvec._options.OPTIONS)
        plain_options[name] = jsonable(list(value) if isinstance(value, tuple) else value, f"option {name}")
    out = {
        "shmvec_description": DESCRIPTION_VERSION,
        "n_envs": n_envs,
        "env_fns": run_length(factories),
        "options": plain_options,
        "n_workers": n_workers,
        "start_method": start_method,
        "seed": jsonable(seed, "seed"),
        "reset_options": jsonable(options, "set_options()"),
        "decided": decided_data(decided or {}),
    }
    if vec_env is not None:
        out["vec_env"] = vec_env
    return out


def rebuild(description: Mapping[str, Any], cls: Callable[..., Any], maker: str | None = None, /,
            **overrides: Any) -> Any:
    """The vec env ``describe()`` described, built as ``cls(env_fns, **options)`` (``overrides``
    replace constructor options); seeds and reset options are set for its first ``reset()``.
    ``maker``: the ``"vec_env"`` the description must name (None: a ``ShmVecEnv``'s, which names none).

    ``cls`` is the front-end to build: ``ShmVecEnv.from_description(d)`` passes ``ShmVecEnv``,
    and ``shmvec.rebuild(d)`` does too (it is defined in the package, above the front-ends).

    :raises DescriptionError: ``description`` is not one of ours, or of another version.
    """
    if not isinstance(description, Mapping) or "shmvec_description" not in description:
        raise DescriptionError("not a ShmVecEnv description (made by ShmVecEnv.describe()): no 'shmvec_description'")
    if description["shmvec_description"] != DESCRIPTION_VERSION:
        raise DescriptionError(
            f"description version {description['shmvec_description']} is not {DESCRIPTION_VERSION}, the one this "
            "shmvec reads")
    if description.get("vec_env") != maker:
        raise DescriptionError(
            f"this description was made by {description.get('vec_env') or 'shmvec.ShmVecEnv'}.describe(), not by "
            f"{maker or 'shmvec.ShmVecEnv'}.describe(): rebuild it with shmvec.rebuild(description)")
    env_fns: list[Callable] = []
    for run in description["env_fns"]:
        fn = factory_from_description(run["factory"])
        env_fns += [fn] * int(run["repeat"])
    if len(env_fns) != description["n_envs"]:
        raise DescriptionError(f"the description lists {len(env_fns)} factories for n_envs={description['n_envs']}")
    options = dict(description.get("options") or {})  # spin_us comes back as a list: ShmVecEnv takes it
    options.update(overrides)
    vec_env = cls(env_fns, **options)
    try:
        if description.get("seed") is not None:
            vec_env.seed(seed_from_plain(description["seed"]))
        if description.get("reset_options") is not None:
            vec_env.set_options(description["reset_options"])
    except BaseException:
        vec_env.close()
        raise
    return vec_env
