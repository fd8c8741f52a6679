"""Container spaces (``Dict``, ``Tuple``): the one place that knows their kinds.

Every walker over a space (the layout of the shared block, the actions' writer, the observation
builders, the worker's unbatching, the pools, Ray's batching) recurses into a container the same
way: it asks :func:`children` for the container's ``(key, subspace)`` pairs, walks each, and
puts the results back together with the function :func:`assembler` gives for that kind.  Both
dispatch on the space's class (``functools.singledispatch``), so a new container kind is one
registration of each here, and every walker takes it.

- :func:`children`: the ``(key, subspace)`` pairs of a container (a ``Dict``'s keys in order, a
  ``Tuple``'s positions), ``None`` for any other space (a leaf);
- :func:`assembler`: a function of the children's values, in :func:`children`'s order, that gives
  the container's value (a ``dict``, or ``top_dict`` for a top-level ``Dict`` batch of SB3; a
  ``tuple``): resolved once when a walker is built, so that the per-step cost is one call;
- :func:`is_keyed`: whether a container's value is reached by its keys (a mapping: ``Dict``) or
  by position (a sequence: ``Tuple``), for the checks of a user's batched value;
- :func:`batched_form`: the words that describe the batched form of a container's value in error
  messages ("a dict of batches, one per key").

Only Gymnasium's spaces are imported: every layer may use this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import singledispatch
from typing import Any

from gymnasium import spaces

__all__ = ["children", "assembler", "is_keyed", "batched_form", "child_values"]


def _not_a_container(space: spaces.Space) -> TypeError:
    return TypeError(f"{type(space).__name__} is not a container space (Dict or Tuple)")


@singledispatch
def children(space: spaces.Space) -> list[tuple[Any, spaces.Space]] | None:
    """The ``(key, subspace)`` pairs of a container space, in order; ``None`` for a leaf."""
    return None


@children.register
def _(space: spaces.Dict) -> list[tuple[Any, spaces.Space]]:
    return list(space.spaces.items())


@children.register
def _(space: spaces.Tuple) -> list[tuple[Any, spaces.Space]]:
    return list(enumerate(space.spaces))


@singledispatch
def assembler(space: spaces.Space, top_dict: type = dict) -> Callable[[Iterable[Any]], Any]:
    """A function of the children's values (in :func:`children`'s order) giving the container's
    value; ``top_dict`` is the mapping type of a ``Dict``'s value.

    :raises TypeError: ``space`` is not a container.
    """
    raise _not_a_container(space)


@assembler.register
def _(space: spaces.Dict, top_dict: type = dict) -> Callable[[Iterable[Any]], Any]:
    keys = tuple(space.spaces)
    return lambda values: top_dict(zip(keys, values))


@assembler.register
def _(space: spaces.Tuple, top_dict: type = dict) -> Callable[[Iterable[Any]], Any]:
    return tuple


@singledispatch
def is_keyed(space: spaces.Space) -> bool:
    """Whether a container's value is reached by key (a mapping) rather than by position."""
    raise _not_a_container(space)


@is_keyed.register
def _(space: spaces.Dict) -> bool:
    return True


@is_keyed.register
def _(space: spaces.Tuple) -> bool:
    return False


@singledispatch
def batched_form(space: spaces.Space) -> str:
    """The batched form of a container's value, in words, for error messages."""
    raise _not_a_container(space)


@batched_form.register
def _(space: spaces.Dict) -> str:
    return "a dict of batches, one per key"


@batched_form.register
def _(space: spaces.Tuple) -> str:
    return f"a tuple of {len(space.spaces)} batches, one per subspace"


def child_values(space: spaces.Space, value: Any) -> list[Any]:
    """The children's parts of a container's ``value`` (``value[key]`` for each of :func:`children`'s keys)."""
    kids = children(space)
    if kids is None:
        raise _not_a_container(space)
    return [value[key] for key, _ in kids]
