"""Env factories that survive ``spawn``: :func:`make_env`, checks of ``env_fns``, factories as plain data.

:func:`make_env` returns an :class:`EnvFactory`: a small picklable object that builds one env
when called.  For a registered id it resolves the Gymnasium ``EnvSpec`` in the parent and
carries it as plain data (the entry point as an import string, kwargs, ``max_episode_steps``,
wrappers), so an env registered at run time in the user's script is found in ``spawn`` and
``forkserver`` workers, whose fresh interpreters never ran that ``gymnasium.register(...)``.

For :class:`shmvec.ShmVecEnv` and the other front-ends:

- :func:`factory_list` and :func:`check_factories` refuse, before any worker starts, ``env_fns``
  that is not a list of callables (an env instance, a number, an id, a vector env, a PettingZoo
  env), saying what was passed and what to pass: every front-end (the Ray ones included) reads its
  ``env_fns`` through :func:`factory_list`; :func:`not_an_env_error` is a worker's error for a
  factory that returned something else than a ``gymnasium.Env``;
- :func:`describe_factory` and :func:`factory_from_description` turn one factory into plain
  (JSON-serializable) data and back.  They live beside :class:`EnvFactory`, whose ``to_dict`` is
  one such description; :mod:`shmvec._describe`, above this module, describes a whole vec env
  (``ShmVecEnv.describe()`` / ``ShmVecEnv.from_description()``);

The names users import from here that live elsewhere are re-exported: picklability checks
(:mod:`shmvec._pickling`), seeds (:mod:`shmvec._seeds`), the forkserver preload
(:mod:`shmvec._machine`).  Modules of shmvec import them from where they are defined.

This module is imported by worker processes (to unpickle an :class:`EnvFactory`): it imports
nothing heavier than Gymnasium and NumPy, never Stable-Baselines3 or torch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import json
import numbers
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, WrapperSpec

from shmvec._errors import ShmVecEnvError
# Re-exported for users, who import them from here; modules of shmvec import them from where they are defined.
from shmvec._machine import set_forkserver_preload  # noqa: F401
from shmvec._pickling import UnpicklableFactoryError, find_unpicklable, pickle_factories  # noqa: F401
from shmvec._seeds import per_env_seeds, seed_from_plain, spawn_seeds  # noqa: F401

__all__ = [
    "EnvFactory",
    "make_env",
    "UnpicklableFactoryError",
    "DescriptionError",
    "check_factories",
    "pickle_factories",
    "find_unpicklable",
    "describe_factory",
    "factory_from_description",
    "per_env_seeds",
    "spawn_seeds",
    "set_forkserver_preload",
]

_SB3_INIT_QUALNAME = "make_vec_env.<locals>.make_env.<locals>._init"
_SB3_INIT_MODULE = "stable_baselines3.common.env_util"
_SB3_INIT_FREEVARS = frozenset(
    {"env_id", "env_kwargs", "monitor_dir", "monitor_kwargs", "rank", "seed", "wrapper_class", "wrapper_kwargs"})


class DescriptionError(ShmVecEnvError, ValueError):
    """A vec env or factory cannot be described as plain data, or a description cannot be rebuilt."""


# ---------------------------------------------------------------------------------------------
# Import strings
# ---------------------------------------------------------------------------------------------

def import_string(obj: Any) -> str | None:
    """``"module:qualname"`` when ``obj`` is found again under that name in an importable module, else None.

    Objects defined in ``__main__`` get None: another interpreter (or machine) running another
    script would not find them.
    """
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    if module in ("__main__", "__mp_main__", "builtins"):
        return None
    mod = sys.modules.get(module)
    if mod is None:
        return None
    found: Any = mod
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is obj else None


def resolve(ref: str | Callable) -> Callable:
    """The object an import string ``"module:qualname"`` names (callables are returned as they are)."""
    if not isinstance(ref, str):
        return ref
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _as_ref(obj: str | Callable) -> str | Callable:
    """An import string for ``obj`` where it has one, else ``obj`` itself (sent with cloudpickle).

    A ``"__main__:Name"`` string (``gym.register(entry_point="__main__:MyEnv")``, as tutorials
    write it) is resolved here, in the parent: a spawned or forkserver worker's ``__main__`` is
    not the notebook's, ``python -c``'s or stdin's, and would not have ``Name``.  The object then
    travels by value.
    """
    if isinstance(obj, str):
        found = main_object(obj)
        return obj if found is None else import_string(found) or found
    return import_string(obj) or obj


def main_refs(spec: EnvSpec, entry_points: bool = True) -> dict[str, Any]:
    """The objects of this process's ``__main__`` that the ``"__main__:Name"`` strings of ``spec``
    name (its wrappers' entry points, and its own unless ``entry_points`` is false), by name.

    Gymnasium loads a wrapper of ``additional_wrappers`` from its import string only, so the
    string cannot be replaced by the object it names: the objects travel by value beside the
    spec, and the worker gives its own ``__main__`` those it lacks (:func:`provide_main`).
    """
    refs = [w.entry_point for w in spec.additional_wrappers or ()]
    if entry_points:
        refs += [spec.entry_point, spec.vector_entry_point]
    main = sys.modules.get("__main__")
    out = {}
    for ref in refs:
        if isinstance(ref, str) and ref.startswith("__main__:"):
            name = ref.split(":", 1)[1].split(".")[0]
            found = getattr(main, name, None)
            if found is not None:
                out[name] = found
    return out


def provide_main(objects: Mapping[str, Any]) -> None:
    """Gives this process's ``__main__`` each of ``objects`` (from :func:`main_refs`) it lacks: a
    spawned or forkserver worker of a notebook, ``python -c`` or stdin has none of the parent's
    names; a worker of a script file has them already (its ``__mp_main__``), and keeps its own."""
    main = sys.modules.get("__main__")
    if main is None:
        return
    for name, obj in objects.items():
        if not hasattr(main, name):
            setattr(main, name, obj)


def main_object(ref: str) -> Callable | None:
    """The callable a ``"__main__:Name"`` string names in this process, else None (another string, or no such name)."""
    if not ref.startswith("__main__:"):
        return None
    found: Any = sys.modules.get("__main__")
    for part in ref.split(":", 1)[1].split("."):
        found = getattr(found, part, None)
    return found if callable(found) else None


# ---------------------------------------------------------------------------------------------
# EnvFactory and make_env
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WrapperEntry:
    """A wrapper applied by an :class:`EnvFactory` after the env is built: ``entry(env, **kwargs)``."""

    entry: str | Callable
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """Builds one env when called; picklable, and plain data when every entry point is an import string.

    Build it with :func:`make_env`.  Exactly one of ``spec`` (the fields of a Gymnasium
    ``EnvSpec``, resolved in the parent) and ``entry`` (a callable or ``"module:qualname"``)
    is set.  ``main``: the objects of the parent's ``__main__`` that the spec's import strings
    name (:func:`main_refs`), given to a worker's ``__main__`` that lacks them.
    """

    spec: Mapping[str, Any] | None = None
    entry: str | Callable | None = None
    args: tuple = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    wrappers: tuple[WrapperEntry, ...] = ()
    module: str | None = None
    main: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, **overrides: Any) -> gym.Env:
        """Builds the env; ``overrides`` update its kwargs (SB3's ``make_vec_env(factory,
        env_kwargs=...)`` calls ``factory(**env_kwargs)``)."""
        if self.module is not None:
            importlib.import_module(self.module)
        provide_main(self.main)
        kwargs = {**copy.deepcopy(dict(self.kwargs)), **overrides}  # the caller's objects as they are (SB3)
        if self.spec is not None:
            env = gym.make(_spec_from_fields(self.spec), **kwargs)
        else:
            assert self.entry is not None
            env = resolve(self.entry)(*copy.deepcopy(self.args), **kwargs)
        for wrapper in self.wrappers:
            env = resolve(wrapper.entry)(env, **copy.deepcopy(dict(wrapper.kwargs)))
        return env

    @property
    def env_id(self) -> str | None:
        return None if self.spec is None else self.spec["id"]

    def __repr__(self) -> str:
        target = repr(self.env_id) if self.spec is not None else _ref_name(self.entry)
        parts = [target] + [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        if self.wrappers:
            parts.append(f"wrappers=[{', '.join(_ref_name(w.entry) for w in self.wrappers)}]")
        return f"make_env({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """This factory as plain data (JSON-serializable).

        :raises DescriptionError: an entry point is a callable object with no import string (a
            class or function defined in ``__main__``, a lambda, a closure): it travels with
            cloudpickle to the workers of this machine, but is not plain data.
        """
        out: dict[str, Any] = {"type": "make_env"}
        if self.spec is not None:
            entry = self.spec.get("entry_point")
            if not isinstance(entry, str):
                raise DescriptionError(
                    f"the entry point of {self.env_id!r} is the object {entry!r}, not an import string: it is sent "
                    "to workers with cloudpickle, but it is not plain data. Register the env with "
                    "entry_point='package.module:ClassName' (defined in an importable module, not in __main__)."
                )
            if self.main:
                raise DescriptionError(
                    f"the spec of {self.env_id!r} names {sorted(self.main)} of __main__ (a wrapper's entry point): "
                    "they are sent to workers with cloudpickle, but they are not plain data. Define them in an "
                    "importable module.")
            out["spec"] = jsonable(dict(self.spec), f"spec of {self.env_id!r}")
        else:
            if not isinstance(self.entry, str):
                raise DescriptionError(
                    f"the env entry point {self.entry!r} has no import string (a lambda, closure, or something "
                    "defined in __main__): it is sent to workers with cloudpickle, but it is not plain data. "
                    "Define it at module level in an importable module, or register it and use make_env(env_id)."
                )
            out["entry"] = self.entry
        if self.args:
            out["args"] = jsonable(list(self.args), "args")
        out["kwargs"] = jsonable(dict(self.kwargs), "kwargs")
        wrappers = []
        for w in self.wrappers:
            if not isinstance(w.entry, str):
                raise DescriptionError(
                    f"the wrapper {w.entry!r} has no import string (a lambda, closure, or something defined in "
                    "__main__): define it at module level in an importable module to describe it as plain data."
                )
            wrappers.append({"entry": w.entry, "kwargs": jsonable(dict(w.kwargs), f"kwargs of wrapper {w.entry}")})
        out["wrappers"] = wrappers
        if self.module is not None:
            out["module"] = self.module
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvFactory:
        if d.get("type") != "make_env":
            raise DescriptionError(f"not a make_env description: {d!r}")
        return cls(
            spec=dict(d["spec"]) if d.get("spec") is not None else None,
            entry=d.get("entry"),
            args=tuple(d.get("args", ())),
            kwargs=dict(d.get("kwargs", {})),
            wrappers=tuple(WrapperEntry(w["entry"], dict(w.get("kwargs", {}))) for w in d.get("wrappers", ())),
            module=d.get("module"),
        )


def make_env(
    id_or_callable: str | EnvSpec | Callable[..., gym.Env],
    *,
    wrappers: Iterable[Callable | str | tuple[Callable | str, Mapping[str, Any]]] = (),
    **kwargs: Any,
) -> EnvFactory:
    """A picklable factory that builds one env: ``make_env("CartPole-v1")() == gym.make("CartPole-v1")``.

    ``ShmVecEnv([make_env("MyEnv-v0", size=8)] * 16)`` builds 16 envs in the workers.

    :param id_or_callable: a registered env id (``"CartPole-v1"``, ``"module:Env-v0"``, which
        imports ``module`` first, as ``gym.make`` does), an ``EnvSpec``, or a callable returning
        an env (a class or function).  For an id, the ``EnvSpec`` is resolved **here, in the
        parent**, and carried to the workers: an env registered at run time in the user's script
        is found in ``spawn``/``forkserver`` workers too.
    :param wrappers: applied in order after the env is built: wrapper classes (or callables
        ``f(env, **kw)``), import strings ``"module:Wrapper"``, or ``(wrapper, kwargs)`` pairs.
    :param kwargs: passed to ``gym.make`` (for an id: env kwargs, ``max_episode_steps``,
        ``render_mode``, ...) or to the callable.

    Callables and wrappers that live in an importable module are carried as import strings, so
    the factory is plain data (see :meth:`EnvFactory.to_dict`); others (lambdas, closures,
    classes defined in ``__main__``) travel with cloudpickle and work on this machine, but
    ``ShmVecEnv.describe()`` cannot describe them.

    :raises gymnasium.error.Error: the id is not registered (raised here, not in a worker).
    """
    module = None
    if isinstance(id_or_callable, EnvSpec):
        spec: EnvSpec | None = id_or_callable
        entry = None
    elif isinstance(id_or_callable, str):
        env_id = id_or_callable
        if ":" in env_id:
            module, env_id = env_id.split(":", 1)
            importlib.import_module(module)
        spec = gym.spec(env_id)
        entry = None
    elif isinstance(id_or_callable, gym.Env):
        raise TypeError(_instance_message("make_env's argument", id_or_callable))
    elif callable(id_or_callable):
        spec, entry = None, _as_ref(id_or_callable)
    else:
        raise TypeError(f"make_env takes an env id, an EnvSpec or a callable, not {type(id_or_callable).__name__}")
    wrapper_entries = []
    for w in wrappers:
        if isinstance(w, tuple):
            ref, wkw = w
        else:
            ref, wkw = w, {}
        if not (isinstance(ref, str) or callable(ref)):
            raise TypeError(f"a wrapper must be a callable or an import string, not {type(ref).__name__}")
        wrapper_entries.append(WrapperEntry(_as_ref(ref), dict(wkw)))
    return EnvFactory(
        spec=_spec_fields(spec) if spec is not None else None,
        entry=entry,
        kwargs=dict(kwargs),
        wrappers=tuple(wrapper_entries),
        module=module,
        main=main_refs(spec) if spec is not None else {},
    )


def _spec_fields(spec: EnvSpec) -> dict[str, Any]:
    """The fields of an EnvSpec as a dict; entry points made import strings where they have one."""
    return {
        "id": spec.id,
        "entry_point": _as_ref(spec.entry_point) if spec.entry_point is not None else None,
        "reward_threshold": spec.reward_threshold,
        "nondeterministic": spec.nondeterministic,
        "max_episode_steps": spec.max_episode_steps,
        "order_enforce": spec.order_enforce,
        "disable_env_checker": spec.disable_env_checker,
        "kwargs": copy.deepcopy(dict(spec.kwargs)),
        "additional_wrappers": [
            {"name": w.name, "entry_point": w.entry_point, "kwargs": w.kwargs} for w in spec.additional_wrappers
        ],
        "vector_entry_point": spec.vector_entry_point if isinstance(spec.vector_entry_point, str) else None,
    }


def _spec_from_fields(fields: Mapping[str, Any]) -> EnvSpec:
    fields = dict(fields)
    fields["kwargs"] = copy.deepcopy(dict(fields.get("kwargs") or {}))
    fields["additional_wrappers"] = tuple(
        WrapperSpec(w["name"], w["entry_point"], w["kwargs"]) for w in fields.get("additional_wrappers") or ())
    return EnvSpec(**fields)


def _ref_name(ref: Any) -> str:
    if isinstance(ref, str):
        return ref
    return getattr(ref, "__qualname__", None) or repr(ref)


# ---------------------------------------------------------------------------------------------
# Validation of env_fns, before any worker starts
# ---------------------------------------------------------------------------------------------

def _instance_message(where: str, obj: Any, public_name: str | None = None) -> str:
    got = f" ({public_name} got an env instance; it builds every env anew, in a worker)" if public_name else ""
    return (
        f"{where} is a {type(obj).__name__} instance, not a factory{got}: pass a callable that returns a new env "
        "each time it is called, e.g. [lambda: gym.make('CartPole-v1')] * n or [shmvec.make_env('CartPole-v1')] * n "
        "-- not [env] * n (an env cannot be shared between workers)."
    )


def _packages(obj: Any) -> set[str]:
    """The top-level packages that define ``obj``'s class and its bases (no package is imported)."""
    return {str(getattr(c, "__module__", "")).split(".")[0] for c in type(obj).__mro__}


