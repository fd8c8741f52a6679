"""The parent's torch threads while workers step envs: what is decided, why, and when it is undone.

Why
---
Between two steps the parent runs the policy.  torch's intra-op pool (OpenMP) has, by default,
one thread per CPU, and after each parallel region its threads keep spinning for a while before
they sleep (libgomp's ``GOMP_SPINCOUNT``): on the very cores where shmvec's workers must run the
next step, right when they must run it.  A worker woken on a core where such a thread spins
waits for it; a step of a few tens of microseconds then takes the spinner's time slice.
``DummyVecEnv`` does not see this (it steps in the parent's own thread), so a user who swaps
``vec_env_cls`` with torch at its default threads got a run several times slower than
``DummyVecEnv`` (docs/benchmarks.md, "Training").  The pool cannot be told to stop spinning once
torch is loaded (libgomp reads ``OMP_WAIT_POLICY`` when it loads), but it spins only on the
threads it has: fewer threads, fewer spinners.  TorchRL's ``ParallelEnv`` does the same
(``num_threads``: the parent's threads minus the workers).

What (the ``parent_threads`` option, one decision per engine)
------------------------------------------------------------
- ``"auto"`` (default): when torch is loaded in this process (checked when the engine starts and
  again at each reset until it is), ``OMP_NUM_THREADS`` is not set, and torch's intra-op threads
  exceed the cores the workers leave free (``max(1, CPU budget - n_workers)``,
  :func:`shmvec._machine.usable_cores`), torch is set to that many threads for as long as a vec
  env of this process holds its workers; a :class:`ParentThreadsWarning` says so once per
  process, with the way to keep torch's count.
  While the workers run, ``"auto"`` follows the parent's gap between a step's return and the
  next step (:meth:`Decision.posting`, the median of ``GAPS``): a heavy policy (a CNN, over
  ``HEAVY_GAP_S``) gains more from torch's own count than its spin costs the workers, and gets it
  back; a light one (under ``LIGHT_GAP_S``) is reduced again.
  Through the parent's long gaps (PPO's update between two rollouts), ``"auto"`` may lend torch
  its own count: see "Lending" below.
- an int ``n``: torch is set to ``n`` threads the same way, without a warning.
- ``None``: torch is left as it is.

Lending (``"auto"``, reduced)
-----------------------------
An update between two rollouts (PPO's, on minibatches of thousands of samples) runs faster on
torch's own count, while the workers sleep; but the gap cannot be seen coming, and once it ends
torch's second thread spins into the next rollout on a worker's core (a few ms of libgomp's spin).
So the gain depends on the update's size, and it is measured, not guessed:

- A *long gap* is one over ``LONG_GAP_S``.  :attr:`Decision.since` counts the steps posted since
  the last one; two long gaps in a row the same number of steps apart (:attr:`Decision.period`,
  the rollout) make the next one predictable: when a step returns and ``since == period``, the
  gap that starts is taken for the update.  A predicted gap that turns out short forgets the
  period (found again from two long gaps).
- At each predicted gap, :attr:`Decision.iterations` records the time since the previous one
  (an *iteration*: one update and one rollout) with whether that previous gap was lent.  A trial
  alternates: not lent, lent, not lent, lent (``TRIAL``); then lending is kept if the faster lent
  iteration beats the faster one not lent by ``LEND_MARGIN`` (a first lent iteration
  ``LEND_EARLY`` slower than the one before it ends the trial there), and the choice holds for
  ``LEND_HOLD`` iterations before another trial (twice as many after a trial that chose the same
  again: a trial costs the slower choice's two iterations).
- Lent: torch runs its own count (``before``) from that step's return until the next post, which
  sets it back; torch found at another count at either end is the user's, and stops the
  following (as the gap rule does).  A close during a lent gap sets it back first.
- The workers' placement (shmvec._placement) times the loop too: no gap is lent while it tries a
  placement (:attr:`Decision.calm`), an iteration across one of its trials is not compared, and it
  does not time the steps just after a lent gap (torch's spin would count against whichever
  placement it tries).

When it is undone
-----------------
Every engine that changed the count holds it; when the last one closes, the count from before
the first change comes back, unless the user set another count in the meantime (then theirs
stays).  A forked child inherits the count and the holders; its engines never close the
parent's workers (state FORKED), so they never restore anything there.

Only this process's torch is touched: workers cap their own threads (``worker_threads``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

from shmvec._errors import ParentThreadsWarning, user_stacklevel
from shmvec._machine import usable_cores

__all__ = ["AUTO", "ParentThreadsWarning", "Decision", "check_parent_threads", "decide", "release"]

AUTO = "auto"
# Environment variables by which a user sets the thread count of torch's pools before it loads.
USER_SET_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


#: ``"auto"`` follows the parent's time between a step's return and the next step (the median of
#: the last ``GAPS``): under ``LIGHT_GAP_S`` (a small policy, as fast on one thread) torch runs the
#: cores the workers leave free; over ``HEAVY_GAP_S`` (a CNN's forward pass: its threads gain more
#: than their spin costs the workers) it runs its own count again (docs/design.md).
LIGHT_GAP_S = 5e-4
HEAVY_GAP_S = 2e-3
GAPS = 8
#: Lending (module docstring): a gap over ``LONG_GAP_S`` is an update; ``TRIAL`` iterations
#: alternate not lent and lent; lending must win by ``LEND_MARGIN``; the choice holds for
#: ``LEND_HOLD`` iterations, twice as many each time a trial chooses the same (at most ``LEND_HOLD_MAX``).
LONG_GAP_S = 1e-2
TRIAL = 4
LEND_MARGIN = 0.03
LEND_HOLD = 32
LEND_HOLD_MAX = 1024
#: A trial's first lent iteration this much slower than the one before it ends the trial at once.
LEND_EARLY = 0.1


@dataclass
class Decision:
    """What an engine decided about the parent's torch threads (``describe()``, the doctor), and,
    with ``"auto"``, the gaps between steps that keep deciding (:meth:`posting`, :meth:`stepped`)."""

    option: Any  # "auto", an int, or None, as given
    before: int | None = None  # torch's intra-op threads when decided (None: torch not loaded)
    after: int | None = None  # what torch was set to (None: left as it was)
    reason: str = "torch is not loaded in this process (checked again at each reset)"
    final: bool = False  # decided for good (torch was loaded, or the option says to leave it)
    holds: bool = False  # this engine holds a changed count (released at its close)
    adaptive: bool = False  # "auto" that changed the count: follows the gaps between steps
    reduced: bool = False  # torch runs ``after`` now (else ``before``: a heavy policy)
    returned: float = 0.0  # when the last step returned (perf_counter)
    # Lending (module docstring): steps since the last long gap, the steps between the last two,
    # how many long gaps in a row came that far apart, whether the gap now is lent.
    since: int = 0
    period: int = 0
    confirmed: int = 0
    lent: bool = False
    lend: bool | None = None  # the trial's choice (None: a trial runs)
    chose: bool | None = None  # the last trial's choice
    held: int = 0  # iterations since the choice
    hold: int = LEND_HOLD  # iterations it holds (doubles each time a trial chooses the same again)
    mark: float = 0.0  # when the last predicted gap started
    mark_lent: bool = False  # whether it was lent
    mark_calm: int | None = None  # calm() then
    clock: Any = time.perf_counter
    # None while the workers' placement is being tried, else how many trials began (the engine
    # sets the placement's: shmvec._placement.Placement.calm); no placement: always calm.
    calm: Any = lambda: 0

    def __post_init__(self) -> None:
        self.gaps: list[float] = []
        self.iterations: list[tuple[bool, float]] = []  # the trial's (lent, seconds)
        self.decided_on: list[tuple[bool, float]] = []  # the last trial's, once it chose

    def as_dict(self) -> dict[str, Any]:
        now = ((self.before if self.lent or not self.reduced else self.after) if self.adaptive else self.after)
        out = {"option": self.option, "before": self.before, "after": self.after, "reason": self.reason, "now": now}
        if self.adaptive and self.period and self.confirmed >= 2:
            state = "trial" if self.lend is None else ("lent" if self.lend else "kept")
            out["long_gaps"] = {"every": self.period, "lending": state, "why": self.lend_reason()}
        return out

    def lend_reason(self) -> str:
        """What lending found (for ``describe()``)."""
        if self.lend is None:
            return (f"a long gap (an update) every {self.period} steps: timing iterations with and without "
                    f"torch's {self.before} threads through it")
        best = {lent: min((s for was, s in self.decided_on if was is lent), default=0.0) for lent in (False, True)}
        return (f"a long gap (an update) every {self.period} steps: an iteration took {best[True] * 1e3:.1f} ms with "
                f"torch's {self.before} threads through it, {best[False] * 1e3:.1f} ms without: "
                + (f"torch gets its {self.before} threads in those gaps" if self.lend else
                   f"torch keeps {self.after} (its spin into the next rollout costs more than it gains)"))

    def stepped(self) -> None:
        """A step returned (the parent's gap starts); the gap predicted long may be lent."""
        if self.adaptive:
            self.returned = now = self.clock()
            if self.reduced and self.confirmed >= 2 and self.since == self.period:
                self._long_gap_starts(now)

    def posting(self) -> bool:
        """A step is posted (the gap ends): every ``GAPS`` steps, their median gap decides; a lent
        gap is over (returns True: torch's lent thread may spin a while yet); a long gap counts
        toward the period."""
        if not self.adaptive:
            return False
        lent = self.lent
        if lent:
            self._set(self.before, self.after)
            self.lent = False
        if self.returned:
            gap = self.clock() - self.returned
            if gap >= LONG_GAP_S:
                self.confirmed = self.confirmed + 1 if self.since == self.period else 1
                self.period, self.since = self.since, 0
            elif self.confirmed and self.since == self.period:  # the gap predicted long was not
                self.confirmed, self.mark, self.iterations = 0, 0.0, []
            self.gaps.append(gap)
            if len(self.gaps) >= GAPS:
                gap = sorted(self.gaps)[GAPS // 2]
                self.gaps.clear()
                if self.adaptive and ((self.reduced and gap > HEAVY_GAP_S) or (not self.reduced and gap < LIGHT_GAP_S)):
                    _follow(self, gap)
        self.since += 1
        return lent

    def _long_gap_starts(self, now: float) -> None:
        calm = self.calm()
        if self.mark and calm is not None and calm == self.mark_calm:  # (no placement trial in between)
            if self.lend is None:
                self.iterations.append((self.mark_lent, now - self.mark))
            else:
                self.held += 1
        self.mark, self.mark_calm = (now, calm) if calm is not None else (0.0, None)
        if calm is None:  # a placement trial runs: not lent, and this iteration is not timed
            self.mark_lent = False
            return
        its = self.iterations
        early = len(its) == 2 and its[1][0] and its[1][1] > its[0][1] * (1.0 + LEND_EARLY)
        if self.lend is None and (len(its) >= TRIAL or early):
            best = {lent: min(s for was, s in its if was is lent) for lent in (False, True)}
            lend = best[True] < (1.0 - LEND_MARGIN) * best[False]
            self.hold = min(2 * self.hold, LEND_HOLD_MAX) if lend is self.chose else LEND_HOLD
            self.lend = self.chose = lend
            self.held, self.decided_on, self.iterations = 0, its, []
        elif self.lend is not None and self.held >= self.hold:
            self.lend = None  # another trial
        lend = len(self.iterations) % 2 == 1 if self.lend is None else self.lend
        self.mark_lent = lend and self._set(self.after, self.before)
        self.lent = self.mark_lent

    def _set(self, now: int | None, to: int | None) -> bool:
        """torch from ``now`` to ``to`` threads; False (and no more following) if torch runs
        another count: the user's."""
        torch = sys.modules.get("torch")
        if torch is None or now is None or to is None or int(torch.get_num_threads()) != now:
            self.adaptive = self.lent = False
            return False
        torch.set_num_threads(to)
        return True


def check_parent_threads(value: Any) -> Any:
    """``parent_threads`` as given, checked: ``"auto"``, ``None`` or a whole number >= 1."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"parent_threads must be 'auto', None (leave torch as it is) or a number of threads, "
                        f"not {value!r}")
    if value < 1:
        raise ValueError(f"parent_threads must be at least 1, got {value}")
    return value


# The process's holders: engines that changed torch's count; the count from before the first change.
_lock = threading.Lock()
_holders = 0
_restore_to: int | None = None
_set_to: int | None = None
_warned = False


def _reset_after_fork() -> None:
    global _lock, _holders, _restore_to, _set_to
    _lock = threading.Lock()
    _holders, _restore_to, _set_to = 0, None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def decide(decision: Decision, n_workers: int, public_name: str = "ShmVecEnv", cores: int | None = None) -> Decision:
    """Decides and applies ``decision`` (again at each call while torch is not loaded; at once
    when decided); returns it.  ``cores``: the CPU budget (default :func:`usable_cores`)."""
    global _holders, _restore_to, _set_to, _warned
    if decision.final:
        return decision
    cores = usable_cores() if cores is None else cores
    option = decision.option
    if option is None:
        decision.reason, decision.final = "parent_threads=None: torch's threads are left as they are", True
        return decision
    torch = sys.modules.get("torch")
    set_threads = getattr(torch, "set_num_threads", None)
    if torch is None or set_threads is None:
        return decision  # not loaded yet: again at the next reset
    decision.final = True
    before = int(torch.get_num_threads())
    decision.before = before
    free = max(1, cores - n_workers)
    if option == AUTO:
        user_set = [name for name in USER_SET_VARS if os.environ.get(name)]
        if user_set:
            decision.reason = f"{user_set[0]} is set: torch's {before} threads are the user's choice, left as they are"
            return decision
        if before <= free:
            decision.reason = (f"torch runs {before} thread(s), no more than the {free} core(s) the {n_workers} "
                               f"worker(s) leave free of {cores}: left as they are")
            return _join(decision, before)
        target = free
        decision.reason = (f"torch ran {before} threads on {cores} cores where {n_workers} worker(s) step envs: its "
                           f"threads spin after each forward pass on the workers' cores; set to {target} (the cores "
                           "the workers leave free, at least 1) while the workers run, restored at close")
    else:
        target = int(option)
        if target == before:
            decision.reason = f"parent_threads={target}: torch already runs {target}"
            return _join(decision, before)
        decision.reason = f"parent_threads={target}: set from {before} while the workers run, restored at close"
    with _lock:
        if _holders == 0:
            _restore_to = before
        _holders += 1
        _set_to = target
        set_threads(target)
    decision.after, decision.holds = target, True
    decision.adaptive = decision.reduced = option == AUTO
    if option == AUTO and not _warned:
        _warned = True
        warnings.warn(
            f"{public_name}: torch ran {before} intra-op threads in this process, on {cores} cores where "
            f"{n_workers} worker{' steps' if n_workers == 1 else 's step'} the envs; after each forward pass those "
            f"threads keep spinning on the "
            f"workers' cores, which made training slower than DummyVecEnv. torch now runs {target} thread(s) "
            f"(torch.set_num_threads({target})) until the vec env closes. To keep torch's setting, pass "
            f"parent_threads=None, or set OMP_NUM_THREADS before starting Python.",
            ParentThreadsWarning, stacklevel=user_stacklevel())
    return decision


def _follow(decision: Decision, gap: float) -> None:
    """Moves torch to the other count of an adaptive decision, unless the user set one meanwhile
    (then theirs stays, and the decision stops following)."""
    now, other = (decision.after, decision.before) if decision.reduced else (decision.before, decision.after)
    if not decision._set(now, other):
        return
    decision.reduced = not decision.reduced
    decision.reason = (f"torch ran {decision.before} threads; the parent's median gap between steps is "
                       f"{gap * 1e3:.2f} ms: " + (f"a light policy, set to {other} while the workers run"
                                                   if decision.reduced else
                                                   f"a heavy policy, its {other} threads gain more than their spin "
                                                   "costs the workers"))


def _join(decision: Decision, now: int) -> Decision:
    """No change needed because another engine of this process changed the count: hold it too, so
    that the count is restored only when the last of them closes."""
    global _holders
    with _lock:
        if _holders and now == _set_to:
            _holders += 1
            decision.holds = True
            decision.reason += " (another vec env of this process set it; restored when the last closes)"
    return decision


def release(decision: Decision | None) -> None:
    """At an engine's close: drops its hold; the last holder restores torch's count (if the user
    did not change it in the meantime).  None (an engine that never got that far): nothing."""
    global _holders, _restore_to, _set_to
    if decision is None or not decision.holds:
        return
    decision.holds = False
    if decision.lent:  # closed in a lent gap: torch back at the held count first
        decision.lent = False
        decision._set(decision.before, decision.after)
    with _lock:
        if _holders == 0:
            return  # a forked child's copy of the parent's engine: the child holds nothing
        _holders -= 1
        if _holders:
            return
        torch = sys.modules.get("torch")
        restore, set_to = _restore_to, _set_to
        _restore_to = _set_to = None
        if torch is not None and restore is not None and int(torch.get_num_threads()) == set_to:
            torch.set_num_threads(restore)
