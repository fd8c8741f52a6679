"""The parent's env registrations that a fresh worker lacks, registered in ``spawn`` and ``forkserver`` workers.

``gymnasium.register("MyEnv-v0", ...)`` under ``if __name__ == "__main__":`` registers the env in
the parent only.  A ``spawn`` or ``forkserver`` worker is a fresh interpreter, so a factory that
looks the id up there (``lambda: gym.make("MyEnv-v0")``, SB3's ``make_vec_env("MyEnv-v0")``)
would raise ``NameNotFound``.  So:

- :func:`pack_registrations` pickles, once per vec env, each entry of the parent's registry (the
  ``EnvSpec`` as the parent has it: kwargs, ``max_episode_steps``, wrappers, ...) but Gymnasium's
  own, which every interpreter registers on ``import gymnasium``.  Entry points defined in
  ``__main__`` (classes and functions, or ``"__main__:Name"`` strings) travel by value with
  cloudpickle; other objects by reference, strings as strings.  The objects of ``__main__`` that
  a wrapper's ``"__main__:Name"`` names (Gymnasium loads wrappers from strings only) travel by
  value beside the spec, and the worker's ``__main__`` gets those it lacks.  Each spec is pickled on its own,
  so that one that cannot be pickled (a lock in its kwargs) leaves the others alone, and a worker
  unpickles only the specs it lacks;
- :func:`register_missing` runs in each worker before it unpickles or calls a factory: it
  registers every id the worker does not have.  An id it has (Gymnasium's own, or one that a
  module it imported registered) keeps the worker's registration.  A worker restarted by
  ``on_failure="restart"`` gets the same bytes;
- :func:`explain_not_found` adds a note to a worker's "env not found" error when the id is
  registered in this process but its registration could not be sent (or, in the worker, loaded).

Gymnasium's own ids are told apart without pickling them: entries whose entry point lives in
the ``gymnasium`` package and whose id is a string constant of ``gymnasium.envs``' code, where
Gymnasium registers them (read once per process).  Anything not recognised is sent: a spec sent
needlessly costs a few microseconds, a missing one costs the run.

Imported by worker processes: nothing heavier than Gymnasium and cloudpickle.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import pickle
import re
import types
from collections.abc import Mapping
from typing import Any

import cloudpickle
import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, parse_env_id

from shmvec.factories import main_object, main_refs, provide_main

__all__ = ["Registrations", "pack_registrations", "register_missing", "explain_not_found", "gymnasium_own_ids"]


@dataclasses.dataclass(frozen=True)
class Registrations:
    """What :func:`pack_registrations` found to send: ``data`` for the workers (None: nothing),
    the ids in it, and the ids left out with the reason (their spec does not pickle)."""

    data: bytes | None = None
    ids: tuple[str, ...] = ()
    left_out: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _str_constants(code: types.CodeType) -> set[str]:
    out: set[str] = set()
    for const in code.co_consts:
        if isinstance(const, str):
            out.add(const)
        elif isinstance(const, types.CodeType):
            out |= _str_constants(const)
    return out


@functools.lru_cache(maxsize=1)
def gymnasium_own_ids() -> frozenset[str]:
    """The string constants of ``gymnasium.envs``' code: a superset of the ids Gymnasium registers
    on import (empty when the code cannot be read, and then every registration is sent)."""
    try:
        found = importlib.util.find_spec("gymnasium.envs")
        code = found.loader.get_code("gymnasium.envs")  # type: ignore[union-attr]
    except Exception:
        return frozenset()
    return frozenset(_str_constants(code)) if code is not None else frozenset()


def _in_gymnasium(entry: Any) -> bool:
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] == "gymnasium"


def _is_gymnasiums_own(spec: EnvSpec, own_ids: frozenset[str]) -> bool:
    entry = spec.entry_point if spec.entry_point is not None else spec.vector_entry_point
    return spec.id in own_ids and _in_gymnasium(entry)


def _by_value(spec: EnvSpec) -> EnvSpec:
    """``spec``, or a copy whose ``"__main__:Name"`` entry points are the objects they name: a
    spawned worker's ``__main__`` (of a notebook, ``python -c`` or stdin) has no ``Name``."""
    changes = {}
    for field in ("entry_point", "vector_entry_point"):
        ref = getattr(spec, field)
        found = main_object(ref) if isinstance(ref, str) else None
        if found is not None:
            changes[field] = found
    if not changes:
        return spec
    out = copy.copy(spec)
    for field, value in changes.items():
        setattr(out, field, value)
    return out


