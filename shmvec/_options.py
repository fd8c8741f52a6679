"""The options of a vec env's engine: declared once, checked once, in one frozen dataclass.

:data:`OPTIONS` declares each constructor option once (:class:`Option`: its name, annotation,
default, check and the docs table's words).  From it come the checks :func:`Options.build` runs
on each option alone, the defaults (and the signature) of :func:`Options.build`, the options
``describe()`` records (:attr:`Options.given`, and :func:`plain_option` for their plain-data
form), and the options table of docs/sb3.md (:func:`options_table`).  The front-ends keep their
hand-written, typed signatures; tests/units/test_options_declared.py checks each against
:data:`OPTIONS`, and the docs table against :func:`options_table`.

:func:`Options.build` validates what the user passed (types, ranges, contradictions) once, at the
boundary, and resolves the defaults (worker count, start method, spin budgets, CPU sets); the
engine and its parts then trust the result.  ``describe()`` reads :attr:`Options.given`, the
arguments as the user passed them, so that a description rebuilt on another machine resolves
its defaults there.
"""

from __future__ import annotations

import inspect
import math
import multiprocessing as mp
import numbers
from collections.abc import Callable, Mapping
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


# ---- the checks of one option alone: (name, value) -> the value kept, or TypeError/ValueError naming it ----

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


def at_least(minimum: int) -> Callable[[str, Any], int | None]:
    """The check of a whole-number option (None allowed): :func:`whole` with this minimum."""
    def check(name: str, value: Any) -> int | None:
        return whole(name, value, minimum)
    return check