def _sb3_face(public_name: str) -> bool:
    """Whether ``public_name`` is an SB3 ``VecEnv`` (its users build it with SB3's ``make_vec_env``)."""
    return "VecEnv" in public_name


def mistaken_env_hint(obj: Any, public_name: str, agents: bool = False) -> str | None:
    """What ``obj`` is and what to do instead, when it is often taken for a single Gymnasium env
    (or its factory): a PettingZoo env, a vector env, an env of the old ``gym`` package or of
    dm_control; None otherwise.  Known by the modules of its class: nothing is imported.

    :param agents: ``public_name`` runs PettingZoo envs (``ShmMultiAgentVecEnv``, ``ShmParallelEnv``).
    """
    packages = _packages(obj)
    name = type(obj).__name__
    if "pettingzoo" in packages and agents:
        return (f"a PettingZoo env instance ({name}), not a factory: {public_name} builds every env in a worker, "
                "from callables that each return a new env, e.g. [lambda: simple_spread_v3.parallel_env()] * n_envs")
    if "pettingzoo" in packages:
        return (
            f"a PettingZoo multi-agent env ({name}): {public_name} runs single-agent Gymnasium envs. For a PettingZoo "
            "env (a ParallelEnv, or an AEC env) use shmvec.ShmMultiAgentVecEnv(env_fns), one SB3 row per agent, or "
            "shmvec.ShmParallelEnv(env_fns), PettingZoo's API over a batch of envs (docs/multi-agent.md). "
            "SuperSuit's way works too, a vector env of one single-agent env per agent: "
            "env = supersuit.pettingzoo_env_to_vec_env_v1(parallel_env); "
            "env = supersuit.concat_vec_envs_v1(env, n_copies, base_class='stable_baselines3') (an AEC env goes "
            "through pettingzoo.utils.conversions.aec_to_parallel first)."
        )
    if _is_vector_env(obj, packages):
        n = getattr(obj, "num_envs", None)
        return (
            f"a vector env ({name}{f' of {n} envs' if isinstance(n, int) else ''}): {public_name} vectorizes single "
            "envs itself: it builds its own envs, in its workers. Pass factories that each build one env, e.g. "
            "[lambda: gym.make('CartPole-v1')] * n_envs (for gymnasium.make_vec(id, n): shmvec.make_vec(id, n))."
        )
    if "gym" in packages:
        return (
            f"an env of the old gym package ({name}): {public_name} runs Gymnasium envs. Convert it inside the factory "
            "with shimmy (pip install shimmy): shimmy.GymV26CompatibilityV0(env=env), or "
            "GymV21CompatibilityV0(env=env) for gym < 0.26, or port the env to gymnasium."
        )
    if "dm_control" in packages:
        return (
            f"a dm_control env ({name}): {public_name} runs Gymnasium envs. Convert it inside the factory with shimmy "
            "(pip install shimmy): shimmy.DmControlCompatibilityV0(env)."
        )
    return None


