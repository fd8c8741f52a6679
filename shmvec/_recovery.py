"""Recovery from failed workers: ``ShmVecEnv(..., on_failure="restart")``.

With the default ``on_failure="raise"`` a failed worker (it died, or one of its
envs raised) makes the vec env raise and then refuse every call but
``close()``.  With ``on_failure="restart"`` the vec env replaces the worker
instead and carries on:

1. the other workers finish the command as usual (their envs are untouched);
2. the failed worker is stopped: a live one (its env raised) is asked to close
   its envs, then terminated if it does not exit within a few seconds; a dead
   one is reaped;
3. a new worker process builds the same slice of envs from the same factories
   and maps the shared block from its file descriptor (the block's name was
   unlinked once the first workers attached, so that nothing outlives a killed
   parent; see :mod:`shmvec._segment`);
4. its envs are reset (for a failed ``reset()``, with the same seeds and options);
5. ``step_wait`` reports each of its envs as an episode ended by truncation:
   ``done`` True, reward 0, ``info["TimeLimit.truncated"]`` True,
   ``info["terminal_observation"]`` the last observation the caller received
   for that env, ``info["shmvec_restarted"]`` a string saying what failed; the
   returned observation is the reset observation.  After a failed ``reset()``,
   the flag is in ``reset_infos[i]``.  Every restart emits a
   :class:`~shmvec._errors.WorkerRestartWarning`.

What counts as a failure: the worker process exits (a signal such as SIGSEGV or
SIGKILL from the OOM killer, ``os._exit``), an env raises in ``step`` or
``reset``, or (when ``timeout`` is set) the worker does not answer in time: it
is then killed and restarted.  A failure while restarting (the factory raises,
the new envs' ``reset`` raises, the new worker dies) is raised, and the vec env
is broken: a worker that cannot even start is not worth retrying.  Starting and
resetting a new worker may take ``max(timeout, 60)`` seconds (imports are slow).  After
``max_restarts`` restarts the next failure raises
:class:`~shmvec._errors.TooManyRestartsError` (``max_restarts=None``: no limit); so does a
command in which more workers fail than restarts are left (all are restarted, or none).
A worker found dead while others are being restarted is restarted at the next command.
With WorkerRestartWarning turned into an error (``-W error``), a restart during a step or a
reset raises it once the restart is done, and the vec env is broken (that step's results are
lost with the exception); a restart before a rare command raises it from the call, and the
next step still reports the truncation.
With ``copy=False``, a restart before a rare command writes the new envs' reset observations
into the shared buffers at once: views returned by the last step change under the caller.

Rare commands (``get_attr``, ``set_attr``, ``env_method``, ``render``, ...)
first restart any worker found dead (a worker killed between two steps), then
run on the new envs; the next ``step_wait`` reports those envs' episodes as
truncated without stepping them (the action given for them is dropped: it was
chosen for an observation of the old episode).  A worker that dies *during* a
rare command, or an env that raises in ``env_method``, behaves as with
``on_failure="raise"``: the call raises (a dead worker leaves the vec env
broken; an exception in ``env_method`` does not).  A rare command's effect
cannot be replayed safely on new envs, and its caller is there to see the error.
A worker counts as found dead once its process sentinel is ready; one killed an
instant before the command (its threads still exiting) counts as dying during it.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from multiprocessing import reduction
from multiprocessing.connection import wait as mp_wait
from typing import Any

from shmvec import _protocol as P
from shmvec._protocol import RESTART_INFO_KEY
from shmvec._errors import (
    user_stacklevel,
    SpaceError,
    TooManyRestartsError,
    WorkerDiedError,
    WorkerRestartWarning,
    WorkerStacks,
    WorkerTimeoutError,
    broken_by,
    describe_exitcode,
    unpack_exception,
)
from shmvec._layout import make_scatter

ON_FAILURE = ("raise", "restart")
_ERROR = int(P.Status.ERROR)
_BROKEN_HINT = "The vec env cannot go on: call close() and build a new one."
# Bounds of stopping a failed worker that is still alive: polite, then SIGTERM, then SIGKILL.
_STOP_JOIN_S = 5.0
_TERMINATE_JOIN_S = 1.0
_DIED_JOIN_S = 1.0
# A worker killed between its DONE_SEQ store and its PENDING decrement leaves PENDING one
# too high; once every live worker has answered, wait this long before going on without it.
_SETTLE_S = 1.0
# A new worker imports and builds its envs: the step timeout is too short a bound for that.
_RESTART_TIMEOUT_FLOOR_S = 60.0


class Recovery:
    """Mixin of :class:`~shmvec.ShmVecEnv` holding ``on_failure="restart"`` (see the module docstring).

    It uses the vec env's attributes (``_res``, ``_words``, ``_views``, ``_seq``,
    ``slices``, ...) and adds its own; the vec env calls ``_init_recovery`` at
    construction, ``_complete_restarting`` instead of its raising wait,
    ``_recover_dead`` before a rare command, ``_post(cmd, skip=self._fresh)`` while restarted
    envs await their truncation report, and ``_remember_obs`` on what it returns.
    """

    # Class-level defaults: safe on a half-built object.
    on_failure = "raise"
    max_restarts: int | None = None
    restarts = 0
    _restart = False
    _fresh: dict[int, tuple[str, dict[int, dict]]] = {}
    _reset_args: dict[int, bytes | None] = {}
    _last_obs: Any = None
    _unwarned: list = []

    def _init_recovery(self, on_failure: str, max_restarts: int | None) -> None:
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {ON_FAILURE}, got {on_failure!r}")
        if on_failure == "restart" and hasattr(self, "step_raw"):
            # The Gymnasium-style engines (ShmVectorEnv, ShmEnvPool) run their own step and reset
            # protocols: the truncation report here is SB3's.
            raise ValueError("on_failure='restart' is supported by ShmVecEnv (the SB3 VecEnv) only")
        if max_restarts is not None and max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 or None, got {max_restarts}")
        self.on_failure = on_failure
        self._restart = on_failure == "restart"
        self.max_restarts = max_restarts
        self.restarts = 0
        # worker -> (reason, reset infos): restarted outside a step, truncation not yet reported
        self._fresh = {}
        self._reset_args = {}
        self._last_obs = None
        self._unwarned = []  # (first restart's number, {worker: reason}, command): not yet warned
        self._failure_stacks = {}  # worker -> its Python stack when it failed (shmvec._crash), until warned

    def _remember_obs(self, obs: Any) -> Any:
        """Keeps what ``step_wait``/``reset`` return: the terminal observation of a restarted env."""
        self._last_obs = obs if self.copy else self._obs_copy(slice(None))
        return obs

    # ---- synchronous commands ------------------------------------------------------------------
    def _complete_restarting(self, command: str) -> list[list]:
        """``_complete_or_raise`` for ``on_failure="restart"``: failed workers are restarted, not raised."""
        words, seqs = self._words, self._seq
        fresh = self._fresh if command == "step" else {}
        posted = [w for w in range(self.n_workers) if w not in fresh]
        failed: dict[int, str] = {}
        done = lambda w: words.load(P.word(w, P.DONE_SEQ)) == seqs[w]  # noqa: E731
        since = time.monotonic()
        settle_from: float | None = None
        target = 0  # failed workers that never decremented PENDING
        pending = words.load(P.PENDING)
        spin = self._parent_spin
        while pending != target:
            if not spin and words.load(P.EARLY_WAKE):
                spin = P.EARLY_SPIN_S  # as in _complete_or_raise
            value = words.wait_while(P.PENDING, pending, P.POLL_S, spin, P.PARENT_SLEEPERS)
            if value is not None:
                pending = value
                continue
            for w in self._dead_workers():
                if w in posted and w not in failed:
                    failed[w] = self._death_reason(w)
            if self.timeout is not None and time.monotonic() - since >= self.timeout:
                for w in posted:
                    if w not in failed and not done(w):
                        at = self._env_of(w)
                        stacks = self._stacks([w])  # where it hung, for the warning, before it goes
                        if stacks is not None:
                            self._failure_stacks[w] = stacks.tb
                        self._res.processes[w].kill()
                        failed[w] = (f"worker {w} did not answer within timeout={self.timeout:g} s"
                                     + ("" if at is None else f" (stuck in env {at})") + " and was killed")
            target = sum(1 for w in failed if not done(w))
            pending = words.load(P.PENDING)
            if pending != target and failed and all(done(w) for w in posted if w not in failed):
                settle_from = settle_from or time.monotonic()
                if time.monotonic() - settle_from > _SETTLE_S:
                    break
        words.store(P.PENDING, 0)

        results: list[list] = [[] for _ in range(self.n_workers)]
        for w in posted:
            if w in failed:
                continue
            try:
                if words.load(P.word(w, P.STATUS)) == _ERROR:
                    _, packed = self._recv_raw(w, command)
                    where = f"env {packed['env_index']}" if packed["env_index"] is not None else f"worker {w}"
                    failed[w] = f"{where} raised {packed['type_name']}: {packed['message']}"
                    continue
                results[w] = self._read_result(w, words.load(P.word(w, P.RESULT_LEN)), command)
            except WorkerTimeoutError:
                # Done, but its message (protocol step 6b) did not come within the timeout: a
                # worker stopped or stuck once its command was complete.  Killed and restarted,
                # as one that does not complete the command in time.
                self._broken = None
                self._res.processes[w].kill()
                failed[w] = (f"worker {w} did not send its result within timeout={self.timeout:g} s "
                             "and was killed")
            except WorkerDiedError:
                # Died once done, before its message was out (protocol step 6b): a failure like
                # any other here.  The read marked the env broken; the restart repairs it.
                broken, self._broken = self._broken, None
                for d in self._dead_workers():
                    if d in posted and d not in failed:
                        failed[d] = self._death_reason(d)
                if w not in failed:
                    self._broken = broken
                    raise

        reset_infos = self._restart_workers(failed, command) if failed else {}
        if command == "step":
            for w, reason in failed.items():
                results[w] = self._truncated_items(w, reason, reset_infos)
            for w, (reason, infos) in fresh.items():
                results[w] = self._truncated_items(w, reason, infos)
        else:
            for w, reason in failed.items():
                results[w] = [(i, dict(reset_infos.get(i, {}), **{RESTART_INFO_KEY: reason}))
                              for i in self.slices[w]]
        self._fresh = {}
        self._warn_restarts()
        return results

    def _truncated_items(self, w: int, reason: str, reset_infos: dict[int, dict]) -> list:
        """Writes worker w's step results as truncated episodes; its (i, info, reset_info) items."""
        sl = self.slices[w]
        self._views.rew[sl.start:sl.stop] = 0.0  # no local view of the block (see _reset_restarted)
        self._views.terminated[sl.start:sl.stop] = False
        self._views.truncated[sl.start:sl.stop] = True
        write_term = make_scatter(self.observation_space, self._views.term_obs, "terminal observation")
        items = []
        for i in sl:
            last = self._obs_copy(i) if self._last_obs is None else _env_obs(self._last_obs, i)
            write_term(i, last)
            items.append((i, {RESTART_INFO_KEY: reason}, reset_infos.get(i, {})))
        return items

    # ---- rare commands ---------------------------------------------------------------------------
    def _recover_dead(self, command: str) -> None:
        """Restarts the workers found dead before a rare command; their truncation is reported at the next step."""
        dead = self._dead_workers()
        if not dead:
            return
        failed = {w: self._death_reason(w) for w in dead}
        infos = self._restart_workers(failed, command)
        for w, reason in failed.items():
            self._fresh[w] = (reason, {i: infos.get(i, {}) for i in self.slices[w]})
        self._warn_restarts()

    # ---- restarting --------------------------------------------------------------------------------
    def _dead_workers(self) -> list[int]:
        return sorted(self._sentinels[s] for s in mp_wait(list(self._sentinels), timeout=0))

    def _death_reason(self, w: int) -> str:
        res = self._res
        proc = res.processes[w]
        proc.join(_DIED_JOIN_S)  # the sentinel can be ready a moment before the exit code
        stack = res.crash_report(w)  # before _stop_worker closes its pipe
        if stack:
            self._failure_stacks[w] = stack
        return f"worker {w} died with {describe_exitcode(proc.exitcode)}{self._in_env(w)}"

    def _failure_stack(self, w: int) -> WorkerStacks | None:
        """Worker w's stack when it failed, once (``_failure_stacks``), for its warning or error."""
        stack = self._failure_stacks.pop(w, "")
        return WorkerStacks.of(stack, "when it failed")

    def _restart_workers(self, failed: dict[int, str], command: str) -> dict[int, dict]:
        """Replaces the failed workers, resets their envs; returns their reset infos by env index."""
        first = self.restarts + 1
        # All or none: the limit is checked for every failed worker before any restart is counted.
        if self.max_restarts is not None and self.restarts + len(failed) > self.max_restarts:
            w, reason = list(failed.items())[min(len(failed) - 1, max(0, self.max_restarts - self.restarts))]
            sl = self.slices[w]
            if len(failed) > 1:
                # All or none: restarting some of the failed workers would still leave the others
                # failed, and the vec env could not go on anyway.
                over = (f"; {len(failed)} workers failed in this {command}, and restarting them all would make "
                        f"{self.restarts + len(failed)} restarts")
            else:
                over = ""
            stack = self._failure_stack(w)
            self._failure_stacks.clear()
            raise broken_by(self, TooManyRestartsError(
                f"worker {w} (envs {sl.start}..{sl.stop - 1}) failed during {command} ({reason}){over}: over the "
                f"limit set by max_restarts={self.max_restarts} ({self.restarts} restarts so far). The envs keep "
                f"failing: fix them, or raise max_restarts (None: no limit). "
                + ("Its Python stack when it failed (faulthandler) is shown above. " if stack else "") + _BROKEN_HINT
            ), cause=stack)
        self.restarts += len(failed)
        step_timeout = self.timeout
        if step_timeout is not None:
            self.timeout = max(step_timeout, _RESTART_TIMEOUT_FLOOR_S)  # read by the pipe waits
        try:
            for w in failed:
                self._stop_worker(w)
            for w in failed:
                self._spawn_worker(w)
            self._sentinels = {p.sentinel: w for w, p in enumerate(self._res.processes)}
            for w in failed:
                self._handshake(w)
            for w in failed:
                self._recv(w, f"restart of worker {w}", _BROKEN_HINT)  # "ready"
            infos = self._reset_restarted(list(failed), command)
        except BaseException as exc:
            if isinstance(exc, Exception):
                reasons = "; ".join(failed.values())
                exc.add_note(f"shmvec: raised while restarting after a failure during {command} ({reasons}). "
                             + _BROKEN_HINT)
            if self._broken is None:  # after the note: _broken keeps a copy
                self._broken = exc
            raise
        finally:
            self.timeout = step_timeout
        # Warned by the caller once its bookkeeping is done: a warning turned into an error
        # (-W error) must not lose the truncation report of envs that were restarted.
        self._unwarned.append((first, dict(failed), command))
        return infos

    def _warn_restarts(self) -> None:
        """Emits the WorkerRestartWarning of each restart since the last call."""
        pending, self._unwarned = self._unwarned, []
        for first, failed, command in pending:
            self._warn_restarted(first, failed, command)

    def _warn_restarted(self, first: int, failed: dict[int, str], command: str) -> None:
        limit = "no limit" if self.max_restarts is None else f"max_restarts={self.max_restarts}"
        report = {
            "step": f"their episodes end as truncated, with info[{RESTART_INFO_KEY!r}] saying why",
            "reset": f"reset_infos[i][{RESTART_INFO_KEY!r}] says why",
        }.get(command, f"the next step reports their episodes as truncated, with info[{RESTART_INFO_KEY!r}]")
        for count, (w, reason) in enumerate(failed.items(), start=first):
            sl = self.slices[w]
            stack = self._failure_stack(w)
            warnings.warn(
                f"shmvec: worker {w} (envs {sl.start}..{sl.stop - 1}) failed during {command} ({reason}) and was "
                f"restarted (restart {count}, {limit}); its envs were rebuilt and reset, and {report}."
                + ("" if stack is None else f" Its Python stack when it failed (faulthandler):\n{stack.tb}"),
                WorkerRestartWarning, stacklevel=user_stacklevel(),
            )

    def _stop_worker(self, w: int) -> None:
        res = self._res
        proc, conn = res.processes[w], res.conns[w]
        if proc.is_alive():  # an env raised: let the worker close its envs, then insist
            words = self._words
            self._seq[w] = (self._seq[w] + 1) & 0xFFFFFFFF
            words.store(P.word(w, P.CMD), P.Cmd.CLOSE)
            words.store(P.word(w, P.CMD_SEQ), self._seq[w])
            words.wake(P.word(w, P.CMD_SEQ))
            proc.join(_STOP_JOIN_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(_TERMINATE_JOIN_S)
            if proc.is_alive():
                proc.kill()
        proc.join()
        try:
            while conn.poll(0):
                conn.recv_bytes()  # an error it had sent, or its "closed" message: nobody waits for them
        except (EOFError, OSError):
            pass
        conn.close()
        res.crash_conns[w].close()
        proc.close()
        # A worker killed in its futex wait stays counted as a sleeper: the count starts afresh.
        self._words.store(P.word(w, P.CMD_SLEEPERS), 0)

    def _spawn_worker(self, w: int) -> None:
        self._launch(w)  # on the same cores as the worker it replaces

    def _handshake(self, w: int) -> None:
        res = self._res
        what = f"restart of worker {w}"
        obs_space, act_space, *_ = self._recv(w, what, _BROKEN_HINT)
        for name, mine, ours in (("observation_space", obs_space, self.observation_space),
                                 ("action_space", act_space, self.action_space)):
            if mine != ours:
                raise SpaceError(f"env {self.slices[w].start} was rebuilt with {name} {mine}, the vec env has "
                                 f"{ours}: its factory must build envs with the same spaces every time.")
        layout = self._layout
        conn = res.conns[w]
        conn.send(("attach_fd", (layout.n_envs, self.n_workers, layout.mailbox_bytes, layout.mask_size,
                                 self._masks_live)))
        reduction.send_handle(conn, res.shm._fd, res.processes[w].pid)

    def _reset_restarted(self, workers: list[int], command: str) -> dict[int, dict]:
        """RESET to the given workers only (with the last reset's arguments for a failed reset)."""
        words = self._words  # no local view of the block: a traceback would keep it mapped after close()
        what = f"reset after restarting workers {workers}"
        self._arm_early_wake(P.Cmd.RESET)
        words.store(P.PENDING, len(workers))
        in_pipe: dict[int, bytes] = {}
        for w in workers:
            arg = self._reset_args.get(w) if command == "reset" else None
            arg_len = len(arg) if arg else 0
            if arg and arg_len >= self._layout.mailbox_bytes:
                in_pipe[w], arg_len = arg, P.ARG_IN_PIPE
            elif arg:
                self._views.mailbox[w, :arg_len] = memoryview(arg)
            words.store(P.word(w, P.ARG_LEN), arg_len)
            self._seq[w] = (self._seq[w] + 1) & 0xFFFFFFFF
            words.store(P.word(w, P.CMD), P.Cmd.RESET)
            words.store(P.word(w, P.CMD_SEQ), self._seq[w])
            words.wake(P.word(w, P.CMD_SEQ))
        self._send_args(in_pipe, what)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        pending = words.load(P.PENDING)
        while pending != 0:
            value = words.wait_while(P.PENDING, pending, P.POLL_S, 0.0, P.PARENT_SLEEPERS)
            if value is not None:
                pending = value
                continue
            self._check_workers_alive(what, workers)  # another worker found dead: the next command's
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerTimeoutError(f"{what}: no answer within {self.timeout:g} s. {_BROKEN_HINT}")
            pending = words.load(P.PENDING)
        infos: dict[int, dict] = {}
        error: BaseException | None = None
        for w in workers:
            if words.load(P.word(w, P.STATUS)) == _ERROR:
                _, packed = self._recv_raw(w, what)
                error = error or unpack_exception(packed, _BROKEN_HINT)
                continue
            infos.update(self._read_result(w, words.load(P.word(w, P.RESULT_LEN)), what))
            # Read: a worker left out of the next STEP (restarted before a rare command) keeps these
            # words until its next command, and a pipe result must not be read twice (close()).
            words.store(P.word(w, P.RESULT_LEN), 0)
        if error is not None:
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and self) through its traceback
        return infos


def _env_obs(batch: Any, i: int) -> Any:
    """Env i's observation in a batch (Dict and Tuple spaces nest)."""
    if isinstance(batch, dict):
        return {key: _env_obs(value, i) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_env_obs(value, i) for value in batch)
    return batch[i]
