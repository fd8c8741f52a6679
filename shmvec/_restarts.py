"""Restarts: ``ShmVecEnv(..., on_failure="restart")`` replaces a failed worker instead of raising.

What users see (the truncation report, the warnings, ``max_restarts``, rare commands) is
described once, in docs/failures.md.  The mechanism, owned by the engine (``engine.restarts``,
absent with ``on_failure="raise"``):

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
from multiprocessing import reduction
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
from shmvec._protocol import RESTART_INFO_KEY
from shmvec._state import record
from shmvec._workers import BROKEN_HINT, DIED_JOIN_S

if TYPE_CHECKING:  # the engine owns its Restarts: no import of the engine at run time
    from shmvec._engine import Engine

_ERROR = int(P.Status.ERROR)
# Bound of stopping a failed worker that is still alive, before SIGTERM.
STOP_JOIN_S = 5.0
SETTLE_S = 1.0
# A new worker imports and builds its envs: the step timeout is too short a bound for that.
RESTART_TIMEOUT_FLOOR_S = 60.0


class Restarts:
    """``on_failure="restart"`` for one engine (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.max_restarts = engine.options.max_restarts
        self.count = 0  # restarts so far
        # worker -> (reason, reset infos): restarted outside a step, truncation not yet reported
        self.fresh: dict[int, tuple[str, dict[int, dict]]] = {}
        self.reset_args: dict[int, bytes | None] = {}
        # Block 0's observation leaves as the last STEP or RESET left them (module docstring, 3);
        # buffers of our own, never a view of the block (close() unmaps it).
        self.kept: dict[Any, np.ndarray] = {path: np.empty_like(arr) for path, arr in engine.views.obs.items()}
        self.has_kept = False  # nothing kept before the first command: the restarted env's block 0 row then
        self.unwarned: list = []  # (first restart's number, {worker: reason}, command): not yet warned
        self.failure_stacks: dict[int, str] = {}  # worker -> its Python stack when it failed, until warned

    def keep(self) -> None:
        """Copies block 0's observations, as the command that just ended left them, into :attr:`kept`."""
        kept = self.kept
        for path, arr in self.engine.views.obs.items():
            np.copyto(kept[path], arr)
        self.has_kept = True

    # ---- synchronous commands ------------------------------------------------------------------
    def complete(self, command: str) -> list[list]:
        """The engine's wait for ``command`` ("step" or "reset"): failed workers are restarted, not raised."""
        e = self.engine
        words, seqs, workers = e.words, e.seqs, e.workers
        fresh = self.fresh if command == "step" else {}
        posted = [w for w in range(e.n_workers) if w not in fresh]
        failed: dict[int, str] = {}
        done = lambda w: words.load(P.word(w, P.DONE_SEQ)) == seqs[w]  # noqa: E731
        since = time.monotonic()
        settle_from: float | None = None
        target = 0  # failed workers that never decremented PENDING
        pending = words.load(P.PENDING)
        spin = e.options.parent_spin_s
        while pending != target:
            if not spin and words.load(P.EARLY_WAKE):
                spin = P.EARLY_SPIN_S  # as in the engine's wait
            value = words.wait_while(P.PENDING, pending, P.POLL_S, spin, P.PARENT_SLEEPERS)
            if value is not None:
                pending = value
                continue
            e.status.check_closing(command)
            for w in workers.dead():
                if w in posted and w not in failed:
                    failed[w] = self.death_reason(w)
            if e.timeout is not None and time.monotonic() - since >= e.timeout:
                for w in posted:
                    if w not in failed and not done(w):
                        at = workers.env_of(w)
                        stacks = workers.stacks([w])  # where it hung, for the warning, before it goes
                        if stacks is not None:
                            self.failure_stacks[w] = stacks.tb
                        workers.processes[w].kill()
                        failed[w] = (f"worker {w} did not answer within timeout={e.timeout:g} s"
                                     + ("" if at is None else f" (stuck in env {at})") + " and was killed")
            target = sum(1 for w in failed if not done(w))
            pending = words.load(P.PENDING)
            if pending != target and failed and all(done(w) for w in posted if w not in failed):
                settle_from = settle_from or time.monotonic()
                if time.monotonic() - settle_from > SETTLE_S:
                    break
        words.store(P.PENDING, 0)

        results: list[list] = [[] for _ in range(e.n_workers)]
        for w in posted:
            if w in failed:
                continue
            try:
                if words.load(P.word(w, P.STATUS)) == _ERROR:
                    _, packed = e.channel.recv_raw(w, command)
                    where = f"env {packed['env_index']}" if packed["env_index"] is not None else f"worker {w}"
                    failed[w] = f"{where} raised {packed['type_name']}: {packed['message']}"
                    continue
                results[w] = e.read_result(w, words.load(P.word(w, P.RESULT_LEN)), command)
            except WorkerTimeoutError:
                # Done, but its message (protocol step 6b) did not come within the timeout: a
                # worker stopped or stuck once its command was complete.  Killed and restarted,
                # as one that does not complete the command in time.
                e.status.recover()
                workers.processes[w].kill()
                failed[w] = (f"worker {w} did not send its result within timeout={e.timeout:g} s "
                             "and was killed")
            except WorkerDiedError:
                # Died once done, before its message was out (protocol step 6b): a failure like
                # any other here.  The read marked the engine broken; the restart repairs it.
                broken = e.status.recover()
                for d in workers.dead():
                    if d in posted and d not in failed:
                        failed[d] = self.death_reason(d)
                if w not in failed:
                    if broken is not None:
                        e.status.fail(broken, first=False)
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
                              for i in e.slices[w]]
        self.fresh = {}
        self.keep()  # what the caller gets from this command, before it can change it
        self.warn()
        return results

    def truncated_items(self, w: int, reason: str, reset_infos: dict[int, dict]) -> list:
        """Writes worker w's step results as truncated episodes; its (i, info, reset_info) items."""
        e = self.engine
        sl = e.slices[w]
        e.views.rew[sl.start:sl.stop] = 0.0  # no local view of the block (see reset_restarted)
        e.views.terminated[sl.start:sl.stop] = False
        e.views.truncated[sl.start:sl.stop] = True
        last = self.kept if self.has_kept else e.views.obs
        for path, term in e.views.term_obs.items():
            term[sl.start:sl.stop] = last[path][sl.start:sl.stop]
        return [(i, {RESTART_INFO_KEY: reason}, reset_infos.get(i, {})) for i in sl]

    # ---- rare commands ---------------------------------------------------------------------------
    def recover_dead(self, command: str) -> None:
        """Restarts the workers found dead before a rare command; their truncation is reported at the next step."""
        dead = self.engine.workers.dead()
        if not dead:
            return
        failed = {w: self.death_reason(w) for w in dead}
        infos = self.restart(failed, command)
        for w, reason in failed.items():
            self.fresh[w] = (reason, {i: infos.get(i, {}) for i in self.engine.slices[w]})
        self.warn()

    # ---- restarting --------------------------------------------------------------------------------
    def death_reason(self, w: int) -> str:
        workers = self.engine.workers
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
        e = self.engine
        first = self.count + 1
        # All or none: the limit is checked for every failed worker before any restart is counted.
        if self.max_restarts is not None and self.count + len(failed) > self.max_restarts:
            w, reason = list(failed.items())[min(len(failed) - 1, max(0, self.max_restarts - self.count))]
            sl = e.slices[w]
            if len(failed) > 1:
                # Restarting some of the failed workers would still leave the others failed, and
                # the vec env could not go on anyway.
                over = (f"; {len(failed)} workers failed in this {command}, and restarting them all would make "
                        f"{self.count + len(failed)} restarts")
            else:
                over = ""
            stack = self.failure_stack(w)
            self.failure_stacks.clear()
            raise record(e.status, TooManyRestartsError(
                f"worker {w} ({envs_named(range(sl.start, sl.stop))}) failed during {command} ({reason}){over}: over the "
                f"limit set by max_restarts={self.max_restarts} ({self.count} restarts so far). The envs keep "
                f"failing: fix them, or raise max_restarts (None: no limit). "
                + ("Its Python stack when it failed (faulthandler) is shown above. " if stack else "") + BROKEN_HINT
            ), stack)
        self.count += len(failed)
        channel, workers = e.channel, e.workers
        if e.timeout is not None:
            channel.timeout = max(e.timeout, RESTART_TIMEOUT_FLOOR_S)  # read by the pipe waits
        try:
            for w in failed:
                workers.stop(w, e.seqs, STOP_JOIN_S)
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
            e.status.fail(exc)  # after the note: the status keeps a copy
            raise
        finally:
            channel.timeout = e.timeout
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
            sl = self.engine.slices[w]
            stack = self.failure_stack(w)
            warnings.warn(
                f"shmvec: worker {w} ({envs_named(range(sl.start, sl.stop))}) failed during {command} ({reason}) and was "
                f"restarted (restart {count}, {limit}); its envs were rebuilt and reset, and {report}."
                + ("" if stack is None else f" Its Python stack when it failed (faulthandler):\n{stack.tb}"),
                WorkerRestartWarning, stacklevel=user_stacklevel(),
            )

    def handshake(self, w: int) -> None:
        e = self.engine
        what = f"restart of worker {w}"
        obs_space, act_space, *_, own = e.channel.recv(w, what, BROKEN_HINT)
        sl = e.slices[w]
        rebuilt = [("observation_space", i, mine, ours) for i, mine, ours in
                   zip(sl, own or [obs_space] * len(sl), e.env_observation_spaces[sl.start:sl.stop])]
        for name, i, mine, ours in [*rebuilt, ("action_space", sl.start, act_space, e.action_space)]:
            if mine != ours:
                raise SpaceError(f"env {i} was rebuilt with {name} {mine}, the vec env has "
                                 f"{ours}: its factory must build envs with the same spaces every time.")
        layout = e.layout
        conn = e.workers.conns[w]
        conn.send((P.Pipe.ATTACH_FD, (layout.n_envs, e.n_workers, layout.mailbox_bytes, layout.mask_size,
                                      e.masks_live, layout.obs_blocks)))
        reduction.send_handle(conn, e.workers.block_fd(), e.workers.processes[w].pid)

    def reset_restarted(self, workers: list[int], command: str) -> dict[int, dict]:
        """RESET to the given workers only (with the last reset's arguments for a failed reset)."""
        e = self.engine
        words, seqs = e.words, e.seqs  # no local view of the block: a traceback would keep it mapped after close()
        what = f"reset after restarting workers {workers}"
        e.arm_early_wake(P.Cmd.RESET)
        words.store(P.PENDING, len(workers))
        in_pipe: dict[int, bytes] = {}
        for w in workers:
            arg = self.reset_args.get(w) if command == "reset" else None
            arg_len = len(arg) if arg else 0
            if arg and arg_len >= e.layout.mailbox_bytes:
                in_pipe[w], arg_len = arg, P.ARG_IN_PIPE
            elif arg:
                e.views.mailbox[w, :arg_len] = memoryview(arg)
            words.store(P.word(w, P.ARG_LEN), arg_len)
            seqs[w] = (seqs[w] + 1) & 0xFFFFFFFF
            words.store(P.word(w, P.CMD), P.Cmd.RESET)
            words.store(P.word(w, P.CMD_SEQ), seqs[w])
            words.wake(P.word(w, P.CMD_SEQ))
        e.channel.send_args(in_pipe, what, restarting=True)
        deadline = None if e.timeout is None else time.monotonic() + e.timeout
        pending = words.load(P.PENDING)
        while pending != 0:
            value = words.wait_while(P.PENDING, pending, P.POLL_S, 0.0, P.PARENT_SLEEPERS)
            if value is not None:
                pending = value
                continue
            e.channel.check_alive(what, workers)  # another worker found dead: the next command's
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerTimeoutError(f"{what}: no answer within {e.timeout:g} s. {BROKEN_HINT}")
            pending = words.load(P.PENDING)
        infos: dict[int, dict] = {}
        error: BaseException | None = None
        for w in workers:
            if words.load(P.word(w, P.STATUS)) == _ERROR:
                _, packed = e.channel.recv_raw(w, what)
                error = error or unpack_exception(packed, BROKEN_HINT)
                continue
            infos.update(e.read_result(w, words.load(P.word(w, P.RESULT_LEN)), what))
            # Read: a worker left out of the next STEP (restarted before a rare command) keeps these
            # words until its next command, and a pipe result must not be read twice (close()).
            words.store(P.word(w, P.RESULT_LEN), 0)
        if error is not None:
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and self) through its traceback
        return infos
