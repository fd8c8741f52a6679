"""Where the workers run: spread over every core, or packed off the parent's core, chosen by measuring.

Why
---
With a worker on every core, one of them shares the parent's core.  Between two steps the parent
runs the user's loop (a policy's forward pass, SB3's bookkeeping); just before, that worker ran its
envs on the same core, so the parent's code and data come back from a cold cache, and a worker
that spins yields the core back and forth.  With light envs (8 CartPoles on 2 cores) that costs
the parent more than the second core saves the step: a policy in the loop ran 1.2x to 1.4x
``DummyVecEnv`` with one worker and 1.0x to 1.1x with two (docs/benchmarks.md, "Placement"),
while with random actions, or 64 envs, two workers win.  Which side wins depends on what the envs
and the user's loop cost, which the engine cannot know beforehand: so it measures both.

The two placements
------------------
- ``SPREAD``: every worker may run on every core this process may use (as started: the
  scheduler's choice; when it spreads them again, each is first moved to a core of its own, as
  the scheduler would take milliseconds to); the parent sleeps while it waits (the options'
  parent spin).
- ``PACKED``: every worker's CPU affinity is this process's cores but the one the parent runs on
  when it packs them; the parent spins while it waits (``PACKED_SPIN_S``), on a core of its own,
  so that the scheduler keeps it there.  Only the workers' affinity changes: the parent's own is
  never touched (it is the user's process).

Trials (:meth:`Placement.posting`, called as each step is posted)
-----------------------------------------------------------------
The period between two posts is the whole loop: the parent's own work and the step.  A trial
measures it in the current placement, then in the other (each time ``SETTLE`` steps after the
switch are left out, then the median of ``WINDOW`` periods), and keeps the placement with the
lower median (the other must win by ``MARGIN``: a switch has a cost, and noise should not flip
it).  The choice is held for ``HOLD`` steps, then tried again, since what the loop does may change
(an evaluation phase, another policy); a trial that keeps the same placement doubles the hold, up
to ``MAX_HOLD``.  The second placement of a trial, when the median of its first ``EARLY`` periods
is ``EARLY_MARGIN`` slower than the first's, loses there and then (a trial's cost is the steps
it runs in the slower placement).  Medians ignore the rare long period (PPO's update between two rollouts).  While
a choice is held, a step costs one decrement here.

When it is on
-------------
Only where a worker must share the parent's core and the user left placement to shmvec: at least
2 workers, as many as the cores of the CPU budget that other processes leave free, a budget set by
this process's affinity (not by a cgroup quota: then every core is shared anyway), ``cpu_affinity``
and ``spin_us`` not given (``cpu_affinity=False`` keeps the workers where the scheduler puts them,
without trials), and ``os.sched_setaffinity`` available.  Otherwise :func:`plan` says why not
(``describe()["decided"]["placement"]``).

How failures are noticed
------------------------
Setting a worker's affinity can fail (the worker died: the engine finds it at its next wait; a
container changed the cores): the placement then stops trying, puts back every worker it still can
to all the cores, and says why in ``describe()``; the step goes on.  A restarted worker starts
with the parent's affinity (spread); the next switch places it with the others.  A forked child's
engine never posts, so it never places the parent's workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shmvec._machine import cpu_budget
from shmvec._sync import current_cpu

__all__ = ["Placement", "Plan", "plan", "placement_for", "SETTLE", "WINDOW", "MARGIN", "EARLY", "EARLY_MARGIN", "HOLD",
           "MAX_HOLD", "PACKED_SPIN_S"]

#: Steps left out after a switch (the caches and the scheduler settle), then periods measured.
SETTLE = 6
WINDOW = 32
#: The other placement must have a median period this much lower to be chosen.
MARGIN = 0.03
#: A trial's second placement, slower by this much over its first EARLY periods, loses at once.
EARLY = 8
EARLY_MARGIN = 0.25
#: Steps a choice is held before the next trial; doubled while trials keep it, up to MAX_HOLD.
HOLD = 4096
MAX_HOLD = 65536
#: The parent's spin while it waits, packed (it has a core of its own): the options' default
#: parent spin where a core is free for it (shmvec._options.DEFAULT_PARENT_SPIN_US).
PACKED_SPIN_S = 1e-3

SPREAD, PACKED = "spread", "packed"


@dataclass
class Placement:
    """The placement of one engine's workers, and its trials (see the module docstring).

    :param pids: the workers' process ids now (a restart changes them).
    :param cores: the cores this process may use (its affinity when the engine started).
    :param set_spin: called with the parent's spin (seconds) each time the placement changes.
    :param spread_spin_s: the parent's spin spread (the options').
    """

    pids: Callable[[], Iterable[int]]
    cores: frozenset[int]
    set_spin: Callable[[float], None]
    spread_spin_s: float
    packed: bool = False
    off: str | None = None  # why the trials stopped (an affinity that could not be set)
    countdown: int = SETTLE  # steps until the next move of the trial
    phase: str = "settle"  # settle -> measure (-> settle -> measure of the other) -> hold -> settle ...
    hold: int = HOLD
    timing: bool = False
    last: float = 0.0
    periods: list[float] = field(default_factory=list)
    trial: dict[bool, float] = field(default_factory=dict)  # packed? -> median period (s) in this trial
    medians: dict[str, float] = field(default_factory=dict)  # the last trial's medians, by placement
    trials: int = 0
    switches: int = 0
    chosen: bool = False  # the last trial's choice (packed?)
    early: bool = False  # timing the first EARLY steps of a trial's second placement

    def posting(self) -> None:
        """A step is being posted (the engine's lock is held)."""
        if self.timing:
            now = time.perf_counter()
            self.periods.append(now - self.last)
            self.last = now
        self.countdown -= 1
        if self.countdown <= 0:
            self._advance()

    def _advance(self) -> None:
        if self.off is not None:
            self.countdown = MAX_HOLD
            return
        if self.phase == "settle":
            # The second placement of a trial is first timed over EARLY steps only.
            self.early = bool(self.trial)
            self.phase, self.countdown, self.timing = "measure", EARLY if self.early else WINDOW, True
            self.periods.clear()
            self.last = time.perf_counter()
            return
        if self.phase == "measure":
            periods = sorted(self.periods)
            median = periods[len(periods) // 2]
            if self.early:
                self.early = False
                if median <= self.trial[not self.packed] * (1.0 + EARLY_MARGIN):  # not clearly slower: time it whole
                    self.countdown = WINDOW - EARLY
                    return
            self.timing = False
            self.trial[self.packed] = median
            if (not self.packed) not in self.trial:  # the other placement next
                self.phase, self.countdown = "settle", SETTLE
                self._apply(not self.packed)
                return
            spread, packed = self.trial[False], self.trial[True]
            self.medians = {SPREAD: spread, PACKED: packed}
            best = packed < spread * (1.0 - MARGIN)
            self.trials += 1
            self.hold = min(self.hold * 2, MAX_HOLD) if self.trials > 1 and best == self.chosen else HOLD
            self.chosen = best
            if best != self.packed:
                self._apply(best)
            self.phase, self.countdown = "hold", self.hold
            return
        # hold: the next trial starts from the current placement
        self.trial.clear()
        self.phase, self.countdown = "settle", SETTLE

    def _apply(self, packed: bool) -> None:
        """Sets every worker's affinity for ``packed`` and the parent's spin with it."""
        cores = self.cores
        try:
            if packed:
                others = cores - {current_cpu()} or cores
                for pid in self.pids():
                    os.sched_setaffinity(pid, others)
            else:
                # Each worker onto a core of its own first, then free to move: widened alone, the
                # workers would stay packed until the scheduler balanced them, milliseconds later.
                ordered = sorted(cores)
                for w, pid in enumerate(self.pids()):
                    os.sched_setaffinity(pid, {ordered[w % len(ordered)]})
                    os.sched_setaffinity(pid, cores)
        except OSError as exc:
            self.stop(f"a worker's CPU affinity could not be set ({type(exc).__name__}: {exc}); left spread")
            return
        self.packed = packed
        self.switches += 1
        self.set_spin(PACKED_SPIN_S if packed else self.spread_spin_s)

    def stop(self, why: str) -> None:
        """Stops the trials for good: every worker that can be is put back on all the cores."""
        self.off = why
        self.timing, self.phase, self.countdown = False, "off", MAX_HOLD
        for pid in self.pids():
            try:
                os.sched_setaffinity(pid, self.cores)
            except OSError:
                pass  # a dead worker: the engine reports it
        self.packed = False
        self.set_spin(self.spread_spin_s)

    def as_dict(self) -> dict[str, Any]:
        """What ``describe()["decided"]["placement"]`` shows."""
        if self.off is not None:
            return {"value": "off", "why": self.off}
        if not self.trials:
            why = "trying both placements (the first trial is not over)"
        else:
            us = {k: round(v * 1e6, 1) for k, v in self.medians.items()}
            why = (f"the last trial's median period between steps: spread {us[SPREAD]} us, packed {us[PACKED]} us "
                   f"(packed must win by {MARGIN:.0%}); tried again within {self.hold} steps")
        return {"value": PACKED if self.packed else SPREAD, "why": why, "trials": self.trials,
                "switches": self.switches}


@dataclass(frozen=True)
class Plan:
    """Whether an engine's workers get a :class:`Placement`, and why (or why not)."""

    on: bool
    why: str
    cores: frozenset[int] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        return {"value": "trials" if self.on else "off", "why": self.why}


def plan(n_workers: int, given: Any, taken_cores: int) -> Plan:
    """Whether the workers' placement is measured (see "When it is on")."""
    if given.get("cpu_affinity") is not None:
        return Plan(False, "cpu_affinity is given: the workers stay where it puts them")
    if given.get("spin_us") is not None:
        return Plan(False, "spin_us is given: the parent's spin stays as given, the workers where the scheduler puts them")
    if not hasattr(os, "sched_setaffinity"):
        return Plan(False, "this platform has no os.sched_setaffinity")
    if n_workers < 2:
        return Plan(False, "one worker: it has a core of its own beside the parent")
    cores = frozenset(os.sched_getaffinity(0))
    budget = cpu_budget()
    if budget.chosen != len(cores):
        return Plan(False, f"the CPU budget ({budget.chosen}: {budget.reason}) is not one core per CPU this "
                           f"process may run on ({len(cores)}): the workers stay where the scheduler puts them")
    if n_workers < budget.chosen - taken_cores:
        return Plan(False, "fewer workers than free cores: the parent has a core of its own")
    return Plan(True, "a worker shares the parent's core: each placement is measured, the faster kept", cores)


def placement_for(options: Any, pids: Callable[[], Iterable[int]], set_spin: Callable[[float], None]
                  ) -> tuple[Plan, Placement | None]:
    """An engine's plan and, where it is on, its :class:`Placement` (``options``: its
    :class:`shmvec._options.Options`; ``pids``: its workers' ids; ``set_spin``: its parent's spin)."""
    placed = plan(options.n_workers, options.given, options.taken.cores)
    return placed, (Placement(pids, placed.cores, set_spin, options.parent_spin_s) if placed.on else None)
