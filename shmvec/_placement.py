"""Where the workers run: spread over every core, or packed off the parent's core, chosen by measuring.

Why
---
With a worker on every core, one of them shares the parent's core.  Between two steps the parent
runs the user's loop (a policy's forward pass, SB3's bookkeeping); just before, that worker ran its
envs on the same core, so the parent's code and data come back from a cold cache, and a worker
that spins yields the core back and forth.  With light envs (8 CartPoles on 2 cores) that costs
the parent more than the second core saves the step, while with random actions, or 64 envs, the
second core wins (the measurements: docs/design.md, "Placement").  Which side wins depends on
what the envs and the user's loop cost, which the engine cannot know beforehand: so it measures
both.

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
times it in the placement it starts in, then in the other: each time ``SETTLE`` steps after the
switch are left out, then the typical period of ``WINDOW`` (:func:`typical`).  The other must win by
``MARGIN`` (a switch has a cost, and noise should not flip it); when it does, the first placement
is timed once more before the move is kept (its best window counts), so that one slow spell in
its window (another vec env's workers still spinning, a pause) does not move the workers for a
whole hold.  The other placement, when the typical period of its first ``EARLY`` steps is
``EARLY_MARGIN`` slower, loses there and then, and once its settling and early steps take
``ABANDON`` times what they take in the first, at once (a trial costs the steps it runs in the
slower placement; on a core another process keeps busy a step may wait a whole tick).  The choice is held for ``HOLD`` steps, then tried again, since what the loop does
may change (an evaluation phase, another policy); a trial that keeps the same placement doubles
the hold, up to ``MAX_HOLD``.  While a choice is held the loop is still timed, a window of
``WINDOW`` steps at a time.  A window whose typical period is ``CHANGE`` times off the chosen
placement's in the trial first has the placement applied again (a repair: spread, the scheduler
moves two workers onto one core now and then, and the step takes twice as long until it moves
one back; packed, the parent may have moved); a second one in a row, ``SPACING`` steps or more
after the last trial, means the loop changed (a policy in the loop after random actions, a bigger
batch) and starts a trial at once, whose choice is held ``HOLD`` steps.

Beside torch's lent threads (shmvec._threads, "Lending"): the engine's thread decision lends
torch its own count through the parent's long gaps only while no trial runs here (:meth:`calm`,
which also tells it whether a trial began since it last asked), and after a lent gap torch's
second thread spins on a worker's core for a few ms: the periods of the next ``QUIET_S`` are not
timed (:meth:`quiet`, from the post that ends a lent gap), so that neither a trial starting then
nor a held window takes that spin for the placement's.

The typical period is the mean of the window's periods under ``OUTLIER`` times its median: the
mean, as a placement whose steps now and then wait a whole scheduler tick (on cores another
process keeps busy) pays for them as its throughput does (a lower quartile picked such a
placement); without the pauses (PPO's update, a benchmark's other backends), which are no
step's.  After a pause the workers sleep at once for a few steps, until their own spin adapts
again (shmvec._worker): the first placement is timed twice before a move, and the first trial
starts ``START`` steps in, after the workers are spread out (forked, two of them may share a core
until the scheduler moves one).  A step costs one clock read and an append here.

Cores other processes take
--------------------------
A process that starts spinning after the vec env (a second job, an evaluation) takes a core a
worker runs on; a synchronous step waits for its last worker, and that one gets its core a
scheduler slice at a time (docs/design.md, "Placement": the step then took many times longer than
``DummyVecEnv``'s).  The engine's worker
count is fixed (each worker holds its envs), but where they run is not.  While a choice is held,
every ``CHECK_S`` the placement reads the cores' load (:func:`shmvec._machine.read_load`, from
``/proc``): their busy ticks less those of this process (every thread) and of its vec envs'
workers, i.e. the cores' worth other processes took, and how long each worker waited on a run
queue, with the CPU it last ran on.  Where others took ``FOREIGN`` of a core or more beyond the
cores left out, and a worker waited ``WAITING`` of the time it wanted a core or more (not of the
time since the last reading: the loop may have paused), a trial of the cores to
leave out starts: the cores as they are are timed, then each set that leaves one more out (the
CPUs the workers waited on most first, ``LEAVE_TRIES`` at most), each over ``WINDOW`` steps and
``LEAVE_WINDOW_S`` at least (a worker beside another process gets the core a slice at a time, and
a few steps may all fall in one), one far slower abandoned as in the trials above; the fastest is
kept if it wins by ``MARGIN``.  The next such trial comes ``LEAVE_HOLD_S`` later, doubled while
trials keep the cores (to ``LEAVE_MAX_HOLD_S``), or at the next reading after the loop changed.
Once others take ``FOREIGN`` of a core less than the cores left out, every core is used again
and a trial of the two placements follows; so is a core left out that is busy less than
``1 - FOREIGN`` of the time (the other process moved, as an unpinned one does, maybe onto a core
the workers use: the next readings find it there).  Spread and packed then mean every core not
left out (packed, with only the parent's core left or the parent on a core left out, is spread:
the parent sleeps there, and never spins beside the other process).  Which workers
wait, and where, is a hint (a worker moves between cores, and waits for the parent and the other
workers too), hence a trial, not a rule; the load of other processes is the trigger.

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
engine never posts, so it never places the parent's workers.  Where ``/proc`` cannot be read, the
load is not read and no core is left out.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shmvec._machine import TICKS_PER_S, Load, cpu_budget, read_load
from shmvec._sync import current_cpu

__all__ = ["Placement", "Plan", "plan", "placement_for", "SETTLE", "WINDOW", "MARGIN", "EARLY", "EARLY_MARGIN", "CHANGE", "HOLD",
           "ABANDON", "SPACING", "OUTLIER", "PAUSE_S", "typical", "CHECK_S", "FOREIGN", "WAITING", "LEAVE_TRIES", "LEAVE_WINDOW_S",
           "LEAVE_HOLD_S", "LEAVE_MAX_HOLD_S",
           "MAX_HOLD", "PACKED_SPIN_S"]

#: Steps before the first trial (the workers' own spin adapts to the loop first); then the
#: workers are spread out (forked, two of them may share a core until the scheduler moves one).
START = 64
#: Steps left out after a switch (the caches and the scheduler settle), then periods measured.
SETTLE = 6
WINDOW = 32
#: The other placement must have a typical period this much lower to be chosen.
MARGIN = 0.03
#: The other placement is abandoned once its settling and early steps take this many times
#: what they take in the first (a core another process keeps busy: a step may wait a whole tick).
ABANDON = 4.0
#: Steps between a trial and one that a change of the loop starts.
SPACING = 512
#: A period over this many times its window's median, and over PAUSE_S, is a pause, not a step:
#: left out.  (Under PAUSE_S it may be a step that waited for a core another process held: the
#: scheduler gives it back within a few ticks.)
OUTLIER = 4.0
PAUSE_S = 0.02
#: Held, a window whose typical period is this factor off the chosen placement's starts a trial.
CHANGE = 1.5
#: A trial's second placement, slower by this much over its first EARLY periods, loses at once.
EARLY = 8
EARLY_MARGIN = 0.25
#: After a gap through which torch's threads were lent (shmvec._threads), this long is not timed.
QUIET_S = 0.01
#: Steps a choice is held before the next trial; doubled while trials keep it, up to MAX_HOLD.
HOLD = 4096
MAX_HOLD = 65536
#: The parent's spin while it waits, packed (it has a core of its own): the options' default
#: parent spin where a core is free for it (shmvec._options.DEFAULT_PARENT_SPIN_US).
PACKED_SPIN_S = 1e-3

#: Held, the load of the cores is read at most this often (seconds): which cores other processes
#: take, and which workers wait for a core there.
CHECK_S = 0.25
#: Other processes ran this many cores' worth or more since the last reading: the cores where a
#: worker waited are left out; under half of it, every core is used again.
FOREIGN = 0.5
#: A worker waited on a run queue this share of the time it wanted a core (ran or waited) or
#: more: its core is taken.
WAITING = 0.2
#: A trial of the cores to leave out times the cores as they are and at most this many other sets;
#: one is abandoned once its steps take ABANDON times the first set's (beyond LEAVE_WINDOW_S).
LEAVE_TRIES = 3
#: Each set is timed WINDOW steps and at least this long: a worker on a core another process
#: runs on gets it for a slice, then waits for a slice; a few steps may all fall in one.
LEAVE_WINDOW_S = 0.1
#: Seconds before the next trial of the cores to leave out, after one that left out others; one
#: that kept them doubles it, up to LEAVE_MAX_HOLD_S.
LEAVE_HOLD_S = 2.0
LEAVE_MAX_HOLD_S = 64.0

SPREAD, PACKED = "spread", "packed"


@dataclass
class Placement:
    """The placement of one engine's workers, and its trials (see the module docstring).

    :param pids: the workers' process ids now (a restart changes them).
    :param cores: the cores this process may use (its affinity when the engine started).
    :param set_spin: called with the parent's spin (seconds) each time the placement changes.
    :param spread_spin_s: the parent's spin spread (the options').
    :param clock: the clock the loop's periods are read from (seconds).
    :param load: reads the cores' load (:func:`shmvec._machine.read_load`: the cores, the workers'
        pids); None: the cores are never left out.
    """

    pids: Callable[[], Iterable[int]]
    cores: frozenset[int]
    set_spin: Callable[[float], None]
    spread_spin_s: float
    packed: bool = False
    off: str | None = None  # why the trials stopped (an affinity that could not be set)
    countdown: int = START  # steps until the next move of the trial
    phase: str = "start"  # start -> settle -> measure (-> settle -> measure of the other) -> hold -> settle ...
    hold: int = HOLD
    timing: bool = False
    last: float = 0.0
    periods: list[float] = field(default_factory=list)
    trial: dict[bool, list[float]] = field(default_factory=dict)  # packed? -> its windows' typical periods (s)
    first: bool = False  # the placement a trial measures first (the one it runs in as it starts)
    measured: dict[str, float] = field(default_factory=dict)  # the last trial's typical periods, by placement
    trials: int = 0
    switches: int = 0
    chosen: bool = False  # the last trial's choice (packed?)
    early: bool = False  # timing the first EARLY steps of a trial's second placement
    reference: float = 0.0  # the chosen placement's typical period in the last trial (s)
    held: int = 0  # steps held since the last trial
    changes: int = 0  # trials started early because the loop's period changed
    suspect: bool = False  # the last window held was off the reference (the placement was applied again)
    repairs: int = 0  # placements applied again after a window off the reference
    watch: bool = False  # the other placement is being tried: abandoned once it takes watch_budget
    watch_from: float = 0.0
    watch_budget: float = 0.0
    clock: Callable[[], float] = time.perf_counter
    load: Callable[[frozenset[int], list[int]], Load | None] | None = None
    avoid: frozenset[int] = frozenset()  # cores left out: other processes take them
    reading: Load | None = None  # the last reading of the load, taken at read_at (clock)
    read_at: float = 0.0
    avoids: int = 0  # times the cores left out changed
    left_out: dict[frozenset[int], float] = field(default_factory=dict)  # cores left out -> typical period (s)
    to_leave: list[frozenset[int]] = field(default_factory=list)  # the cores to leave out next in this trial
    left_at: float = -math.inf  # when the last trial of the cores to leave out ended (clock)
    leave_hold: float = 0.0  # seconds before the next such trial (doubled while trials keep the cores)
    quiet_until: float = 0.0  # no period is timed before then (clock; :meth:`quiet`)
    begun: int = 0  # trials begun (of the placement or of the cores left out): :meth:`calm`

    def calm(self) -> int | None:
        """None while a trial runs, else how many have begun: lending torch its threads waits for
        the trials, and an iteration it times across one is not compared (shmvec._threads)."""
        return self.begun if self.phase in ("hold", "off") else None

    def quiet(self, seconds: float = QUIET_S) -> None:
        """No period is timed for ``seconds`` from now (torch's lent thread spins on a worker's core)."""
        self.quiet_until = self.clock() + seconds

    def posting(self, after_lent: bool = False) -> None:
        """A step is being posted (the engine's lock is held); ``after_lent``: it ends a gap through
        which torch's threads were lent (:meth:`quiet` from now)."""
        if self.off is not None:  # stopped for good (whatever a trial was doing when it stopped)
            return
        if after_lent:
            self.quiet()
        if self.timing:
            now = self.clock()
            if now >= self.quiet_until:
                self.periods.append(now - self.last)
            self.last = now
        if self.watch and self.clock() - self.watch_from > self.watch_budget:
            self._abandon()  # the other placement is far slower (cores another process keeps busy)
            return
        self.countdown -= 1
        if self.countdown <= 0:
            self._advance()

    def _abandon(self) -> None:
        self.watch = self.early = self.timing = False
        if self.phase == "cores":
            self.left_out[self.avoid] = math.inf  # far slower: not timed further
            self._next_cores()
            return
        self.trial[self.packed] = [self.clock() - self.watch_from]  # (its whole time: it loses)
        self._decide()

    def _advance(self) -> None:
        if self.phase == "cores":  # a trial of the cores left out (_check_load): one set after the other
            if not self.timing:
                self._time_window()
                return
            if not self.periods or sum(self.periods) < LEAVE_WINDOW_S:  # (a core shared with another process: its ticks)
                self.countdown = WINDOW
                return
            self.timing = self.watch = False
            self.left_out[self.avoid] = typical(self.periods)
            self._next_cores()
            return
        if self.phase == "start":  # spread them out for good measure: as they start, two may share a core
            self._apply(False, switch=False)
            if self.load is not None:  # the first reading of the load, to compare the next with
                self.reading, self.read_at = self.load(self.cores, list(self.pids())), self.clock()
            self.phase, self.countdown = "settle", SETTLE
            return
        if self.phase == "settle":
            # The other placement's first window is timed over EARLY steps first.
            self.early = len(self.trial) == 1 and self.packed != self.first
            self.phase, self.countdown, self.timing = "measure", EARLY if self.early else WINDOW, True
            self.periods.clear()
            self.last = self.clock()
            return
        if self.phase == "measure":
            if not self.periods:  # (every step of the window was quiet: time another)
                self.countdown = WINDOW
                return
            value = typical(self.periods)
            first, other = self.first, not self.first
            if self.early:
                self.early = self.watch = False
                if value <= min(self.trial[first]) * (1.0 + EARLY_MARGIN):  # not clearly slower: time it whole
                    self.countdown = WINDOW - EARLY
                    return
            self.timing = False
            self.trial.setdefault(self.packed, []).append(value)
            if other not in self.trial:  # the other placement next, watched until its early verdict
                self.phase, self.countdown = "settle", SETTLE
                self._apply(other)
                self.watch, self.watch_from = True, self.clock()
                self.watch_budget = (SETTLE + EARLY) * ABANDON * value
                return
            self._decide()
            return
        self._held()

    def _decide(self) -> None:
        """The end of a trial (both placements timed): the faster is kept, and held."""
        first, other = self.first, not self.first
        wins = min(self.trial[other]) < min(self.trial[first]) * (1.0 - MARGIN)
        if wins and len(self.trial[first]) == 1:
            # Before moving for good, the first placement once more: a slow spell in its window
            # (another vec env's workers still spinning, a pause) must not decide.
            self.phase, self.countdown = "settle", SETTLE
            self._apply(first)
            return
        best = other if wins else first
        spread, packed = min(self.trial[False]), min(self.trial[True])
        self.measured = {SPREAD: spread, PACKED: packed}
        self.trials += 1
        self.hold = min(self.hold * 2, MAX_HOLD) if self.trials > 1 and best == self.chosen else HOLD
        self.chosen = best
        if best != self.packed:
            self._apply(best)
        # Held, the loop is still timed (_held): a window off by CHANGE from the chosen
        # placement's period has it applied again; a second in a row starts a trial.
        self.reference, self.held = min(self.trial[best]), 0
        self.phase, self.countdown, self.timing = "hold", SETTLE + WINDOW, True
        self.periods.clear()
        self.last = self.clock()

    def _held(self) -> None:
        """A window of the loop as it runs now, while a choice is held."""
        periods = list(self.periods)
        self.periods.clear()
        self.held += len(periods)
        if self.load is not None and self.clock() - self.read_at >= CHECK_S and self._check_load():
            if self.phase == "hold":  # every core again: the loop's period changes with them
                self._start_trial(early=True)
            return
        value = typical(periods) if periods else self.reference
        off = not self.reference / CHANGE < value < self.reference * CHANGE
        # Two windows off in a row, and not sooner than SPACING steps after the last trial: on cores
        # another process keeps busy the period swings window to window, and each trial costs.
        changed, self.suspect = off and self.suspect and self.held >= SPACING, off
        if off and not changed:
            # First, put the workers where the placement says again: spread, the scheduler may have
            # moved two onto one core since (the period doubles); packed, the parent may have moved.
            self.repairs += 1
            self._apply(self.packed, switch=False)
        if not changed and self.held < self.hold:
            self.countdown = WINDOW
            return
        self.changes += changed
        if changed:
            self.leave_hold = 0.0  # the cores to leave out may have changed with the loop: tried at the next reading
        self._start_trial(early=changed)

    def _start_trial(self, early: bool) -> None:
        """The next trial; ``early``: before the hold is over (the loop or the cores changed), and
        its choice is held HOLD steps, whichever it is."""
        if early:
            self.hold = HOLD // 2
        self.timing = False
        self.periods.clear()
        self.trial.clear()
        self.first = self.packed
        self.phase, self.countdown = "settle", SETTLE
        self.begun += 1

    def _check_load(self) -> bool:
        """Reads the load (every ``CHECK_S``).  Other processes took ``FOREIGN`` of a core or more
        beyond the cores left out, and workers waited for a core: a trial of the cores to leave
        out (one more, among those where workers waited most) starts.  Others took ``FOREIGN`` of
        a core less than the cores left out: every core is used again.  True if either happened."""
        assert self.load is not None
        last, now = self.reading, self.load(self.cores, list(self.pids()))
        span, self.reading, self.read_at = self.clock() - self.read_at, now, self.clock()
        if last is None or now is None or span <= 0:
            return False
        own = sum(ticks - last.own.get(pid, 0) for pid, ticks in now.own.items())
        foreign = (now.busy - last.busy - own) / TICKS_PER_S / span
        # A core left out that is no longer busy (the other process moved, as an unpinned one
        # does): used again; all of them once others take less than the cores left out.
        freed = frozenset(cpu for cpu in self.avoid if cpu in now.cpus and cpu in last.cpus
                          and (now.cpus[cpu] - last.cpus[cpu]) / TICKS_PER_S / span < 1.0 - FOREIGN)
        if self.avoid and foreign <= len(self.avoid) - FOREIGN:
            freed = self.avoid
        if freed:
            self.avoid, self.avoids, self.leave_hold = self.avoid - freed, self.avoids + 1, 0.0
            self._apply(self.packed, switch=False)
            return True
        if foreign < len(self.avoid) + FOREIGN or self.clock() - self.left_at < self.leave_hold:
            return False
        # The ns its workers waited, and waited or ran, by CPU they last ran on: the share of the
        # time they wanted a core that they waited (not of the span, which holds the loop's pauses).
        waited = {cpu: 0 for cpu in self.cores - self.avoid}
        wanted = dict.fromkeys(waited, 0)
        for pid, (ns, cpu, ran) in now.waits.items():
            if pid in last.waits and cpu in waited:
                before = last.waits[pid]
                waited[cpu] += ns - before[0]
                wanted[cpu] += ns - before[0] + ran - before[2]
        if len(waited) < 2 or max((waited[c] / wanted[c] for c in waited if wanted[c] > 0), default=0.0) < WAITING:
            return False  # (a worker moves between cores: its last CPU is a hint, each core may be tried)
        ordered = sorted(waited, key=lambda cpu: (-waited[cpu], cpu))
        self.timing, self.left_out = False, {}
        self.to_leave = [self.avoid | {cpu} for cpu in ordered[:LEAVE_TRIES]]
        self.phase, self.countdown = "cores", SETTLE  # the cores as they are first
        self.begun += 1
        return True

    def _time_window(self) -> None:
        self.countdown, self.timing, self.last = WINDOW, True, self.clock()
        self.periods.clear()

    def _next_cores(self) -> None:
        """The next set of cores to leave out in this trial (watched: abandoned once its steps take
        ``ABANDON`` times the first set's), or the trial's end."""
        if not self.to_leave:
            self._keep_cores()
            return
        self.avoid = self.to_leave.pop(0)
        self._apply(self.packed, switch=False)
        self.countdown = SETTLE
        first = next(iter(self.left_out.values()))
        # Its window lasts LEAVE_WINDOW_S at least, whatever its steps take (and a move may cost a tick).
        budget = (SETTLE + WINDOW) * ABANDON * first + LEAVE_WINDOW_S + PAUSE_S
        self.watch, self.watch_from, self.watch_budget = True, self.clock(), budget

    def _keep_cores(self) -> None:
        """The end of a trial of the cores left out: the fastest set, if it wins by ``MARGIN``
        over the cores as they were; then held.  The next such trial comes ``LEAVE_HOLD_S``
        later, doubled while trials keep the cores (up to ``LEAVE_MAX_HOLD_S``)."""
        first, before = next(iter(self.left_out.items()))
        best = min(self.left_out, key=self.left_out.__getitem__)
        chosen = best if self.left_out[best] < before * (1.0 - MARGIN) else first
        self.left_at = self.clock()
        self.leave_hold = LEAVE_HOLD_S if chosen != first else min(max(self.leave_hold * 2, LEAVE_HOLD_S), LEAVE_MAX_HOLD_S)
        self.avoids += chosen != first
        if chosen != self.avoid:
            self.avoid = chosen
            self._apply(self.packed, switch=False)
        self.reference, self.held, self.suspect = self.left_out[chosen], 0, False
        self.phase = "hold"
        self.countdown = SETTLE + WINDOW
        self.timing, self.last = True, self.clock()
        self.periods.clear()

    def _apply(self, packed: bool, switch: bool = True) -> None:
        """Sets every worker's affinity for ``packed`` and the parent's spin with it."""
        cores = self.cores - self.avoid
        spin = self.spread_spin_s
        try:
            if packed:
                here = current_cpu()
                others = cores - {here}
                # (Else the parent is on the one core left, or on a core left out, beside the other
                # process: it sleeps there, as spread.)
                if others and here not in self.avoid:
                    spin = PACKED_SPIN_S
                for pid in self.pids():
                    os.sched_setaffinity(pid, others or cores)
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
        self.switches += switch
        self.set_spin(spin)

    def stop(self, why: str) -> None:
        """Stops the trials for good: every worker that can be is put back on all the cores."""
        self.off = why
        self.timing = self.watch = self.early = False
        self.phase = "off"
        self.periods.clear()
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
            us = {k: round(v * 1e6, 1) for k, v in self.measured.items()}
            why = (f"the last trial's typical period between steps: spread {us[SPREAD]} us, packed "
                   f"{us[PACKED]} us (a move must win by {MARGIN:.0%}); tried again within {self.hold} steps, or "
                   f"as soon as the loop's period changes by {CHANGE}x")
        if self.avoid:
            why += (f"; cores {sorted(self.avoid)} left out: other processes took them and workers waited for "
                    f"them (every core again once others take {FOREIGN} of a core less)")
        return {"value": PACKED if self.packed else SPREAD, "why": why, "trials": self.trials,
                "switches": self.switches, "changes": self.changes, "repairs": self.repairs,
                "cores_left_out": sorted(self.avoid)}


def typical(periods: list[float]) -> float:
    """A window's typical period: the mean of those under ``OUTLIER`` times its median or
    ``PAUSE_S`` (a pause, PPO's update, is left out; a placement whose periods vary, on cores
    another process keeps busy, pays for its slow ones, as its throughput does)."""
    ordered = sorted(periods)
    cut = max(OUTLIER * ordered[len(ordered) // 2], PAUSE_S)
    kept = [p for p in ordered if p <= cut]
    return sum(kept) / len(kept)


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
    if given.get("cpu_affinity") is False:
        return Plan(False, "cpu_affinity=False: the workers stay where the scheduler puts them")
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


def placement_for(options: Any, pids: Callable[[], Iterable[int]], engine: Any) -> tuple[Plan, Placement | None]:
    """An engine's plan and, where it is on, its :class:`Placement` (``options``: its
    :class:`shmvec._options.Options`; ``pids``: its workers' ids), which sets ``engine.parent_spin_s``
    through a weak reference: the engine holds its placement, and a cycle would keep a dropped
    engine (and its workers) alive until the collector's next full pass."""
    placed = plan(options.n_workers, options.given, options.taken.cores)
    if not placed.on:
        return placed, None
    owner = weakref.ref(engine)

    def set_spin(spin_s: float) -> None:
        held = owner()
        if held is not None:
            held.parent_spin_s = spin_s

    return placed, Placement(pids, placed.cores, set_spin, options.parent_spin_s, load=read_load)
