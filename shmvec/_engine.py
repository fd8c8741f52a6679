"""The engine: workers stepping slices of envs in shared memory, driven through the shared words.

An :class:`Engine` is what every front-end holds (:class:`shmvec.ShmVecEnv` for SB3,
:class:`shmvec.ShmVectorEnv` for Gymnasium, the pools).  It owns its parts, each in a module of
its own:

- :class:`shmvec._options.Options`: the checked constructor options;
- :class:`shmvec._workers.WorkerSet`: processes, pipes, the shared block, deaths, release;
- :class:`shmvec._link.Links`: the parent's end of the shared words, one link per worker (every
  post, the wait on PENDING, every read of an answer; ``WorkerSet.links``);
- :class:`shmvec._channel.Channel`: the pipes (handshakes, large arguments and results, rare commands);
- :class:`shmvec._restarts.Restarts`: ``on_failure="restart"`` (absent otherwise), which sees the
  engine through a :class:`shmvec._restarts.RestartHost`;
- :class:`shmvec._calls.RareCalls`: the rare-call path (``call``, ``call_async``, ``call_wait``);
- :class:`shmvec._placement.Placement`: where the workers run, spread or packed off the parent's
  core, chosen by measuring both (absent where the user placed them or no worker shares its core);
- :class:`shmvec._state.Status`: the parent's single state (its diagram is there).

The engine decides what a command does to that state: :meth:`post` has the links post a command
to every worker (and decides what an interrupted post leaves: nothing sent, in flight, or broken),
:meth:`complete` has them wait for PENDING to reach zero (checking every ``POLL_S`` that the
workers are alive and in time) and read each worker's answer, and the observations, rewards and
flags stay in :attr:`views` for the front-end to turn into its own return values.  The front-ends'
own APIs are theirs (SB3's infos, Gymnasium's batching, the seeds policy); the engine holds only
what they share, SB3's ``indices`` convention for rare calls among it (:meth:`indices`, the rule of
:func:`shmvec._seeds.env_indices`).

The door.  A front-end holds an engine and uses only its public surface, never a part
(``Engine.PARTS``: ``tests/units/test_layers.py`` fails on ``engine.<part>`` in a front-end):

- the calls: :meth:`post_step`, :meth:`complete_step`, :meth:`finish_step` (and :meth:`post` of
  a STEP for SB3's short way), :meth:`reset`, :meth:`reset_wait`, ``call``,
  ``call_async``, ``call_wait`` (those of :class:`shmvec._calls.RareCalls`), :meth:`start_pool`,
  :meth:`stop_pool` (and :meth:`complete` of "pool" in a pool's close), :meth:`close`, :meth:`closing`;
- the state, read: ``lock``, ``state``, ``closed``, ``waiting``, ``in_flight_call``, ``failure``,
  ``serving_pool`` (the :class:`shmvec._state.Status` fields, read through C getters: no Python
  frame on the step path), and checked: ``check_usable``, :meth:`check_idle`,
  ``check_poster``; changed only by a failure a front-end finds: ``fail``, :meth:`record`;
- the workers: ``check_alive`` (dead ones raise), :meth:`stuck` (where late ones are, and their
  stacks), :attr:`restarted`;
- the values in the block: :meth:`obs_out`, :meth:`obs_buffers`, ``obs_view``, ``term_obs``,
  ``term_leaf``, ``term_buffers``, ``rewards``, ``terminated``, ``truncated``, ``mask_buffer``
  (views of the block, None once closed), ``write_rows`` (a pool's rows of actions), and
  ``step_actions`` (SB3's short way);
- the facts: ``num_envs``, ``n_workers``, ``slices``, ``owner``, ``timeout``, the spaces,
  ``metadata``, ``descriptions``, ``zero_copy``, ``fixed_size``, ``masks_in_shm``,
  ``masks_live``, and ``options``.

``options`` is data, not a part: the checked constructor options, a frozen record
(:class:`shmvec._options.Options`) that nothing changes after the engine is built and that acts
on nothing; the front-ends publish its values as their own attributes and ``describe()`` reads it
whole (:meth:`explain` adds what the engine decided), so an accessor per option would only repeat
it.  The parts are objects that act (on the workers, the block or the state): the door names
what the front-ends need of them.  Bound methods of a part (``fail``, ``check_poster``,
``check_alive``, ``write_rows``) are bound once, at construction: the door costs no call frame.

Start-up: the workers are launched in parallel; handshake 1 gets each one's spaces (no env is
ever built in the parent), the block is laid out (:mod:`shmvec._layout`) and created; handshake
2 has every worker attach, then the block's name is unlinked, so that no segment outlives a
killed parent.  Each worker registers the parent's env registrations it lacks before it builds its
envs (:mod:`shmvec._registrations`; spawn and forkserver only).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import pickle
from threading import get_ident
import time
import weakref
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec import _protocol as P
from shmvec._actions import ActionWriter
from shmvec._calls import RareCalls, check_idle, gave_up
from shmvec._channel import Channel
from shmvec._errors import (
    NoAsyncCallError,
    WorkerDiedError,
    WorkerStacks,
    WorkerTimeoutError,
    caused,
    describe_exitcode,
    envs_named,
    unpack_exception,
)
from shmvec._describe import describe_env_fns
from shmvec._layout import make_gather, scalar_float_box
from shmvec._leases import Leases
from shmvec._link import Links
from shmvec._machine import start_forkserver
from shmvec._options import Options
from shmvec._pickled_leaves import pickled_leaves
from shmvec._pickling import pickle_factories
from shmvec._placement import Placement, placement_for
from shmvec._registrations import pack_registrations
from shmvec._restarts import RestartHost, Restarts
from shmvec._seeds import env_indices
from shmvec._state import COLLECTING, CONSUMED, DONE, IDLE, POOLING, POSTED, RESETTING, Status, record
from shmvec._threads import Decision, decide, release
from shmvec._sync import current_cpu
from shmvec._workers import BROKEN_HINT, CLOSE_JOIN_S, WorkerSet

_STEP = int(P.Cmd.STEP)
# Starting a worker imports its modules and builds its envs: a step-sized timeout is too short.
START_TIMEOUT_FLOOR_S = 60.0


class Engine:
    """Workers, shared memory and the shared-word protocol (see the module docstring).

    :param env_fns: the factories; ``options`` as :meth:`shmvec._options.Options.build` takes them.
    """

    # The parts: no front-end reaches them (the module docstring, "The door"; tests/units/test_layers.py).
    PARTS = ("status", "workers", "links", "channel", "restarts", "actions", "leases", "views", "layout", "pickled",
             "threads", "registrations", "calls", "words", "seqs", "placement")

    # The state, read through C getters (no Python frame: the step's short way reads lock and state).
    lock = property(attrgetter("status.lock"), doc="The lock every public call of a front-end holds.")
    state = property(attrgetter("status.state"), doc="The parent's :class:`shmvec._state.State`.")
    closed = property(attrgetter("status.closed"))
    waiting = property(attrgetter("status.waiting"), doc="A step is in flight.")
    in_flight_call = property(attrgetter("status.in_flight_call"))
    failure = property(attrgetter("status.failure"), doc="What broke the engine, or None.")
    serving_pool = property(attrgetter("status.serving_pool"))

    # Class-level defaults: close() is safe on a half-built engine.
    status = Status.__new__(Status)  # CLOSED, with no failure (Status's class-level defaults)
    workers: WorkerSet | None = None
    links: Links | None = None  # the parent's end of the control words (WorkerSet.links)
    restarts: Restarts | None = None
    views: Any = None
    step_actions: tuple | None = None  # the step's short way, when the spaces allow it
    done_step: list[list] | None = None  # the items of the step in flight once read (state DONE)
    calls: RareCalls | None = None  # the rare-call path (shmvec._calls), whose call() etc. are the engine's
    actions: ActionWriter | None = None
    leases: Leases | None = None  # zero_copy's lease blocks (shmvec._leases), when on
    masks_in_shm = False  # whether the workers write action masks into shared memory (``action_masks``)
    threads: Decision | None = None  # the parent's torch threads (shmvec._threads), decided once torch is loaded
    placement: Placement | None = None  # where the workers run (shmvec._placement), where it is measured
    parent_spin_s = 0.0  # the parent's spin while it waits: the options', or the placement's
    # Views of the block for the front-ends (None once closed): the step's outcome, the terminal
    # observations' and the masks' buffers; a pool's rows of actions (ActionWriter.write_rows).
    rewards = terminated = truncated = term_buffers = mask_buffer = write_rows = None
    zero_copy = False  # observations handed out without a copy (the zero_copy option, resolved)
    fixed_size = True  # every leaf has a buffer (none travels pickled: shmvec._pickled_leaves)

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, batch_dict: type = collections.OrderedDict,
                 pickled_batch: Callable[[list], Any] = tuple, observation_mode: Any = None,
                 **options: Any) -> None:
        self.status = status = Status(options.get("public_name", "ShmVecEnv"))
        # (bound once: see "The door"; check_usable raises ClosedVecEnvError or BrokenVecEnvError)
        self.fail, self.check_poster, self.check_usable = status.fail, status.check_poster, status.check_usable
        self.observation_mode = observation_mode  # None (SB3's faces), "same", "different" or a space
        opts, env_fns = Options.build(env_fns, **options)
        self.options = opts
        if opts.start_method == "forkserver":  # the main module and our worker modules imported there once
            start_forkserver(opts.preload)
        # Plain-data descriptions of the factories (or why there is none); the factories are not kept.
        self.descriptions = describe_env_fns(env_fns)
        self.slices = opts.slices
        self.n_workers = opts.n_workers
        self.timeout = opts.timeout
        self.owner = [w for w, sl in enumerate(self.slices) for _ in sl]  # env index -> its worker
        self.masks_live = opts.action_masks is True  # workers write masks (None: from the first ask)
        self._batch_dict = batch_dict  # a Dict observation batch: OrderedDict (SB3) or dict (Gymnasium)
        payloads = [pickle_factories(env_fns, sl) for sl in self.slices]
        self.registrations = pack_registrations(opts.start_method)  # the env ids a fresh worker lacks
        self.workers = workers = WorkerSet(opts, payloads, self.registrations.data)
        self._finalizer = weakref.finalize(self, workers.release)
        self.channel = Channel(workers, status, max(opts.timeout, START_TIMEOUT_FLOOR_S)
                               if opts.timeout is not None else None)
        self.check_alive = self.channel.check_alive  # (command): raises WorkerDiedError for a dead worker
        try:
            self._start(pickled_batch)  # pickled_batch: a tuple (Gymnasium), np.stack (SB3)
        except BaseException as exc:
            status.close()
            if isinstance(exc, WorkerTimeoutError):
                workers.release(polite=False)  # a worker stuck in a factory would not answer CLOSE either
            self._finalizer()
            raise
        finally:
            self.channel.timeout = opts.timeout
        if opts.restart:
            self.restarts = Restarts(RestartHost.of(self))
        self.calls = calls = RareCalls(status, self.channel, self.restarts, self.slices, self.num_envs)
        self.call, self.call_async, self.call_wait = calls.call, calls.call_async, calls.call_wait  # (the door)
        status.enter(IDLE)
        self.threads = decide(Decision(opts.parent_threads), self.n_workers, opts.public_name)
        self.parent_spin_s = opts.parent_spin_s
        self._placement_plan, self.placement = placement_for(opts, workers.pids, self)
        if self.placement is not None:  # torch's threads are lent only while no placement trial runs
            self.threads.calm = self.placement.calm

    # ---- start-up -----------------------------------------------------------------------------------
    def _start(self, pickled_batch: Callable[[list], Any]) -> None:
        workers = self.workers
        assert workers is not None
        layout, metadata = workers.start(self.channel, self.masks_live, self.registrations.left_out,
                                         self.observation_mode)
        self.env_observation_spaces = workers.observation_spaces
        obs_space, act_space = layout.observation_space, layout.action_space
        self.links = links = workers.links
        assert workers.shm is not None and links is not None
        self.layout, self.num_envs, self.masks_in_shm = layout, layout.n_envs, layout.mask_size > 0
        self.observation_space, self.action_space, self.metadata = obs_space, act_space, metadata
        views = self.views = workers.views = layout.views(workers.shm.buf)
        links.use_mailbox(views.mailbox)
        self.pickled = pickled = pickled_leaves(layout, views, self.slices, self.options.restart)  # None: plain
        self.fixed_size = pickled is None
        self.rewards, self.terminated, self.truncated = views.rew, views.terminated, views.truncated
        self.term_buffers, self.mask_buffer = views.term_obs, views.mask
        self.obs_view = make_gather(obs_space, views.obs, copy=False, top_dict=self._batch_dict, batch=pickled_batch)
        self.obs_copy = make_gather(obs_space, views.obs, copy=True, top_dict=self._batch_dict, batch=pickled_batch)
        self.term_obs = make_gather(obs_space, views.term_obs, copy=True)
        self.actions = ActionWriter(act_space, layout.act_leaves, views.act, layout.n_envs,
                                    self.options.invalid_actions, pickled and pickled.for_actions(links))
        self.write_rows = self.actions.write_rows
        # The step's short way for the usual spaces: one observation leaf (a Box, Discrete, ...)
        # and one action leaf whose batch copy_actions checks and copies in one C call.
        single_obs = list(views.obs) == [()] and not layout.obs_pickled
        self.obs_leaf = views.obs[()] if single_obs else None
        # (Not a scalar float Box: its row would come back a numpy scalar; term_obs gives a 0-d array.)
        self.term_leaf = views.term_obs[()] if single_obs and not scalar_float_box(obs_space) else None
        self.step_actions = self.actions.single
        if layout.obs_blocks:
            self.leases = Leases(layout, views, workers.block_fd(), self._batch_dict)
            self.zero_copy = True

    # ---- facts ------------------------------------------------------------------------------------
    def check_idle(self, what: str) -> None:
        """Usable, and nothing in flight (else AlreadyPendingCallError: a step, reset_async, call_async, a pool)."""
        check_idle(self.status, what)

    def obs_out(self, copy: bool = True) -> Any:
        """The observations of the last step or reset: arrays of the caller's own (a copy, or a
        lease block: shmvec._leases), or with ``copy=False`` views of the shared buffers."""
        leases = self.leases
        if leases is not None and leases.block:
            return leases.value()
        if not copy:
            return self.obs_view(slice(None))
        return self.obs_leaf.copy() if self.obs_leaf is not None else self.obs_copy(slice(None))

    def record(self, exc: BaseException, cause: BaseException | None = None) -> BaseException:
        """``exc`` recorded as what broke the engine, to be raised (:func:`shmvec._state.record`)."""
        return record(self.status, exc, cause)

    def stuck(self, workers: Sequence[int]) -> tuple[list[int | None], WorkerStacks | None]:
        """Where each of ``workers`` is (the env it steps, by its ENV_AT word: a hint, or None) and
        their Python stacks (faulthandler, or None): what a timeout reports."""
        return [self.workers.env_of(w) for w in workers], self.workers.stacks(workers)

    @property
    def restarted(self) -> int:
        """Workers restarted so far (``on_failure="restart"``; 0 otherwise)."""
        return 0 if self.restarts is None else self.restarts.count

    def explain(self) -> dict[str, Any]:
        """What the engine decided and why (``describe()["decided"]``): the options', the parent's threads."""
        return self.options.explain() | {"parent_threads": self.threads.as_dict(),
                                         "placement": (self.placement or self._placement_plan).as_dict()}

    def obs_buffers(self) -> tuple[dict, bool]:
        """The buffers (by leaf path) of the observations of the last step or reset, and whether
        they are a lease block (zero_copy, shmvec._leases: the caller may keep them uncopied)."""
        leases, views = self.leases, self.views
        block = leases.block if leases is not None else 0
        return views.obs_blocks[block], bool(block)

    # ---- the step -----------------------------------------------------------------------------------
    def post_step(self, actions: Any, checked: bool = False) -> None:
        """Writes ``actions`` into shared memory and starts every worker (state POSTED).
        ``checked``: a batch the front-end checked already (:meth:`ActionWriter.write`).

        :raises ValueError: the actions do not fit (``InvalidActionError``: NaN or out of range).
        :raises AlreadyPendingCallError: a step is already in flight.
        """
        check_idle(self.status, "step_async")
        in_pipe = self.actions.write(actions, checked)  # pickled actions too large for a mailbox (None: none)
        try:  # (restarted envs that await their truncation report are not stepped)
            self.post(P.Cmd.STEP, skip=self.restarts.fresh if self.restarts is not None else ())
            if in_pipe:
                self.channel.send_args(in_pipe, "step", False)
        except BaseException as exc:  # posted with actions still to send: the step cannot be collected
            if in_pipe:
                self.status.fail(exc)
            raise

    def complete_step(self, timeout: float | None = None) -> list[list]:
        """The workers' items of the step in flight: waits for them the first time (state DONE
        after), returns them again after that; :meth:`finish_step` ends the step.  Past ``timeout``:
        ``multiprocessing.TimeoutError``, and the step stays in flight (POSTED, nothing recorded).

        A Ctrl-C (any exception a signal handler raises) before or during the wait, or a
        ``KeyboardInterrupt`` while reading, leaves the step in flight, to be collected again
        (SB3's ``step_wait``; ``reset()`` and ``close()`` finish it and drop it), unless a pipe
        message was consumed (state CONSUMED) or restart mode is on (its own books): the engine is
        then broken.  So is it when the step failed, or reading its results raised an ``Exception``.
        """
        status = self.status
        if status.state is DONE:
            return self.done_step  # type: ignore[return-value]
        try:
            results = self.complete("step", None, timeout)
            self.done_step = results  # before the state: a Ctrl-C may land as complete() returns
            status.enter(DONE)
        except BaseException as exc:
            if self.done_step is not None and status.state is not DONE:  # it landed between the two
                status.enter(DONE)
            elif (status.state is CONSUMED or self.restarts is not None
                    or (status.state is COLLECTING and isinstance(exc, Exception))):
                status.fail(exc)
            elif status.state is COLLECTING:  # interrupted while reading: read again next time
                status.enter(POSTED)
            raise
        return results

    def finish_step(self) -> None:
        """The front-end has returned the step (or failed building its return): nothing in flight
        (``done_step`` is dropped by the next post)."""
        self.threads.stepped()  # the parent's gap starts (shmvec._threads); before IDLE: a Ctrl-C here loses nothing
        self.status.poster = None
        self.status.enter(IDLE)

    # ---- a pool (shmvec.env_pool: the workers serve it, state POOLING) -------------------------------
    def start_pool(self) -> None:
        """Posts POOL: every worker serves the pool (its queue, env by env) until :meth:`stop_pool`.
        POOLING from before the post: interrupted after it, the pool's close still stops the workers."""
        self.status.enter(POOLING)
        self.post(P.Cmd.POOL)

    def stop_pool(self, stop: Callable[[], None]) -> None:
        """``stop()`` tells the workers to leave the pool (the pool's STOP in each of their queues);
        waits until they have (state IDLE).  Interrupted or failed half way, the engine is broken
        (still ``serving_pool``: the pool's close sends STOP again, which a worker never reads twice)."""
        try:
            stop()
            self.complete("pool")
        except BaseException as exc:
            self.status.fail(exc)  # (complete() records what happens in its wait)
            raise
        self.status.enter(IDLE)

    # ---- reset ---------------------------------------------------------------------------------------
    def reset(self, seeds: list, options: list, mask: np.ndarray | None = None, wait: bool = True) -> list[list]:
        """Runs RESET (of the envs in ``mask``, or all) with per-env seeds and options; returns the
        workers' items.  A step left in flight is finished and dropped first.  ``wait=False``
        (``reset_async``): posts it and returns (state RESETTING); :meth:`reset_wait` collects it.

        :raises AlreadyPendingCallError: a ``reset_async`` or ``call_async`` is in flight.
        """
        self.status.check_usable()
        if self.status.waiting:  # left in flight (a Ctrl-C, or step_async() without step_wait()): dropped
            self.complete_step()
            self.finish_step()
        check_idle(self.status, "reset" if wait else "reset_async")
        decide(self.threads, self.n_workers, self.options.public_name)  # until torch is loaded
        in_pipe = write_reset_args(self, seeds, options, mask)
        try:
            if not wait:
                self.status.enter(RESETTING)
            self.post(P.Cmd.RESET)
            self.channel.send_args(in_pipe, "reset", self.restarts is not None)
            return self.complete("reset") if wait else []
        except BaseException as exc:
            # Between the three too (a Ctrl-C lands on any call): posted and not waited for, the
            # workers' counters no longer match ours.
            self.status.fail(exc)
            raise

    def reset_wait(self, timeout: float | None = None) -> list[list]:
        """The items of the reset that ``reset(wait=False)`` posted, state IDLE after; past ``timeout``,
        ``multiprocessing.TimeoutError`` and the reset stays in flight (nothing recorded).

        :raises NoAsyncCallError: no reset is in flight.
        """
        status = self.status
        status.check_usable()
        if status.state is not RESETTING:
            raise NoAsyncCallError("Calling `reset_wait` without any prior call to `reset_async`.", "reset")
        try:
            results = self.complete("reset", None, timeout)
            status.enter(IDLE)
        except BaseException as exc:
            if not isinstance(exc, multiprocessing.TimeoutError):  # (complete() records what breaks it)
                status.fail(exc)
            raise
        return results

    # ---- the shared-word protocol (through the links: shmvec._link) ------------------------------
    # Each worker's last CMD_SEQ, the control words: the links' own (a test may stand a wrapper in for the words).
    seqs = property(attrgetter("links.seqs"))
    words = property(attrgetter("links.words"), lambda self, words: setattr(self.links, "words", words))

    def arm_early_wake(self, cmd: P.Cmd) -> None:
        """Before a post: tells the workers on which core the parent will sleep (STEP only, and
        only when it does not spin), clears the early-wake flag (protocol, "Early wake"), and
        picks the block the observations go to (zero_copy)."""
        self.links.arm(current_cpu() if cmd == P.Cmd.STEP and self.parent_spin_s == 0.0 else -1)
        if self.leases is not None:  # where the observations go (block 0 without leases: never changes)
            self.leases.pick(cmd, self.links.words)

    def post(self, cmd: P.Cmd, skip: Any = ()) -> None:
        """Posts ``cmd`` to every worker but those in ``skip`` (protocol steps 1-3); a STEP enters POSTED."""
        code = int(cmd)
        targets = [w for w in range(self.n_workers) if w not in skip] if skip else None  # None: all
        begun = self.links.begun
        all_posted = False
        try:
            self.arm_early_wake(cmd)
            all_posted = self.links.post(code, targets)
            if code == _STEP:  # here, not in the caller: a Ctrl-C may land as post() returns
                lent = self.threads.posting()  # the parent's gap since the last step (shmvec._threads)
                if self.placement is not None:
                    self.placement.posting(lent)  # the period since the last post (shmvec._placement)
                self.done_step = None
                self.status.poster = get_ident()
                self.status.enter(POSTED)
            self._wake_posted(targets)
        except BaseException as exc:
            # Interrupted (Ctrl-C).  Before any worker had its command, nothing was sent (the
            # next post stores PENDING again).  Once every worker has a step, it is in flight:
            # the sleepers are woken and step_wait() collects it.  Part way (the links began a
            # post), some workers may run the command and nobody will wait for them; a next
            # command would store PENDING under them and read stale results: the engine is broken.
            if all_posted and code == _STEP and self.status.failure is None:
                if self.status.state is IDLE:
                    self.done_step = None
                    self.status.poster = get_ident()
                    self.status.enter(POSTED)
                self._wake_posted(targets)
            elif self.links.begun != begun:
                self.status.fail(exc)
            elif self.leases is not None:  # posted to none: the last observations are where they were
                self.leases.block = self.leases.previous
            raise

    def _wake_posted(self, targets: list[int] | None) -> None:
        # Wake the sleepers only once every worker has its command: a worker woken on this core
        # may take it at once, and the spinning workers must not wait for it to finish.
        self.links.wake(targets)

    def complete(self, command: str, deadline_s: float | None = None, give_up_s: float | None = None) -> list[list]:
        """Waits for PENDING to reach 0, then collects each worker's items (or error).  Past ``give_up_s``,
        workers alive: ``multiprocessing.TimeoutError``, nothing recorded (the command stays in flight)."""
        try:
            if self.restarts is not None and deadline_s is None and command in ("step", "reset"):
                return self.restarts.complete(command)
            return self._complete_or_raise(command, deadline_s, give_up_s)
        except multiprocessing.TimeoutError:
            raise  # gave up waiting (give_up_s), nothing read: only _complete_or_raise raises it
        except BaseException as exc:
            # Interrupted (KeyboardInterrupt, or any exception a signal handler raised) while the
            # workers still run the command: the counters no longer match, and a next command
            # would read stale results.  Failures found here were recorded already.  A step's
            # wait can be taken up again (step_wait()): it only reads the shared words, and the
            # mailboxes until a pipe message is consumed (complete_step() decides).
            state = self.status.state
            if not (command == "step" and deadline_s is None and self.restarts is None
                    and (state is POSTED or (state is COLLECTING and not isinstance(exc, Exception)))):
                self.status.fail(exc)
            raise

    def _complete_or_raise(self, command: str, deadline_s: float | None, give_up_s: float | None = None) -> list[list]:
        links, status = self.links, self.status
        limit = self.timeout if deadline_s is None else deadline_s
        since = time.monotonic()  # the timeout is real time: a loaded machine makes each poll longer
        poll = P.POLL_S if give_up_s is None else max(0.0, min(P.POLL_S, give_up_s))
        while not links.wait(self.parent_spin_s, poll):  # every poll: are they alive, late?
            self.channel.check_alive(command)
            if limit is not None and time.monotonic() - since >= limit:
                raise late_error(self, command, limit)
            if give_up_s is not None and links.pending != 0:
                left = give_up_s - (time.monotonic() - since)
                if left <= 0:
                    raise gave_up(command, give_up_s)
                poll = min(P.POLL_S, left)
        if status.state is POSTED:
            status.enter(COLLECTING)
        results, errors = links.collect(command, self.read_result)
        if errors:
            error = unpack_exception(errors[min(errors)], BROKEN_HINT)
            status.fail(error, first=False)
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and self) through its traceback
        return results if self.pickled is None else self.pickled.take_all(results)  # keeps the leaves' values

    def _consumed(self) -> None:
        if self.status.state is COLLECTING:
            self.status.enter(CONSUMED)  # a pipe message cannot be read twice

    def read_result(self, w: int, command: str) -> tuple[dict | None, list]:
        """Worker ``w``'s answer (:meth:`shmvec._link.Link.reply`), read through its pipe when it
        is there (the state CONSUMED first, during a step's collection)."""
        link = self.links[w]
        if link.by_pipe:
            self._consumed()
        return link.reply(command, self.channel.recv_raw)

    # ---- rare commands ---------------------------------------------------------------------------------
    def indices(self, indices: Any) -> list[int]:
        """SB3's ``VecEnv._get_indices``: None (all), an int, or an iterable of ints."""
        return env_indices(indices, self.num_envs)

    # ---- the end ------------------------------------------------------------------------------------------
    def close(self, terminate: bool = False, timeout: float | None = None) -> None:
        """Stops the workers and frees the shared memory.  Idempotent, bounded in time.

        From another thread than one waiting on the workers: that thread stops waiting (within
        ``POLL_S``, with ClosedVecEnvError), then this one takes the lock and closes.

        :param terminate: terminate the workers at once (no env's ``close()`` runs).
        :param timeout: seconds to wait for a step or ``reset_async`` in flight (default 5).
        :raises: the first exception an env's ``close()`` raised, after everything is released.
        """
        if self.status.closed:
            return
        with self.closing():
            self._close(terminate, timeout)

    def closing(self) -> contextlib.AbstractContextManager:
        """Holds the lock for a close (:meth:`shmvec._state.Status.closing`)."""
        return self.status.closing()

    def _close(self, terminate: bool = False, timeout: float | None = None) -> None:
        status = self.status
        in_flight = {POSTED: "step", COLLECTING: "step", CONSUMED: "step", RESETTING: "reset"}.get(status.state)
        if not status.close():
            return
        workers = self.workers
        if workers is None:
            return
        # Workers that timed out may be stuck in an env: do not wait for them to answer.
        polite = not isinstance(status.failure, WorkerTimeoutError) and not terminate
        if in_flight and polite:
            try:
                self._complete_or_raise(in_flight, deadline_s=CLOSE_JOIN_S if timeout is None else timeout)
            except BaseException:
                polite = False
        release(self.threads)
        if self.actions is not None:
            self.actions.release()
        if self.leases is not None:
            self.leases.release()
        self.views = self.obs_view = self.obs_copy = self.term_obs = None  # drop views before unmapping
        self.obs_leaf = self.term_leaf = self.step_actions = self.actions = self.write_rows = None
        self.rewards = self.terminated = self.truncated = self.term_buffers = self.mask_buffer = None
        errors = workers.release(polite=polite)
        self._finalizer.detach()
        if errors:
            _, packed = errors[0]
            raise unpack_exception(packed, "Everything else was released.")
        if workers.died_in_close and status.failure is None:
            # (A broken engine's workers may still be running the command that broke it: a death
            # then is not one in an env's close(), and the failure was reported already.)
            raise died_in_close(*workers.died_in_close[0], self.slices)

    def __del__(self) -> None:
        if not self.status.closed:
            try:
                self.close()
            except Exception:
                pass