def pack_registrations(start_method: str) -> Registrations:
    """The registrations to send to workers started with ``start_method`` (none for ``fork``:
    its workers inherit the registry)."""
    if start_method == "fork":
        return Registrations()
    own_ids = gymnasium_own_ids()
    parts: list[tuple[str, bytes]] = []
    left_out: dict[str, str] = {}
    for env_id, spec in list(gym.registry.items()):  # a copy: another thread may register meanwhile
        if _is_gymnasiums_own(spec, own_ids):
            continue
        try:
            mains = main_refs(spec, entry_points=False)  # a spec alone, or with its wrappers' __main__ objects
            sent = (_by_value(spec), mains) if mains else _by_value(spec)
            parts.append((env_id, cloudpickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL)))
        except Exception as exc:
            left_out[env_id] = f"could not be pickled ({type(exc).__name__}: {exc})"
    if not parts:
        return Registrations(left_out=left_out)
    return Registrations(pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL), tuple(i for i, _ in parts), left_out)


def register_missing(data: bytes | None) -> dict[str, str]:
    """In a worker: registers each id of ``data`` (from :func:`pack_registrations`) that this
    process does not have; returns the ids whose spec did not unpickle here, with the reason."""
    if not data:
        return {}
    registry = gym.registry
    failed: dict[str, str] = {}
    for env_id, blob in pickle.loads(data):
        if env_id in registry:
            continue
        try:
            spec = cloudpickle.loads(blob)
        except Exception as exc:  # a module the parent imported and this process cannot
            failed[env_id] = f"could not be unpickled in the worker ({type(exc).__name__}: {exc})"
            continue
        if isinstance(spec, tuple):
            spec, mains = spec
            provide_main(mains)
        # Stored as gymnasium.register() stores it, without its checks: the parent's register()
        # ran them, and they scan the whole registry for each id.
        registry[env_id] = spec
    return failed


# ---------------------------------------------------------------------------------------------
# Explaining a worker's "env not found"
# ---------------------------------------------------------------------------------------------

def explain_not_found(exc: BaseException, not_sent: Mapping[str, str]) -> None:
    """Adds a note to a worker's "env not found" error ``exc`` when the id it asked for is one of
    ``not_sent`` (id -> why its registration did not reach the worker: "could not be pickled
    (...)"), in the parent or in the worker.  A typo, or any other id, gets no note."""
    if not not_sent:
        return
    not_found = (gym.error.NameNotFound, gym.error.NamespaceNotFound, gym.error.VersionNotFound)
    text = str(exc)
    if not (isinstance(exc, not_found) or (isinstance(exc, gym.error.Error) and "No registered env" in text)):
        return
    for env_id, why in not_sent.items():
        if _asked_for(text, env_id):
            exc.add_note(
                f"shmvec: {env_id!r} is registered in the parent process, but its registration {why}, so the "
                "worker (a fresh interpreter under spawn and forkserver) does not have it. Keep objects that cannot "
                "be pickled out of its kwargs (build them inside the env), or register the env in an importable "
                "module and use the id 'module:EnvName-v0'."
            )
            return


def _asked_for(text: str, env_id: str) -> bool:
    """Whether Gymnasium's "not found" message ``text`` is about ``env_id``: the id the worker
    asked for, as its messages name it."""
    namespace, name, version = parse_env_id(env_id)
    parts = {"namespace": str(namespace), "name": name, "version": str(version)}
    for pattern, fields in (
        (r"Environment version `v(\d+)` for environment `([^`]+)` doesn't exist", ("version", "name")),
        (r"Environment `([^`]+)` doesn't exist in namespace (\S+?)\.", ("name", "namespace")),
        (r"Environment `([^`]+)` doesn't exist", ("name",)),
        (r"Namespace (\S+) not found", ("namespace",)),
    ):
        found = re.search(pattern, text)
        if found is None:
            continue
        asked = dict(zip(fields, found.groups()))
        if "name" in asked and "/" in asked["name"]:
            asked["namespace"], asked["name"] = asked["name"].rsplit("/", 1)
        elif fields == ("name",):
            asked["namespace"] = "None"  # no namespace named: the id has none
        return all(parts[key] == value for key, value in asked.items())
    return False
