"""What a vec env needs to know of the machine: usable cores, start methods, CPU pinning, the forkserver.

- :func:`usable_cores` and :func:`default_start_method`: the defaults of ``n_workers`` and
  ``start_method``;
- :func:`cpu_sets`: the cores each worker is pinned to (the ``cpu_affinity`` option);
- :func:`set_forkserver_preload`: modules multiprocessing's forkserver imports once (the
  ``preload`` option).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver
import numbers
import os
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from shmvec._errors import user_stacklevel

__all__ = ["usable_cores", "default_start_method", "cpu_sets", "set_forkserver_preload"]


def usable_cores() -> int:
    """The number of cores this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_start_method() -> str:
    """As SB3: forkserver where available (thread-safe, cheap), else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def cpu_sets(cpu_affinity: Any, n_workers: int) -> list[frozenset[int] | None]:
    """The cores each worker is pinned to.

    - None/False: no pinning;
    - True: worker w gets the w-th core (cycling) of those this process may run on;
    - a sequence: worker w gets entry ``w % len``, an int (one core) or a collection of cores.
    """
    if cpu_affinity is None or cpu_affinity is False:
        return [None] * n_workers
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("cpu_affinity needs os.sched_setaffinity (Linux)")
    allowed = sorted(os.sched_getaffinity(0))
    if cpu_affinity is True:
        return [frozenset({allowed[w % len(allowed)]}) for w in range(n_workers)]
    usage = "pass True, or a list of one core (or a set of cores) per worker, e.g. cpu_affinity=[0, 1]"
    if isinstance(cpu_affinity, (str, bytes, numbers.Number)) or not isinstance(cpu_affinity, Iterable):
        raise TypeError(f"cpu_affinity={cpu_affinity!r}: {usage}")
    entries = list(cpu_affinity)
    if not entries:
        raise ValueError(f"cpu_affinity is an empty list: {usage}")

    def core(c: Any) -> int:
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral):
            raise TypeError(f"cpu_affinity names cores by number, got {c!r}: {usage}")
        return int(c)

    out = []
    for w in range(n_workers):
        entry = entries[w % len(entries)]
        if isinstance(entry, numbers.Number):
            cores = frozenset({core(entry)})
        elif isinstance(entry, (str, bytes)) or not isinstance(entry, Iterable):
            raise TypeError(f"cpu_affinity entry {entry!r}: {usage}")
        else:
            cores = frozenset(core(c) for c in entry)
        bad = sorted(cores - set(allowed))
        if not cores or bad:
            raise ValueError(
                f"cpu_affinity for worker {w} is {sorted(cores)}; this process may run on cores {allowed} only")
        out.append(cores)
    return out


def _forkserver_running() -> bool:
    server = multiprocessing.forkserver._forkserver
    return getattr(server, "_forkserver_pid", None) is not None


def set_forkserver_preload(modules: Iterable[str]) -> bool:
    """Makes multiprocessing's forkserver import ``modules`` once, so that its children inherit them.

    multiprocessing's forkserver is one process per parent process, started lazily on first use
    (by any library); modules named here are imported by it when it starts, and every worker
    forked from it then finds them already imported (``import torch`` costs a worker nothing).
    ``"__main__"`` is kept in the list, as multiprocessing does by default.

    :returns: True if the forkserver will preload them; False (with a ``RuntimeWarning``) if it is
        already running without them: it cannot be told to import more.  Call this early, before
        anything starts a process with the forkserver method.
    """
    if isinstance(modules, str):
        raise TypeError(f"preload takes a list of module names, e.g. [{modules!r}], not a string")
    modules = list(modules)
    if not all(isinstance(m, str) for m in modules):
        raise TypeError("preload takes module names (strings)")
    server = multiprocessing.forkserver._forkserver
    current = list(getattr(server, "_preload_modules", ["__main__"]))
    wanted = current + [m for m in modules if m not in current]
    if "__main__" not in wanted:
        wanted.insert(0, "__main__")
    if _forkserver_running():
        missing = [m for m in modules if m not in current]
        if missing:
            warnings.warn(
                f"the forkserver is already running without {missing}: preloading has no effect in this process, and "
                "each worker imports them itself. Call shmvec.set_forkserver_preload(...) (or pass preload= to the "
                "first ShmVecEnv) before anything starts a process with the forkserver method.",
                RuntimeWarning, stacklevel=user_stacklevel(),
            )
            return False
        return True
    mp.get_context("forkserver").set_forkserver_preload(wanted)
    return True