def one_of(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    """The check of an option that takes one of ``choices``."""
    def check(name: str, value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        return value
    return check


def start_method_check(name: str, value: Any) -> Any:
    """A start method of this platform, or None (empty) for the default."""
    if value and value not in mp.get_all_start_methods():
        raise ValueError(f"{name} {value!r} is not one of {mp.get_all_start_methods()}")
    return value


def seconds(name: str, value: Any) -> float | None:
    """A positive number of seconds as a float, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be a number of seconds or None, got nan")
    if value <= 0:
        raise ValueError(f"{name} must be positive or None, got {value}")
    return value


def spin_check(name: str, value: Any) -> Any:
    """None (the default, resolved by :meth:`Options.build`) or what :func:`spin_pair` takes; kept as given."""
    if value is not None:
        spin_pair(value)
    return value


def restart_limit(name: str, value: Any) -> int | None:
    """A whole number >= 0, or None (an infinite float too) for no limit."""
    if isinstance(value, numbers.Real) and math.isinf(value) and value > 0:
        return None  # no limit, as None says
    return whole(name, value, 0)


def module_names(name: str, value: Any) -> Any:
    """A list of module names (or None); a string alone is refused, saying the list to pass."""
    if isinstance(value, str):
        raise TypeError(f"{name} takes a list of module names, e.g. {name}=[{value!r}], not a string")
    return value


def zero_copy_value(name: str, value: Any) -> Any:
    """True, False or None."""
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or None (by the observations' size), not {value!r}")
    return value


def parent_threads_check(name: str, value: Any) -> Any:
    """``"auto"``, None or a whole number >= 1 (:func:`shmvec._threads.check_parent_threads`)."""
    return check_parent_threads(value)


def check_zero_copy(zero_copy: Any, copy: bool, on_failure: str) -> bool | None:
    """``zero_copy`` resolved against the options it cannot go with: False where the default
    (None) meets them, ValueError where ``True`` does (shmvec._leases)."""
    zero_copy_value("zero_copy", zero_copy)
    why_not = ("copy=False hands out the shared buffers themselves, which the next step overwrites" if not copy
               else "on_failure='restart' rewrites the observations of restarted envs in place"
               if on_failure == "restart" else None)
    if why_not is None or zero_copy is False:
        return None if zero_copy is None else bool(zero_copy)
    if zero_copy:
        raise ValueError(f"zero_copy=True cannot go with these options: {why_not}. Leave zero_copy at None "
                         "(its default: on where it applies).")
    return False


def cores_plain(value: Any) -> Any:
    """``cpu_affinity`` as plain data: each collection of cores a sorted list."""
    if isinstance(value, (list, tuple)):
        return [sorted(v) if isinstance(v, (set, frozenset, tuple, list)) else v for v in value]
    return value


# ---- the declaration ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One constructor option of the engine, declared once (see :data:`OPTIONS`).

    :param name: the keyword.
    :param annotation: as the front-ends' signatures write it (a string: their annotations are postponed).
    :param default: the front-ends' default.
    :param what: what it does, for the docs table (markdown; links relative to docs/).
    :param default_is: the docs table's default where the value alone says too little (markdown).
    :param check: ``check(name, value)``: the option alone, checked; returns the value kept
        (``describe()`` records it) or raises TypeError/ValueError naming the option.  None: any
        value passes here.  Rules between options (``envs_per_worker`` against ``n_workers``,
        ``preload`` against ``start_method``, ...) are :meth:`Options.build`'s.
    :param plain: how ``describe()`` writes the value as plain data (None: as it is).
    """

    name: str
    annotation: str
    default: Any
    what: str
    default_is: str = ""
    check: Callable[[str, Any], Any] | None = None
    plain: Callable[[Any], Any] | None = None

    def default_doc(self) -> str:
        """The docs table's default column."""
        if self.default_is:
            return self.default_is
        return f'`"{self.default}"`' if isinstance(self.default, str) else f"`{self.default!r}`"


# The order is ShmVecEnv's (positional after env_fns), and so the docs table's.
OPTIONS: tuple[Option, ...] = (
    Option("n_workers", "int | None", None, "worker processes, each stepping a contiguous slice of the envs",
           default_is="one per physical core this process may run on, within its cgroup CPU quota, less the cores "
                      "other processes keep busy as it starts (at most one per env; "
                      "[why](design.md#the-default-number-of-workers))",
           check=at_least(1)),
    Option("start_method", "str | None", None,
           '`"fork"`, `"forkserver"` or `"spawn"` ([start methods](multiprocessing.md#start-methods))',
           default_is='`"forkserver"` where available, else `"spawn"` (as SB3)', check=start_method_check),
    Option("copy", "bool", True,
           "return arrays of their own, or views of shared memory ([copies](#copies))"),
    Option("worker_threads", "int | None", 1, "BLAS/OpenMP/torch threads per worker", check=at_least(1)),
    Option("timeout", "float | None", None,
           "seconds before a silent worker raises `WorkerTimeoutError` ([failures.md](failures.md#timeouts))",
           check=seconds),
    Option("spin_us", "float | tuple[float, float] | None", None,
           "microseconds of yielding spin before a wait sleeps on the futex: one number, or a `(parent, worker)` "
           "pair ([why](design.md#spin-then-sleep))",
           default_is=f"parent {DEFAULT_PARENT_SPIN_US:g} where a core is free of workers and other processes "
                      f"(else 0), workers {DEFAULT_WORKER_SPIN_US:g}",
           check=spin_check),
    Option("mailbox_bytes", "int", P.MAILBOX_BYTES,
           "each worker's shared mailbox for infos and reset arguments; larger messages go through the pipe",
           default_is=f"{P.MAILBOX_BYTES / (1 << 20):g} MiB", check=at_least(1)),
    Option("on_failure", "str", "raise",
           '`"restart"` replaces a failed worker ([restarts](failures.md#restarts-on_failurerestart))',
           check=one_of(ON_FAILURE)),
    Option("max_restarts", "int | None", 100,
           "restarts a vec env may do in its life before the next failure raises `TooManyRestartsError`; "
           "`None`: no limit ([restarts](failures.md#restarts-on_failurerestart))",
           check=restart_limit),
    Option("invalid_actions", "str", "raise",
           '`"warn"` or `"ignore"` ([invalid actions](failures.md#invalid-actions-and-observations))',
           check=one_of(INVALID_ACTIONS)),
    Option("envs_per_worker", "int | None", None,
           "at most this many envs per process ([one env per process](multiprocessing.md#one-env-per-process))",
           check=at_least(1)),
    Option("cpu_affinity", "bool | Sequence[int | Sequence[int]] | None", None,
           "`True` pins worker w to the w-th core this process may use; a list of cores or core sets sets them "
           "per worker; `False` leaves them where the scheduler puts them ([placement](design.md#placement))",
           plain=cores_plain),  # checked against n_workers: Options.build (shmvec._machine.cpu_sets)
    Option("preload", "Sequence[str] | None", None,
           "modules the forkserver imports once ([preloading](multiprocessing.md#the-main-guard-and-heavy-imports))",
           check=module_names),
    Option("action_masks", "bool | None", None,
           "MaskablePPO's masks in shared memory ([masks](#maskableppo-action-masks-in-shared-memory))",
           default_is="`None`: on when every env has `action_masks()`"),
    Option("zero_copy", "bool | None", None,
           "with `copy=True`, hand out the shared memory the observations are in, which no later step writes into "
           "while you hold it ([copies](#copies))",
           default_is="`None`: on from 32 KiB of observations a step", check=zero_copy_value),
    Option("parent_threads", "str | int | None", AUTO,
           "torch's intra-op threads in the parent; a number sets them, `None` leaves torch alone "
           "([why](design.md#the-parents-torch-threads))",
           default_is='`"auto"`: torch in this process at most at the cores the workers leave free (at least 1), '
                      "while they run; its own count through long gaps such as PPO's updates where a trial finds "
                      "that faster",
           check=parent_threads_check),
)
BY_NAME: Mapping[str, Option] = MappingProxyType({o.name: o for o in OPTIONS})
# Options.build's defaults: the declared ones, but zero_copy off for a face that does not offer it
# (the pools: their results are always arrays of their own); the faces that offer it pass theirs.
BUILD_DEFAULTS: Mapping[str, Any] = MappingProxyType({o.name: o.default for o in OPTIONS} | {"zero_copy": False})


def plain_option(name: str, value: Any) -> Any:
    """An option's value as ``describe()`` writes it (its declared ``plain``; names not declared pass as they are)."""
    option = BY_NAME.get(name)
    return value if option is None or option.plain is None else option.plain(value)


def options_table() -> str:
    """The options table of docs/sb3.md ("## Options"), rendered from :data:`OPTIONS`."""
    rows = ["| option | default | what |", "|---|---|---|"]
    rows += [f"| `{o.name}` | {o.default_doc()} | {o.what} |" for o in OPTIONS]
    return "\n".join(rows)


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
    given: Mapping[str, Any]  # every declared option as passed, once checked (describe()); no factories

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
    def build(cls, env_fns: Any, *, autoreset: str = P.AUTORESET_SAME_STEP, public_name: str = "ShmVecEnv",
              restartable: bool = True, **passed: Any) -> tuple[Options, list]:
        """Checks every argument; returns the options and the factories as a list.

        ``passed``: the options of :data:`OPTIONS` by keyword (its defaults, :data:`BUILD_DEFAULTS`,
        for those left out; the signature :func:`inspect.signature` reports names each of them).

        :raises TypeError, ValueError: an argument of the wrong type or out of range, naming it.
        """
        unknown = [name for name in passed if name not in BY_NAME]
        if unknown:
            raise TypeError(f"Options.build() got an unexpected keyword argument {unknown[0]!r}")
        values = dict(BUILD_DEFAULTS) | passed
        # The factories first: a number there (the order Cls(n, make_env)) is named as such, before
        # the factory in its place fails the check of n_workers.
        env_fns = F.factory_list(env_fns, public_name, second=values["n_workers"])
        # Each option alone (OPTIONS), then the rules between them.
        for option in OPTIONS:
            if option.check is not None:
                values[option.name] = option.check(option.name, values[option.name])
        given = dict(values)  # as checked, before the defaults resolve (describe())
        n_workers, envs_per_worker, spin_us = values["n_workers"], values["envs_per_worker"], values["spin_us"]
        start_method, on_failure, preload = values["start_method"], values["on_failure"], values["preload"]
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
        if on_failure == "restart" and not restartable:
            # The Gymnasium-style faces (ShmVectorEnv, ShmEnvPool) run their own step and reset
            # protocols: the truncation report of a restart is SB3's.
            raise ValueError("on_failure='restart' is supported by ShmVecEnv (the SB3 VecEnv) only")
        zero_copy = check_zero_copy(values["zero_copy"], values["copy"], on_failure)
        sets = cpu_sets(values["cpu_affinity"], n_workers)
        if preload and start_method != "forkserver":
            raise ValueError(f"preload applies to start_method='forkserver' only, not {start_method!r}")
        if spin_us is None:
            # The parent spins only on a core that no worker and no other process keeps busy.
            spin_us = (DEFAULT_PARENT_SPIN_US if n_workers < usable_cores() - taken.cores else 0.0,
                       DEFAULT_WORKER_SPIN_US)
        parent_us, worker_us = spin_pair(spin_us)
        options = cls(
            n_envs=n_envs, n_workers=n_workers, start_method=start_method, copy=values["copy"],
            worker_threads=values["worker_threads"], timeout=values["timeout"],
            parent_spin_s=max(0.0, parent_us) * 1e-6, worker_spin_s=max(0.0, worker_us) * 1e-6,
            mailbox_bytes=values["mailbox_bytes"], on_failure=on_failure, max_restarts=values["max_restarts"],
            invalid_actions=values["invalid_actions"], cpu_sets=tuple(sets), preload=tuple(preload or ()),
            action_masks=values["action_masks"], zero_copy=zero_copy, parent_threads=values["parent_threads"],
            taken=taken, slices=tuple(split_envs(n_envs, n_workers)), autoreset=autoreset,
            public_name=public_name, given=MappingProxyType(given),
        )
        return options, env_fns


def build_signature() -> inspect.Signature:
    """:meth:`Options.build`'s signature: its own keywords, then every option of :data:`OPTIONS`
    with its default (:data:`BUILD_DEFAULTS`) and annotation; what :func:`inspect.signature`
    reports (``ENGINE_OPTIONS`` of the Gymnasium-style faces is read from it)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    own = [p for p in inspect.signature(Options.build.__func__).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    declared = [inspect.Parameter(o.name, keyword, default=BUILD_DEFAULTS[o.name], annotation=o.annotation)
                for o in OPTIONS]
    return inspect.Signature(own + declared, return_annotation="tuple[Options, list]")


Options.build.__func__.__signature__ = build_signature()  # type: ignore[attr-defined]
