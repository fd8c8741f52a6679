"""A guard for the classes that own worker processes and shared memory: no copy, no pickle."""

from __future__ import annotations

from typing import Any


class Uncopyable:
    """For the classes that own worker processes and shared memory: ``copy.copy``,
    ``copy.deepcopy`` and pickling raise a ``TypeError`` that says what to do.

    Without it, ``copy.copy`` made a second object sharing the first one's workers and blocks,
    and dropping either closed both (the other then failed with ``Words used after release()``);
    ``copy.deepcopy`` and ``pickle`` failed on multiprocessing's ``AuthenticationString``."""

    __slots__ = ()

    def _not_copyable(self) -> TypeError:
        name = type(self).__name__
        rebuild = (f" To rebuild it elsewhere, save {name}.describe() and call {name}.from_description()."
                   if hasattr(type(self), "describe") else "")
        return TypeError(
            f"a {name} cannot be copied or pickled: it owns worker processes and shared memory, which a copy "
            "would share (dropping either copy would close both). Build another one from the same env "
            f"factories.{rebuild}"
        )

    def __copy__(self) -> Any:
        raise self._not_copyable()

    def __deepcopy__(self, memo: dict) -> Any:
        raise self._not_copyable()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise self._not_copyable()