def died_in_close(w: int, code: int | None, report: str, slices: Sequence[range]) -> BaseException:
    """WorkerDiedError for worker ``w``, which died during close() (exit ``code``, its crash ``report``)."""
    sl = slices[w]
    return caused(WorkerDiedError(
        f"worker {w} ({envs_named(sl)}) died during close with {describe_exitcode(code)} "
        "(in an env's close(), most likely" + ("; its Python stack is shown above" if report else "")
        + "). Everything was released anyway.",
        worker=w, env_indices=sl, exitcode=code,
    ), WorkerStacks.of(report, "when it died"))


def late_error(engine: Engine, command: str, limit: float) -> BaseException:
    """WorkerTimeoutError for the workers that have not answered ``command``, recorded."""
    workers = engine.workers
    late = engine.links.late()
    envs = [i for w in late for i in engine.slices[w]]
    at = "".join(f"; worker {w}{where}" for w in late if (where := workers.in_env(w)))
    stacks = workers.stacks(late)
    return record(engine.status, WorkerTimeoutError(
        f"{command}: workers {late} ({envs_named(envs)}{at}) did not answer within {limit:g} s. "
        + ("Where each was is shown above (faulthandler). " if stacks else "")
        + "The env may hang; call close() (it terminates them) and build a new vec env."
    ), stacks)