def _is_vector_env(obj: Any, packages: set[str]) -> bool:
    return isinstance(obj, gym.vector.VectorEnv) or ("stable_baselines3" in packages and hasattr(obj, "step_async"))


def not_an_env_error(where: str, obj: Any, public_name: str) -> TypeError:
    """The error for ``obj``, returned by the factory ``where`` (``"env_fns[3]"``) in place of a
    ``gymnasium.Env``, with the hint that fits it."""
    hint = mistaken_env_hint(obj, public_name)
    if hint is not None:
        return TypeError(f"{where} returned {hint}")
    if obj is None:
        return TypeError(f"{where} returned None, not a gymnasium.Env: does the factory `return` the env it builds?")
    if isinstance(obj, type) and issubclass(obj, gym.Env):
        return TypeError(
            f"{where} returned the class {obj.__name__} itself, not an env: the factory must call it "
            f"(lambda: {obj.__name__}(), or pass the class itself as the factory).")
    return TypeError(
        f"{where} returned a value of type {type(obj).__name__}, not a gymnasium.Env: each factory must return a new "
        "env, an instance of a gymnasium.Env subclass (e.g. gym.make('CartPole-v1'))."
    )


def _not_a_factory(where: str, obj: Any, public_name: str, agents: bool = False) -> str:
    """Why ``obj``, found where a factory (or the list of them) was expected, is not one, in the user's words."""
    if isinstance(obj, gym.Env):
        return _instance_message(where, obj, public_name)
    hint = mistaken_env_hint(obj, public_name, agents)
    if hint is not None:
        return f"{where} is {hint}"
    if isinstance(obj, str):
        whole = (f"SB3's make_vec_env({obj!r}, n_envs, vec_env_cls={public_name})" if _sb3_face(public_name)
                 else f"shmvec.make_vec({obj!r}, n_envs)")
        return (
            f"{where} is the string {obj!r}, not a factory: pass a callable that builds the env, e.g. "
            f"[shmvec.make_env({obj!r})] * n_envs (or {whole})."
        )
    if isinstance(obj, numbers.Number):
        return (
            f"{where} is the number {obj!r}, not a factory: {public_name} takes one callable per env, "
            + ("e.g. [lambda: simple_spread_v3.parallel_env()] * n_envs." if agents else
               "e.g. [lambda: gym.make('CartPole-v1')] * n_envs or [shmvec.make_env('CartPole-v1')] * n_envs.")
        )
    return (
        f"{where} is {type(obj).__name__}, not a callable: pass callables that each return a new env, "
        + ("e.g. [lambda: simple_spread_v3.parallel_env()] * n." if agents else
           "e.g. [lambda: gym.make('CartPole-v1')] * n or [shmvec.make_env('CartPole-v1')] * n.")
    )


