"""Pickling for workers: env factories checked once, before any worker starts, and values sent back.

- :func:`pickle_factories` pickles a worker's slice of ``env_fns`` with cloudpickle (lambdas and
  closures are fine); a factory that cannot be pickled is an :class:`UnpicklableFactoryError`
  naming the path to the offending object (``env_fns[3] -> closure variable 'server' ->
  socket.socket``), found by :func:`find_unpicklable`;
- :func:`dumps` pickles what workers (and Ray actors) send back: ``pickle``, or cloudpickle for
  classes of the user's ``__main__``.

Imported by worker processes: nothing heavier than cloudpickle.
"""

from __future__ import annotations

import functools
import pickle
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle

from shmvec._errors import ShmVecEnvError

__all__ = ["UnpicklableFactoryError", "dumps", "pickle_factories", "find_unpicklable"]


class UnpicklableFactoryError(ShmVecEnvError, TypeError):
    """An env factory cannot be pickled to send it to a worker (the message names the offending object)."""


def dumps(obj: Any) -> bytes:
    """``pickle.dumps``, or cloudpickle's for what only it can pickle.

    A class defined in the user's script (``__main__``) reaches spawn and forkserver workers by
    value, inside the cloudpickled factories; pickle then cannot name it ("not the same object as
    __main__.X") when a space, an info or an answer holds one.  cloudpickle sends it by value, and
    the parent's ``pickle.loads`` gets back its own class (cloudpickle tracks the classes it sent).
    """
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception as exc:
        try:
            return cloudpickle.dumps(obj, protocol=5)
        except Exception as again:  # pickle's error names the first object it met; cloudpickle's the real culprit
            exc.add_note(f"shmvec: cloudpickle failed too: {type(again).__name__}: {again}")
            raise exc from None


def pickle_factories(env_fns: Sequence[Callable], indices: range) -> bytes:
    """``cloudpickle.dumps(env_fns[indices])``, or an :class:`UnpicklableFactoryError` naming the culprit."""
    try:
        return cloudpickle.dumps(list(env_fns[indices.start:indices.stop]))
    except Exception:
        pass
    for i in indices:
        try:
            cloudpickle.dumps(env_fns[i])
        except Exception as exc:
            path, culprit_exc = find_unpicklable(env_fns[i], f"env_fns[{i}]")
            raise UnpicklableFactoryError(
                f"env_fns[{i}] cannot be pickled to send it to a worker: {' -> '.join(path)} cannot be pickled "
                f"({type(culprit_exc or exc).__name__}: {culprit_exc or exc}). Build such objects (sockets, locks, "
                "clients, native handles) inside the env or inside its factory, and pass plain data to the factory "
                "instead (host and port, a path, a seed)."
            ) from exc
    # Each pickles alone but not together (should not happen): let cloudpickle say why.
    return cloudpickle.dumps(list(env_fns[indices.start:indices.stop]))


def _pickle_error(obj: Any) -> BaseException | None:
    try:
        cloudpickle.dumps(obj)
    except RecursionError:
        return None
    except Exception as exc:
        return exc
    return None


def _type_name(obj: Any) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _children(obj: Any) -> list[tuple[str, Any]]:
    """(label, child) pairs of what pickling ``obj`` would also pickle, as far as we can tell."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, functools.partial):
        out.append(("partial function", obj.func))
        out += [(f"partial argument {k}", a) for k, a in enumerate(obj.args)]
        out += [(f"partial keyword {k!r}", v) for k, v in obj.keywords.items()]
    elif isinstance(obj, types.MethodType):
        out.append((f"self of bound method {obj.__func__.__qualname__!r}", obj.__self__))
    elif isinstance(obj, types.FunctionType):
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                out.append((f"closure variable {name!r}", cell.cell_contents))
            except ValueError:  # an empty cell
                continue
        glob = obj.__globals__
        for name in code.co_names:
            if name in glob and not isinstance(glob[name], types.ModuleType):
                out.append((f"global {name!r}", glob[name]))
        out += [(f"default argument {k}", d) for k, d in enumerate(obj.__defaults__ or ())]
        out += [(f"keyword default {k!r}", d) for k, d in (obj.__kwdefaults__ or {}).items()]
    elif isinstance(obj, Mapping):
        out += [(f"[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out += [(f"[{k}]", v) for k, v in enumerate(obj)]
    else:
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            out += [(f"attribute {k!r}", v) for k, v in attrs.items()]
        for slot in getattr(type(obj), "__slots__", ()) or ():
            if isinstance(slot, str) and hasattr(obj, slot):
                out.append((f"attribute {slot!r}", getattr(obj, slot)))
    return out


def find_unpicklable(obj: Any, root: str = "obj", max_depth: int = 6) -> tuple[list[str], BaseException | None]:
    """The path from ``obj`` to the innermost object that cannot be pickled, and its pickling error.

    Walks closures (``__closure__``/``co_freevars``), globals a function uses, ``functools.partial``
    arguments, the ``__self__`` of bound methods, containers and object attributes, a few levels
    deep.  The path ends with the culprit's type: ``["env_fns[3]", "closure variable 'server'",
    "socket.socket"]``.
    """
    path = [root]
    error = _pickle_error(obj)
    seen = {id(obj)}
    for _ in range(max_depth):
        for label, child in _children(obj):
            if id(child) in seen:
                continue
            child_error = _pickle_error(child)
            if child_error is not None:
                seen.add(id(child))
                path.append(label)
                obj, error = child, child_error
                break
        else:
            break
    path.append(_type_name(obj))
    return path, error