def write_reset_args(engine: Engine, seeds: list, options: list, mask: np.ndarray | None) -> dict[int, bytes]:
    """Writes each worker's reset arguments (its envs' seeds, options and mask, pickled; nothing
    when none is given) into its mailbox and ARG_LEN word; returns those too large for the
    mailbox, to send through the pipe once RESET is posted (protocol, step 1)."""
    links, restarts = engine.links, engine.restarts
    in_pipe: dict[int, bytes] = {}
    for w, sl in enumerate(engine.slices):
        env_seeds = seeds[sl.start:sl.stop]
        env_options = options[sl.start:sl.stop]
        has_seeds = any(s is not None for s in env_seeds)
        has_options = any(bool(o) for o in env_options)
        data = b""
        if mask is not None:
            data = pickle.dumps((env_seeds if has_seeds else None, env_options if has_options else None,
                                 mask[sl.start:sl.stop].tolist()), protocol=5)
        elif has_seeds or has_options:
            data = pickle.dumps((env_seeds if has_seeds else None, env_options if has_options else None),
                                protocol=5)
        if links[w].put_arg(data) is not None:  # sent through the pipe once posted (protocol, step 1)
            in_pipe[w] = data
        if restarts is not None:  # a worker restarted during this reset gets the same seeds and options
            restarts.reset_args[w] = data or None
    return in_pipe