def factory_list(env_fns: Any, public_name: str = "ShmVecEnv", second: Any = None, agents: bool = False) -> list:
    """``env_fns`` as a list of factories, each checked (:func:`check_factories`): every
    front-end's one check of its first argument, before anything is built.

    :param second: the constructor's second positional argument, to recognise the order
        ``Cls(n_envs, factory)`` (TorchRL's ``ParallelEnv(num_workers, create_env_fn)``).
    :param agents: the factories build PettingZoo envs (the multi-agent front-ends).
    :raises TypeError: ``env_fns`` is not a sequence of callables (a number, one factory, an env,
        a vector env, a PettingZoo env, an env id, ...); the message says what was passed and what
        to write instead.
    :raises ValueError: ``env_fns`` is empty.
    """
    def whole(n: Any) -> str:
        if agents:
            return f"{public_name}([make_parallel_env] * {n})"
        return (f"SB3's make_vec_env(env_id, n_envs={n}, vec_env_cls={public_name})" if _sb3_face(public_name)
                else f"shmvec.make_vec(env_id, num_envs={n})")

    def usage(n: Any = "n_envs") -> str:
        return whole(n) if agents else f"{public_name}([make_env] * {n}), or {whole(n)}"

    if isinstance(env_fns, numbers.Number) and not isinstance(env_fns, (bool, np.bool_)):
        if callable(second):
            fn = getattr(second, "__name__", "")
            fn = fn if fn.isidentifier() else "make_env"
            write = f"{public_name}([{fn}] * {env_fns!r})"
            write += f", or {whole(env_fns)}" if fn == "make_env" else f" (the usual form: {usage(env_fns)})"
            raise TypeError(
                f"env_fns is the number {env_fns!r}, followed by a factory: {public_name} takes a list of env "
                f"factories, one per env, not (num_envs, factory) as TorchRL's ParallelEnv(n, make_env); "
                f"{public_name} takes the factories first. Write {write}.")
        raise TypeError(
            f"env_fns is the number {env_fns!r}: {public_name} takes a list of env factories, one per env, not a "
            f"number ({env_fns!r}): {usage(env_fns)}."
        )
    if isinstance(env_fns, str):
        other = (f" (or SB3's make_vec_env({env_fns!r}, n_envs, vec_env_cls={public_name}))" if _sb3_face(public_name)
                 else f" (or shmvec.make_vec({env_fns!r}, num_envs=n))")
        raise TypeError(
            f"env_fns is the string {env_fns!r}, an env id, where {public_name} takes a list of env factories: "
            f"pass callables that build the env, e.g. [shmvec.make_env({env_fns!r})] * n_envs"
            f"{'' if agents else other}.")
    if isinstance(env_fns, gym.Env):
        raise TypeError(_not_a_factory("env_fns", env_fns, public_name))
    hint = mistaken_env_hint(env_fns, public_name, agents)
    if hint is not None:
        got = (f"{public_name} got a vector env where it takes a list of env factories: "
               if _is_vector_env(env_fns, _packages(env_fns)) else "")
        raise TypeError(f"{got}env_fns is {hint}")
    if callable(env_fns) or isinstance(env_fns, bytes):
        raise TypeError(f"env_fns must be a list of factories, got one {type(env_fns).__name__}: {usage()}.")
    try:
        out = list(env_fns)
    except TypeError:
        raise TypeError(f"env_fns ({type(env_fns).__name__}) is not a list of factories: {usage()}.") from None
    if not out:
        raise ValueError(f"{public_name} needs at least one env factory")
    check_factories(out, public_name, agents)
    return out


