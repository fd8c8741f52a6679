"""The options of a vec env's engine: every constructor check, in one frozen dataclass.

:func:`Options.build` validates what the user passed (types, ranges, contradictions) once, at the
boundary, and resolves the defaults (worker count, start method, spin budgets, CPU sets); the
engine and its parts then trust the result.  ``describe()`` reads :attr:`Options.given`, the
arguments as the user passed them, so that a description rebuilt on another machine resolves
its defaults there.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from shmvec import _protocol as P
from shmvec import factories as F
from shmvec._actions import INVALID_ACTIONS
from shmvec._layout import split_envs
from shmvec._machine import Taken, cores_taken, cpu_budget, cpu_sets, default_start_method, usable_cores
from shmvec._threads import AUTO, check_parent_threads

ON_FAILURE = ("raise", "restart")
# (parent, worker) microseconds of yielding spin before a wait sleeps on the futex; why these
# values: docs/design.md, "Spin, then sleep".  The parent spins only when a core is free for it:
# fewer workers than the CPU budget (shmvec._machine.cpu_budget) that sets the default n_workers.
DEFAULT_WORKER_SPIN_US = 5000.0
DEFAULT_PARENT_SPIN_US = 1000.0


def default_n_workers(n_envs: int, taken: int = 0) -> int:
    """No more workers than the CPU budget (physical cores this process may run on, within its
    cgroup CPU quota: :func:`shmvec._machine.cpu_budget`) less the cores other processes keep
    busy (``taken``, :func:`shmvec._machine.cores_taken`), nor than envs."""
    return max(1, min(n_envs, usable_cores() - taken))


def spin_pair(spin_us: Any) -> tuple[float, float]:
    """``spin_us`` as (parent, worker) microseconds: one number for both, or a pair."""
    pair = (spin_us, spin_us) if isinstance(spin_us, numbers.Real) else spin_us
    try:
        parent_us, worker_us = pair
    except (TypeError, ValueError):
        raise TypeError(
            f"spin_us must be a number of microseconds or a (parent, worker) pair of them, not {spin_us!r}"
        ) from None
    for name, value in (("parent", parent_us), ("worker", worker_us)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(value):
            raise TypeError(f"spin_us: the {name}'s spin must be a number of microseconds, not {value!r}")
    return float(parent_us), float(worker_us)


def whole(name: str, value: Any, minimum: int) -> int | None:
    """``value`` as an int (None stays None): integers, and floats of whole value
    (``os.cpu_count() / 2``); TypeError for 2.5, a string or a bool, ValueError below ``minimum``."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and (
            isinstance(value, numbers.Integral) or float(value).is_integer()):
        value = int(value)
    else:
        raise TypeError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_zero_copy(zero_copy: Any, copy: bool, on_failure: str) -> bool | None:
    """``zero_copy`` resolved against the options it cannot go with: False where the default
    (None) meets them, ValueError where ``True`` does (shmvec._leases)."""
    if zero_copy is not None and not isinstance(zero_copy, (bool, np.bool_)):
        raise TypeError(f"zero_copy must be True, False or None (by the observations' size), not {zero_copy!r}")
    why_not = ("copy=False hands out the shared buffers themselves, which the next step overwrites" if not copy
               else "on_failure='restart' rewrites the observations of restarted envs in place"
               if on_failure == "restart" else None)
    if why_not is None or zero_copy is False:
        return None if zero_copy is None else bool(zero_copy)
    if zero_copy:
        raise ValueError(f"zero_copy=True cannot go with these options: {why_not}. Leave zero_copy at None "
                         "(its default: on where it applies).")
    return False


