"""Restarts: ``ShmVecEnv(..., on_failure="restart")`` replaces a failed worker instead of raising.

What users see (the truncation report, the warnings, ``max_restarts``, rare commands) is
described once, in docs/failures.md.  The mechanism, owned by the engine (``engine.restarts``,
absent with ``on_failure="raise"``), which it sees only through a :class:`RestartHost` (its
parts, its facts, one of them read at each restart, and one of its methods); it talks to the
workers through their links (:mod:`shmvec._link`) like the engine, and starts and attaches a new
worker through the worker set, with the records the first start used (:mod:`shmvec._startup_args`):

1. :meth:`Restarts.complete` replaces the engine's raising wait for STEP and RESET: the other
   workers finish the command as usual, and the failed ones (dead by their sentinel, an env
   that raised, silent past ``timeout``: killed) are collected in ``failed``;
2. each failed worker is stopped (:meth:`shmvec._workers.WorkerSet.stop`), a new process builds
   the same slice from the same factories and maps the block from its descriptor (its name was
   unlinked at start-up: :mod:`shmvec._segment`), and its envs are reset (for a failed reset, with
   the same seeds and options, ``reset_args``);
3. the step's items for those envs are written as truncated episodes (reward 0, ``truncated``,
   the last observation the caller received as ``terminal_observation``), in the same item format
   the workers use, so the front-end builds its return without knowing.  That observation is
   :attr:`Restarts.kept`: at the end of every STEP and RESET the engine's wait copies block 0
   (every observation leaf, the multi-agent stacks' flags too) into buffers of its own, before
   any front-end hands it out.  Neither what the caller does to the arrays it got (written in
   place, or ``copy=False`` views of block 0) nor the restarted worker's partial writes into
   block 0 reach it, and every front-end (SB3, multi-agent) reads the same copy;
4. before a rare command, :meth:`recover_dead` restarts workers found dead, and ``fresh`` keeps
   their envs out of the next STEP, whose items then report them.

A failure while restarting is raised and breaks the engine.  A worker killed between its
DONE_SEQ store and its PENDING decrement leaves PENDING one too high: once every live worker
has answered, the wait settles for ``SETTLE_S`` and goes on without it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shmvec import _protocol as P
from shmvec._errors import (
    SpaceError,
    TooManyRestartsError,
    WorkerDiedError,
    WorkerRestartWarning,
    WorkerStacks,
    WorkerTimeoutError,
    describe_exitcode,
    envs_named,
    unpack_exception,
    user_stacklevel,
)
from shmvec._link import Links
from shmvec._protocol import RESTART_INFO_KEY
from shmvec._state import Status, record
from shmvec._workers import BROKEN_HINT, DIED_JOIN_S, WorkerSet

if TYPE_CHECKING:  # the engine owns its Restarts: no import of the engine or the channel at run time
    from shmvec._channel import Channel
    from shmvec._engine import Engine

# Bound of stopping a failed worker that is still alive, before SIGTERM.
STOP_JOIN_S = 5.0
SETTLE_S = 1.0
# A new worker imports and builds its envs: the step timeout is too short a bound for that.
RESTART_TIMEOUT_FLOOR_S = 60.0


@dataclass(frozen=True)
class RestartHost:
    """What :class:`Restarts` works with, and all it knows of its engine."""

    slices: Sequence[range]
    timeout: float | None  # the engine's (the channel's is raised while a new worker starts)
    spin: float  # the parent's spin before it sleeps on PENDING (``parent_spin_s``)
    max_restarts: int | None
    status: Status
    workers: WorkerSet  # (its ``views``: the block's arrays, None once released)
    channel: Channel
    links: Links
    observation_spaces: list  # every env's: a rebuilt env must have the same
    action_space: Any
    arm: Callable[[P.Cmd], None]  # before a post: PARENT_CPU, EARLY_WAKE, the lease block (Engine.arm_early_wake)
    masks_live: Callable[[], bool]  # whether the workers write masks now (the engine's, read at each restart)

    @classmethod
    def of(cls, engine: Engine) -> RestartHost:
        return cls(engine.slices, engine.timeout, engine.options.parent_spin_s, engine.options.max_restarts,
                   engine.status, engine.workers, engine.channel, engine.links, engine.env_observation_spaces,
                   engine.action_space, engine.arm_early_wake, lambda: engine.masks_live)


class Restarts:
    """``on_failure="restart"`` for one engine (see the module docstring)."""

    def __init__(self, host: RestartHost) -> None:
        self.host = host
        self.max_restarts = host.max_restarts
        self.count = 0  # restarts so far
        # worker -> (reason, reset infos): restarted outside a step, truncation not yet reported
        self.fresh: dict[int, tuple[str, dict[int, dict]]] = {}
        self.reset_args: dict[int, bytes | None] = {}
        # Block 0's observation leaves as the last STEP or RESET left them (module docstring, 3);
        # buffers of our own, never a view of the block (close() unmaps it).
        self.kept: dict[Any, np.ndarray] = {path: np.empty_like(arr) for path, arr in host.workers.views.obs.items()}
        self.has_kept = False  # nothing kept before the first command: the restarted env's block 0 row then
        self.unwarned: list = []  # (first restart's number, {worker: reason}, command): not yet warned
        self.failure_stacks: dict[int, str] = {}  # worker -> its Python stack when it failed, until warned

    def keep(self) -> None:
        """Copies block 0's observations, as the command that just ended left them, into :attr:`kept`."""
        kept = self.kept
        for path, arr in self.host.workers.views.obs.items():
            np.copyto(kept[path], arr)
        self.has_kept = True

    # ---- synchronous commands ------------------------------------------------------------------
    def complete(self, command: str) -> list[list]:
        """The engine's wait for ``command`` ("step" or "reset"): failed workers are restarted, not raised."""
        h = self.host
        links, workers = h.links, h.workers
        fresh = self.fresh if command == "step" else {}
        posted = [w for w in range(len(links)) if w not in fresh]
        failed: dict[int, str] = {}
        since = time.monotonic()
        settle_from: float | None = None
        target = 0  # failed workers that never decremented PENDING
        while not links.wait(h.spin, P.POLL_S, target):  # every poll: who failed, who is late
            h.status.check_closing(command)
            for w in workers.dead():
                if w in posted and w not in failed:
                    failed[w] = self.death_reason(w)
            if h.timeout is not None and time.monotonic() - since >= h.timeout:
                for w in links.late(posted):
                    if w not in failed:
                        at = workers.env_of(w)
                        stacks = workers.stacks([w])  # where it hung, for the warning, before it goes
                        if stacks is not None:
                            self.failure_stacks[w] = stacks.tb
                        workers.processes[w].kill()
                        failed[w] = (f"worker {w} did not answer within timeout={h.timeout:g} s"
                                     + ("" if at is None else f" (stuck in env {at})") + " and was killed")
            target = len(links.late(failed))
            if links.pending != target and failed and not links.late(w for w in posted if w not in failed):
                settle_from = settle_from or time.monotonic()
                if time.monotonic() - settle_from > SETTLE_S:
                    break
        links.clear_pending()

        results: list[list] = [[] for _ in range(len(links))]
        for w in posted:
            if w in failed:
                continue
            try:
                packed, results[w] = links[w].reply(command, h.channel.recv_raw)
                if packed is not None:
                    where = f"env {packed['env_index']}" if packed["env_index"] is not None else f"worker {w}"
                    failed[w] = f"{where} raised {packed['type_name']}: {packed['message']}"
            except WorkerTimeoutError:
                # Done, but its message (protocol step 6b) did not come within the timeout: a
                # worker stopped or stuck once its command was complete.  Killed and restarted,
                # as one that does not complete the command in time.
                h.status.recover()
                workers.processes[w].kill()
                failed[w] = (f"worker {w} did not send its result within timeout={h.timeout:g} s "
                             "and was killed")
            except WorkerDiedError:
                # Died once done, before its message was out (protocol step 6b): a failure like
                # any other here.  The read marked the engine broken; the restart repairs it.
                broken = h.status.recover()
                for d in workers.dead():
                    if d in posted and d not in failed:
                        failed[d] = self.death_reason(d)
                if w not in failed:
                    if broken is not None:
                        h.status.fail(broken, first=False)
                    raise

        reset_infos = self.restart(failed, command) if failed else {}
        if command == "step":
            for w, reason in failed.items():
                results[w] = self.truncated_items(w, reason, reset_infos)
            for w, (reason, infos) in fresh.items():
                results[w] = self.truncated_items(w, reason, infos)
        else:
            for w, reason in failed.items():
                results[w] = [(i, dict(reset_infos.get(i, {}), **{RESTART_INFO_KEY: reason}))
                              for i in h.slices[w]]
        self.fresh = {}
        self.keep()  # what the caller gets from this command, before it can change it
        self.warn()
        return results

    def truncated_items(self, w: int, reason: str, reset_infos: dict[int, dict]) -> list:
        """Writes worker w's step results as truncated episodes; its (i, info, reset_info) items."""
        h = self.host
        sl = h.slices[w]
        h.workers.views.rew[sl.start:sl.stop] = 0.0  # no local view of the block (see reset_restarted)
        h.workers.views.terminated[sl.start:sl.stop] = False
        h.workers.views.truncated[sl.start:sl.stop] = True
        last = self.kept if self.has_kept else h.workers.views.obs
        for path, term in h.workers.views.term_obs.items():
            term[sl.start:sl.stop] = last[path][sl.start:sl.stop]
        return [(i, {RESTART_INFO_KEY: reason}, reset_infos.get(i, {})) for i in sl]

    # ---- rare commands ---------------------------------------------------------------------------
    def recover_dead(self, command: str) -> None:
        """Restarts the workers found dead before a rare command; their truncation is reported at the next step."""
        dead = self.host.workers.dead()
        if not dead:
            return
        failed = {w: self.death_reason(w) for w in dead}
        infos = self.restart(failed, command)
        for w, reason in failed.items():
            self.fresh[w] = (reason, {i: infos.get(i, {}) for i in self.host.slices[w]})
        self.warn()

    # ---- restarting --------------------------------------------------------------------------------
    def death_reason(self, w: int) -> str:
        workers = self.host.workers
        proc = workers.processes[w]
        proc.join(DIED_JOIN_S)  # the sentinel can be ready a moment before the exit code
        stack = workers.crash_report(w)  # before stop() closes its pipe
        if stack:
            self.failure_stacks[w] = stack
        return f"worker {w} died with {describe_exitcode(proc.exitcode)}{workers.in_env(w)}"

    def failure_stack(self, w: int) -> WorkerStacks | None:
        """Worker w's stack when it failed, once (``failure_stacks``), for its warning or error."""
        return WorkerStacks.of(self.failure_stacks.pop(w, ""), "when it failed")

    def restart(self, failed: dict[int, str], command: str) -> dict[int, dict]:
        """Replaces the failed workers, resets their envs; returns their reset infos by env index."""
        h = self.host
        first = self.count + 1
        # All or none: the limit is checked for every failed worker before any restart is counted.
        if self.max_restarts is not None and self.count + len(failed) > self.max_restarts:
            w, reason = list(failed.items())[min(len(failed) - 1, max(0, self.max_restarts - self.count))]
            sl = h.slices[w]
            if len(failed) > 1:
                # Restarting some of the failed workers would still leave the others failed, and
                # the vec env could not go on anyway.
                over = (f"; {len(failed)} workers failed in this {command}, and restarting them all would make "
                        f"{self.count + len(failed)} restarts")
            else:
                over = ""
            stack = self.failure_stack(w)
            self.failure_stacks.clear()
            raise record(h.status, TooManyRestartsError(
                f"worker {w} ({envs_named(range(sl.start, sl.stop))}) failed during {command} ({reason}){over}: over the "
                f"limit set by max_restarts={self.max_restarts} ({self.count} restarts so far). The envs keep "
                f"failing: fix them, or raise max_restarts (None: no limit). "
                + ("Its Python stack when it failed (faulthandler) is shown above. " if stack else "") + BROKEN_HINT
            ), stack)
        self.count += len(failed)
        channel, workers = h.channel, h.workers
        if h.timeout is not None:
            channel.timeout = max(h.timeout, RESTART_TIMEOUT_FLOOR_S)  # read by the pipe waits
        try:
            for w in failed:
                workers.stop(w, STOP_JOIN_S)
            for w in failed:
                workers.launch(w)  # on the same cores as the worker it replaces
            workers.refresh_sentinels()
            for w in failed:
                self.handshake(w)
            workers.note_groups(list(failed))
            for w in failed:
                channel.recv(w, f"restart of worker {w}", BROKEN_HINT)  # READY
            infos = self.reset_restarted(list(failed), command)
        except BaseException as exc:
            if isinstance(exc, Exception):
                reasons = "; ".join(failed.values())
                exc.add_note(f"shmvec: raised while restarting after a failure during {command} ({reasons}). "
                             + BROKEN_HINT)
            h.status.fail(exc)  # after the note: the status keeps a copy
            raise
        finally:
            channel.timeout = h.timeout
        # Warned by the caller once its bookkeeping is done: a warning turned into an error
        # (-W error) must not lose the truncation report of envs that were restarted.
        self.unwarned.append((first, dict(failed), command))
        return infos

    def warn(self) -> None:
        """Emits the WorkerRestartWarning of each restart since the last call."""
        pending, self.unwarned = self.unwarned, []
        for first, failed, command in pending:
            self._warn_restarted(first, failed, command)

    def _warn_restarted(self, first: int, failed: dict[int, str], command: str) -> None:
        limit = "no limit" if self.max_restarts is None else f"max_restarts={self.max_restarts}"
        report = {
            "step": f"their episodes end as truncated, with info[{RESTART_INFO_KEY!r}] saying why",
            "reset": f"reset_infos[i][{RESTART_INFO_KEY!r}] says why",
        }.get(command, f"the next step reports their episodes as truncated, with info[{RESTART_INFO_KEY!r}]")
        for count, (w, reason) in enumerate(failed.items(), start=first):
            sl = self.host.slices[w]
            stack = self.failure_stack(w)
            warnings.warn(
                f"shmvec: worker {w} ({envs_named(range(sl.start, sl.stop))}) failed during {command} ({reason}) and was "
                f"restarted (restart {count}, {limit}); its envs were rebuilt and reset, and {report}."
                + ("" if stack is None else f" Its Python stack when it failed (faulthandler):\n{stack.tb}"),
                WorkerRestartWarning, stacklevel=user_stacklevel(),
            )

    def handshake(self, w: int) -> None:
        h = self.host
        what = f"restart of worker {w}"
        obs_space, act_space, *_, own = h.channel.recv(w, what, BROKEN_HINT)
        sl = h.slices[w]
        rebuilt = [("observation_space", i, mine, ours) for i, mine, ours in
                   zip(sl, own or [obs_space] * len(sl), h.observation_spaces[sl.start:sl.stop])]
        for name, i, mine, ours in [*rebuilt, ("action_space", sl.start, act_space, h.action_space)]:
            if mine != ours:
                raise SpaceError(f"env {i} was rebuilt with {name} {mine}, the vec env has "
                                 f"{ours}: its factory must build envs with the same spaces every time.")
        h.workers.send_attach(w, h.masks_live(), by_fd=True)  # the block's descriptor: its name is unlinked

    def reset_restarted(self, workers: list[int], command: str) -> dict[int, dict]:
        """RESET to the given workers only (with the last reset's arguments for a failed reset)."""
        h = self.host
        links = h.links
        what = f"reset after restarting workers {workers}"
        h.arm(P.Cmd.RESET)
        in_pipe: dict[int, bytes] = {}
        for w in workers:
            arg = (self.reset_args.get(w) if command == "reset" else None) or b""
            if links[w].put_arg(arg) is not None:
                in_pipe[w] = arg
        links.post(P.Cmd.RESET, workers)
        links.wake(workers)
        h.channel.send_args(in_pipe, what, restarting=True)
        deadline = None if h.timeout is None else time.monotonic() + h.timeout
        while not links.wait(0.0, P.POLL_S):
            h.channel.check_alive(what, workers)  # another worker found dead: the next command's
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerTimeoutError(f"{what}: no answer within {h.timeout:g} s. {BROKEN_HINT}")
        infos: dict[int, dict] = {}
        error: BaseException | None = None
        for w in workers:
            packed, items = links[w].reply(what, h.channel.recv_raw)
            if packed is not None:
                error = error or unpack_exception(packed, BROKEN_HINT)
                continue
            infos.update(items)
            links[w].clear_result()  # read (Link.clear_result says why)
        if error is not None:
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and self) through its traceback
        return infos