def check_factories(env_fns: Sequence[Any], public_name: str = "ShmVecEnv", agents: bool = False) -> None:
    """Raises ``TypeError`` for an entry that is an env instance or not callable, saying what it is."""
    for i, fn in enumerate(env_fns):
        if isinstance(fn, gym.Env) or not callable(fn):
            raise TypeError(_not_a_factory(f"env_fns[{i}]", fn, public_name, agents))


# ---------------------------------------------------------------------------------------------
# One factory as plain data (a whole vec env: shmvec._describe)
# ---------------------------------------------------------------------------------------------

def jsonable(value: Any, where: str) -> Any:
    """``value`` if it survives ``json.dumps`` (tuples become lists on the way back), else DescriptionError."""
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise DescriptionError(
            f"{where} is not plain data ({exc}): descriptions hold only JSON types (str, int, float, bool, None, "
            "lists, dicts with str keys). Pass plain values and build objects inside the env or its factory."
        ) from exc
    return value


class _CaptureFactories:
    """Stands in for a VecEnv class so that SB3's make_vec_env hands over its factories."""

    def __init__(self, env_fns: list, **kwargs: Any) -> None:
        self.env_fns = env_fns

    def seed(self, seed: Any = None) -> None:
        pass


def _sb3_closure_vars(fn: Any) -> dict[str, Any] | None:
    """The variables of one of SB3 ``make_vec_env``'s factories, or None if ``fn`` is not one."""
    if not isinstance(fn, types.FunctionType):
        return None
    if fn.__module__ != _SB3_INIT_MODULE or fn.__qualname__ != _SB3_INIT_QUALNAME:
        return None
    names = fn.__code__.co_freevars
    if set(names) != _SB3_INIT_FREEVARS:
        return None
    return {name: cell.cell_contents for name, cell in zip(names, fn.__closure__ or ())}