@dataclass(frozen=True)
class Options:
    """A vec env's options, checked and resolved (see :meth:`build`); the parameters are
    documented on :class:`shmvec.ShmVecEnv`."""

    n_envs: int
    n_workers: int
    start_method: str
    copy: bool
    worker_threads: int | None
    timeout: float | None
    parent_spin_s: float
    worker_spin_s: float
    mailbox_bytes: int
    on_failure: str
    max_restarts: int | None
    invalid_actions: str
    cpu_sets: tuple
    preload: tuple[str, ...]
    action_masks: bool | None
    zero_copy: bool | None  # observations handed out without a copy (shmvec._leases); None: by size
    parent_threads: Any  # "auto", None or an int: torch's threads in the parent (shmvec._threads)
    slices: tuple[range, ...]
    autoreset: str  # how workers reset finished envs (shmvec._protocol)
    public_name: str  # the class the user holds, named in errors
    taken: Taken  # the cores other processes kept busy as it started (the defaults leave them out)
    given: Mapping[str, Any]  # the constructor's arguments but the factories, as passed (describe())

    @property
    def restart(self) -> bool:
        return self.on_failure == "restart"

    def explain(self) -> dict[str, Any]:
        """The worker count and spin budgets as resolved, and why (``describe()["decided"]``)."""
        given = self.given
        if given.get("n_workers") is not None or given.get("envs_per_worker") is not None:
            why_workers = "as given"
        else:
            budget = cpu_budget()
            why_workers = f"the CPU budget, {budget.chosen} ({budget.reason}), at most one per env"
            if self.taken.cores:
                why_workers += f", less {self.taken.cores}: {self.taken.reason}"
        parent_us, worker_us = self.parent_spin_s * 1e6, self.worker_spin_s * 1e6
        if given.get("spin_us") is not None:
            why_spin = "as given"
        elif parent_us:
            why_spin = ("fewer workers than free cores: the parent spins on a core of its own; workers spin only "
                        "while the parent answers within their budget")
        else:
            why_spin = ("no core free of workers" + (" and other processes" if self.taken.cores else "") + ": the "
                        "parent sleeps (it would take a busy core); workers spin only while the parent answers "
                        "within their budget")
        return {"n_workers": {"value": self.n_workers, "why": why_workers, "busy_elsewhere": self.taken.busy},
                "spin_us": {"parent": parent_us, "worker": worker_us, "why": why_spin}}

    @classmethod
    def build(
        cls,
        env_fns: Any,
        *,
        autoreset: str = P.AUTORESET_SAME_STEP,
        public_name: str = "ShmVecEnv",
        restartable: bool = True,
        n_workers: int | None = None,
        start_method: str | None = None,
        copy: bool = True,
        worker_threads: int | None = 1,
        timeout: float | None = None,
        spin_us: float | tuple[float, float] | None = None,
        mailbox_bytes: int = P.MAILBOX_BYTES,
        on_failure: str = "raise",
        max_restarts: int | None = 100,
        invalid_actions: str = "raise",
        envs_per_worker: int | None = None,
        cpu_affinity: bool | Sequence[int | Sequence[int]] | None = None,
        preload: Sequence[str] | None = None,
        action_masks: bool | None = None,
        zero_copy: bool | None = False,
        parent_threads: str | int | None = AUTO,
    ) -> tuple[Options, list]:
        """Checks every argument; returns the options and the factories as a list.

        :raises TypeError, ValueError: an argument of the wrong type or out of range, naming it.
        """
        # The factories first: a number there (the order Cls(n, make_env)) is named as such, before
        # the factory in its place fails the check of n_workers.
        env_fns = F.factory_list(env_fns, public_name, second=n_workers)
        given = dict(n_workers=n_workers, start_method=start_method, copy=copy, worker_threads=worker_threads,
                     timeout=timeout, spin_us=spin_us, mailbox_bytes=mailbox_bytes, on_failure=on_failure,
                     max_restarts=max_restarts, invalid_actions=invalid_actions, envs_per_worker=envs_per_worker,
                     cpu_affinity=cpu_affinity, preload=preload, action_masks=action_masks, zero_copy=zero_copy,
                     parent_threads=parent_threads)
        parent_threads = check_parent_threads(parent_threads)
        n_workers = whole("n_workers", n_workers, 1)
        envs_per_worker = whole("envs_per_worker", envs_per_worker, 1)
        worker_threads = whole("worker_threads", worker_threads, 1)
        mailbox_bytes = whole("mailbox_bytes", mailbox_bytes, 1)  # type: ignore[assignment]
        if isinstance(max_restarts, numbers.Real) and math.isinf(max_restarts) and max_restarts > 0:
            max_restarts = None  # no limit, as None says
        max_restarts = whole("max_restarts", max_restarts, 0)
        given["max_restarts"] = max_restarts  # as the engine kept it (describe())
        for key in ("n_workers", "envs_per_worker", "worker_threads", "mailbox_bytes"):
            given[key] = locals()[key]
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
            timeout = float(timeout)
            if math.isnan(timeout):
                raise ValueError("timeout must be a number of seconds or None, got nan")
            given["timeout"] = timeout
        if isinstance(preload, str):
            raise TypeError(f"preload takes a list of module names, e.g. preload=[{preload!r}], not a string")
        n_envs = len(env_fns)
        if envs_per_worker is not None:
            needed = -(-n_envs // envs_per_worker)
            if n_workers is not None and int(n_workers) != needed:
                raise ValueError(f"n_workers={n_workers} contradicts envs_per_worker={envs_per_worker} for "
                                 f"{n_envs} envs ({needed} workers): pass one of them")
            n_workers = needed
        # Other processes' load, sampled once (a few tens of ms) where a default depends on it.
        taken = cores_taken() if (n_workers is None or spin_us is None) and n_envs > 1 else Taken(0, None, "")
        n_workers = default_n_workers(n_envs, taken.cores) if n_workers is None else n_workers
        if not 1 <= n_workers <= n_envs:
            raise ValueError(f"n_workers must be in [1, {n_envs}] for {n_envs} envs, got {n_workers}")
        start_method = start_method or default_start_method()
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not one of {mp.get_all_start_methods()}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive or None, got {timeout}")
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {ON_FAILURE}, got {on_failure!r}")
        if on_failure == "restart" and not restartable:
            # The Gymnasium-style faces (ShmVectorEnv, ShmEnvPool) run their own step and reset
            # protocols: the truncation report of a restart is SB3's.
            raise ValueError("on_failure='restart' is supported by ShmVecEnv (the SB3 VecEnv) only")
        if invalid_actions not in INVALID_ACTIONS:
            raise ValueError(f"invalid_actions must be one of {INVALID_ACTIONS}, got {invalid_actions!r}")
        zero_copy = check_zero_copy(zero_copy, copy, on_failure)
        sets = cpu_sets(cpu_affinity, n_workers)
        if preload and start_method != "forkserver":
            raise ValueError(f"preload applies to start_method='forkserver' only, not {start_method!r}")
        if spin_us is None:
            # The parent spins only on a core that no worker and no other process keeps busy.
            spin_us = (DEFAULT_PARENT_SPIN_US if n_workers < usable_cores() - taken.cores else 0.0,
                       DEFAULT_WORKER_SPIN_US)
        parent_us, worker_us = spin_pair(spin_us)
        options = cls(
            n_envs=n_envs, n_workers=n_workers, start_method=start_method, copy=copy, worker_threads=worker_threads,
            timeout=timeout, parent_spin_s=max(0.0, parent_us) * 1e-6, worker_spin_s=max(0.0, worker_us) * 1e-6,
            mailbox_bytes=mailbox_bytes, on_failure=on_failure, max_restarts=max_restarts,  # type: ignore[arg-type]
            invalid_actions=invalid_actions, cpu_sets=tuple(sets), preload=tuple(preload or ()),
            action_masks=action_masks, zero_copy=zero_copy, parent_threads=parent_threads, taken=taken, slices=tuple(split_envs(n_envs, n_workers)), autoreset=autoreset,
            public_name=public_name, given=MappingProxyType(given),
        )
        return options, env_fns