def describe_factory(fn: Any) -> dict[str, Any]:
    """``fn`` as plain data, from which :func:`factory_from_description` builds an equivalent factory.

    Describable: :class:`EnvFactory` (from :func:`make_env`); the factories of SB3's
    ``make_vec_env`` when ``env_id`` is an env id or an importable callable and its
    ``wrapper_class`` is importable; module-level functions and classes of importable modules,
    and ``functools.partial`` of them with plain arguments.

    :raises DescriptionError: anything else, saying what to use instead.
    """
    if isinstance(fn, EnvFactory):
        return fn.to_dict()
    sb3 = _sb3_closure_vars(fn)
    if sb3 is not None:
        env_id = sb3["env_id"]
        if isinstance(env_id, EnvFactory):  # make_vec_env(make_env("MyEnv-v0"), ...)
            env_ref: Any = env_id.to_dict()
        else:
            env_ref = env_id if isinstance(env_id, str) else import_string(env_id)
        wrapper = sb3["wrapper_class"]
        wrapper_ref = None if wrapper is None else import_string(wrapper)
        if env_ref is None or (wrapper is not None and wrapper_ref is None):
            what = "env_id" if env_ref is None else "wrapper_class"
            raise DescriptionError(
                f"a make_vec_env factory whose {what} ({sb3[what]!r}) has no import string (a lambda, closure or "
                "something defined in __main__) is not plain data: pass an env id, or define it at module level in "
                "an importable module."
            )
        return {
            "type": "sb3_make_vec_env",
            # an env id ("CartPole-v1", "module:Env-v0") or the import string of a callable
            ("env_id" if isinstance(env_id, str) else "env_factory" if isinstance(env_ref, dict) else "env_entry"):
                env_ref,
            "rank": sb3["rank"],
            "seed": sb3["seed"],
            "env_kwargs": jsonable(dict(sb3["env_kwargs"] or {}), "env_kwargs"),
            "monitor_dir": sb3["monitor_dir"],
            "monitor_kwargs": jsonable(dict(sb3["monitor_kwargs"] or {}), "monitor_kwargs"),
            "wrapper_class": wrapper_ref,
            "wrapper_kwargs": jsonable(dict(sb3["wrapper_kwargs"] or {}), "wrapper_kwargs"),
        }
    if isinstance(fn, functools.partial):
        ref = import_string(fn.func)
        if ref is not None:
            return {"type": "make_env", "entry": ref, "args": jsonable(list(fn.args), "partial arguments"),
                    "kwargs": jsonable(dict(fn.keywords), "partial keywords"), "wrappers": []}
    ref = import_string(fn)
    if ref is not None:
        return {"type": "make_env", "entry": ref, "kwargs": {}, "wrappers": []}
    raise DescriptionError(
        f"{fn!r} is not plain data (a lambda, a closure, or something defined in __main__): it works on this "
        "machine, sent with cloudpickle, but cannot be described. Use shmvec.make_env(env_id_or_class, **kwargs), "
        "SB3's make_vec_env with an env id, or a module-level function of an importable module."
    )


def factory_from_description(d: Mapping[str, Any]) -> Callable[[], gym.Env]:
    """The factory a :func:`describe_factory` dict stands for."""
    kind = d.get("type")
    if kind == "make_env":
        return EnvFactory.from_dict(d)
    if kind == "sb3_make_vec_env":
        # Rebuilt by SB3's own make_vec_env, so that it is the same closure SB3 would build.
        from stable_baselines3.common.env_util import make_vec_env

        if "env_id" in d:
            env_id = d["env_id"]
        elif "env_factory" in d:
            env_id = EnvFactory.from_dict(d["env_factory"])
        else:
            env_id = resolve(d["env_entry"])
        captured = make_vec_env(
            env_id, n_envs=1, seed=d.get("seed"), start_index=d["rank"], monitor_dir=d.get("monitor_dir"),
            wrapper_class=resolve(d["wrapper_class"]) if d.get("wrapper_class") else None,
            env_kwargs=dict(d.get("env_kwargs") or {}), vec_env_cls=_CaptureFactories,  # type: ignore[arg-type]
            monitor_kwargs=dict(d.get("monitor_kwargs") or {}), wrapper_kwargs=dict(d.get("wrapper_kwargs") or {}),
        )
        return captured.env_fns[0]  # type: ignore[attr-defined]
    raise DescriptionError(f"unknown factory description type {kind!r} in {dict(d)!r}")
