"""The worker process: serves the parent's commands on its slice of the envs.

The protocol (who writes which word, in which order) is written down in :mod:`shmvec._protocol`.
A worker is three modules:

- this one: :func:`worker_main`, the process's life (its start-up record, the two handshakes,
  ``serve``, closing), and :class:`Worker`, which maps the block and serves the commands posted
  in the control words: STEP and RESET (the step loops, one per autoreset mode, with no Python
  call per env beyond the env's own), POOL (:mod:`shmvec._pool`) and CLOSE;
- :mod:`shmvec._worker_envs`: building the slice's envs and the spaces it reports (before the block exists);
- :mod:`shmvec._worker_pipe`: its end of the pipe (every read of it, the parent watch) and the
  rare commands that come through it.

It starts from a :class:`shmvec._startup_args.WorkerStart` and attaches to the block from an
:class:`shmvec._startup_args.Attach`, whose sizes lay out the block as the parent laid it out.
These modules import nothing heavy: no SB3, no torch, unless the user's env factories import them.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import gymnasium as gym

from shmvec import _crash, _lifeline
from shmvec import _protocol as P
from shmvec._codec import encode_infos
from shmvec._containers import assembler, children
from shmvec._errors import ShmVecEnvError, pack_exception
from shmvec._layout import close_mapping, make_gather, make_scatter
from shmvec._masks import write_mask
from shmvec._pickled_leaves import WorkerLeaves
from shmvec._pickling import dumps
from shmvec._registrations import explain_not_found, register_missing
from shmvec._rows import publish_step
from shmvec._segment import FdSegment
from shmvec._startup_args import Attach, WorkerStart
from shmvec._sync import Words, current_cpu
from shmvec._worker_envs import build_envs, cap_threads, hello
from shmvec._worker_pipe import ParentWatch, recv, recv_bytes_or_give_up, serve_rare, wait_readable


class Worker:
    """One worker's envs, its views of the block and its command loop (see the module docstring)."""

    leaves: WorkerLeaves | None = None  # values of the leaves without a fixed size (shmvec._pickled_leaves)
    layout: Any = None  # the block's layout (shmvec._layout), once attached
    views: Any = None  # the block's arrays by that layout, once attached
    last_obs: list | None = None  # zero_copy: each env's last observation as the env returned it

    def __init__(self, args: WorkerStart, envs: list[gym.Env], conn: Connection, parent: ParentWatch) -> None:
        self.index = index = args.index
        self.start, self.stop = args.env_range.start, args.env_range.stop
        self.envs = envs
        self.conn = conn
        self.parent = parent
        self.spin = args.spin
        autoreset = args.autoreset
        self._current: int | None = None  # the env being worked on (``current``)
        self._env_at = P.word(index, P.ENV_AT)
        self.sleep_next = False  # this worker woke the parent early: sleep at once in the next wait
        self.outbox: Any = None  # a message kept for the pipe until the command completes (protocol step 6b)
        self.shm: SharedMemory | FdSegment | None = None
        self.words: Words | None = None
        # Autoreset (see _protocol): SAME_STEP resets a finished env within the step that ended it
        # (SB3, and Gymnasium's SAME_STEP); NEXT_STEP resets it instead of stepping it on the next
        # step; DISABLED never resets on its own.
        if autoreset not in P.AUTORESET_MODES:
            raise ValueError(f"unknown autoreset mode {autoreset!r}, expected one of {P.AUTORESET_MODES}")
        self.autoreset = autoreset
        self.step_body = {P.AUTORESET_SAME_STEP: self._step, P.AUTORESET_NEXT_STEP: self._step_next_reset,
                          P.AUTORESET_DISABLED: self._step_next_reset}[autoreset]
        self.finished = [False] * (self.stop - self.start)  # NEXT_STEP: envs to reset on the next step
        self.pool: Any = None  # the asynchronous pool's server (shmvec._pool), once attached
        self.masks: Any = None  # the action mask buffer (shmvec._masks), when the block has one
        self.masks_on = False  # write masks after every step/reset (on from the start, or at the first "action_masks" pipe command)
        self.was_reset = False  # True once a reset ran: before it the envs have no masks to write

    @property
    def current(self) -> int | None:
        """The env this worker is in (None: its own code), named by an exception it sends; each
        assignment is also stored into its ENV_AT word, for the parent to name the env if this
        process dies or hangs in it (shmvec._protocol, "How failures are noticed").  The step
        loops leave that to the observation writer, which costs no Python call per env."""
        return self._current

    @current.setter
    def current(self, i: int | None) -> None:
        self._current = i
        if self.words is not None:
            self.words.store(self._env_at, P.NO_ENV if i is None else i)

    # ---- set-up --------------------------------------------------------------------------------
    def attach(self, attach: Attach, fd: int | None = None) -> None:
        """Maps the block by name, or (a restarted worker: the name is gone) from the descriptor
        ``fd``, and lays it out from the record's sizes and this worker's own spaces."""
        env = self.envs[0]
        self.shm = SharedMemory(name=attach.shm_name) if fd is None else FdSegment(fd)
        self.layout = layout = attach.sizes.layout(env.observation_space, env.action_space)
        self.views = views = layout.views(self.shm.buf)  # (the pool reads its actions through them)
        self.masks = views.mask  # None unless the block has a mask buffer
        self.masks_on = attach.masks_live and self.masks is not None
        self.words = Words(self.shm.buf, layout.ctrl_offset, layout.ctrl_words)
        self.mailbox_bytes = layout.mailbox_bytes
        self.mailbox = memoryview(views.mailbox[self.index])
        self.rew, self.terminated, self.truncated = views.rew, views.terminated, views.truncated
        if layout.obs_pickled or layout.act_pickled:  # leaves without a fixed size: lists of values in views
            self.leaves = WorkerLeaves(layout, views, self.start, self.stop, self.autoreset == P.AUTORESET_SAME_STEP)
        # One private copy of this worker's actions per step, handed out env by env: an env
        # that keeps its action never sees the next step's.
        act_slice = make_gather(env.action_space, views.act, copy=True, batch=list)
        own = slice(self.start, self.stop)
        n = self.stop - self.start
        split = unbatcher(env.action_space)  # None: not a container (shmvec._containers)
        if split is not None:
            self.read_actions = lambda: split(act_slice(own), n)
        else:
            self.read_actions = lambda: list(act_slice(own))
        # Each observation written sets ENV_AT to the next env: the env a step loop is in.  One
        # writer per observation block; each command's OBS_BLOCK word picks one (shmvec._leases).
        self.obs_writers = [make_scatter(env.observation_space, block, "observation", (self.words, self._env_at))
                            for block in views.obs_blocks]
        if layout.obs_blocks:  # zero_copy: the step and reset loops keep each env's last observation (shmvec._leases)
            self.last_obs = [None] * (self.stop - self.start)
        self.write_obs = self.obs_writers[0]
        self.write_term = make_scatter(env.observation_space, views.term_obs, "observation")
        if layout.act_pickled:  # the step's pickled actions come first (shmvec._pickled_leaves)
            read_actions = self.read_actions
            self.read_actions = lambda: (self._load_actions(), read_actions())[1]
        if layout.obs_pickled:  # the step's result carries the pickled observation values
            body, leaves = self.step_body, self.leaves
            self.step_body = lambda: leaves.message(body(), self.terminated, self.truncated)
        # The last command seen, read before this worker reports "ready": the parent posts nothing
        # before every worker is ready, and may post the first command before serve() starts.
        self.seen = self.words.load(P.word(self.index, P.CMD_SEQ))

    def detach(self) -> None:
        if self.pool is not None:
            self.pool.detach()
            self.pool = None
        self.read_actions = self.write_obs = self.write_term = None  # type: ignore[assignment]
        self.obs_writers = []
        self.views = None
        self.leaves = None
        self.rew = self.terminated = self.truncated = None  # type: ignore[assignment]
        self.masks = None
        if getattr(self, "mailbox", None) is not None:
            self.mailbox.release()
            self.mailbox = None  # type: ignore[assignment]
        if self.words is not None:
            self.words.release()
            self.words = None
        if self.shm is not None:
            close_mapping(self.shm)
            self.shm = None

    # ---- main loop -------------------------------------------------------------------------------
    def serve(self) -> None:
        words = self.words
        assert words is not None
        seq_word = P.word(self.index, P.CMD_SEQ)
        sleepers_word = P.word(self.index, P.CMD_SLEEPERS)
        seen = self.seen  # not a fresh load: a command posted since "ready" would be missed
        # Adaptive spinning: spin (yielding the core between bursts) only while the parent
        # usually answers within the spin budget, as in a tight stepping loop.  When it
        # usually takes longer (a policy forward pass between steps), sleep on the futex at
        # once: the wake-up latency is then small beside the gap, and a spinning worker would
        # only slow the parent's own work down.
        budget = self.spin
        idle_ema = 0.0
        clock = time.perf_counter
        while True:
            idle_from = clock()
            spin = budget if idle_ema < budget else P.MIN_SPIN_S
            if self.sleep_next:  # the parent spins on this core until the step ends: leave it the core
                spin, self.sleep_next = 0.0, False
            elif idle_ema > P.PARENT_COMPUTES_S and words.load(P.PARENT_CPU) == current_cpu():
                spin = 0.0  # the parent computes on this core between steps (a policy): leave it the core
            value = words.wait_while(seq_word, seen, P.PARENT_POLL_S, spin, sleepers_word)
            if value is None:
                idle_ema = P.PARENT_POLL_S
                if not self.parent.alive():
                    return
                continue
            idle_ema += 0.25 * ((clock() - idle_from) - idle_ema)
            seen = value
            cmd = words.load(P.word(self.index, P.CMD))
            if cmd == P.Cmd.STEP:
                self._sync_command(seen, "step", self.step_body)
            elif cmd == P.Cmd.RESET:
                self._sync_command(seen, "reset", lambda seq=seen: self._reset(seq))
            elif cmd == P.Cmd.POOL:
                self._sync_command(seen, "pool", lambda seq=seen: self.pool.run(seq))
            elif cmd == P.Cmd.PIPE:
                serve_rare(self, seen)  # shmvec._worker_pipe
            elif cmd == P.Cmd.CLOSE:
                return
            else:
                raise ShmVecEnvError(f"worker {self.index}: unknown command code {cmd}")

    def _sync_command(self, seq: int, name: str, body: Any) -> None:
        words = self.words
        assert words is not None
        status, result_len = P.Reply.OK, 0
        # ENV_AT: the slice's first env; the step loops' write_obs moves it on, env by env.
        words.store(self._env_at, self.start)
        self.write_obs = self.obs_writers[words.load(P.OBS_BLOCK)]  # where this command's observations go
        try:
            result_len = self._put_result(body())
        except BaseException as exc:  # an env's sys.exit() too: the parent decides what it means
            status, result_len = P.Reply.ERROR, 0
            self.outbox = (P.Pipe.ERROR, pack_exception(exc, env_index=self.current, worker=self.index, command=name))
        if self._current is not None:
            self.current = None
        words.store(P.word(self.index, P.STATUS), status)
        words.store(P.word(self.index, P.RESULT_LEN), result_len)
        words.store(P.word(self.index, P.DONE_SEQ), seq)
        if words.fetch_add(P.PENDING, -1) == 1:
            words.wake_sleepers(P.PENDING, P.PARENT_SLEEPERS)
        elif words.load(P.PARENT_CPU) == current_cpu() and words.load(P.word(self.index, P.CMD_SEQ)) == seq:
            # Early wake: the parent sleeps on this core and others still step.  Wake it now (a
            # wake-up on the same core, no inter-processor interrupt) and sleep, so that it spins
            # here and sees the last worker finish without being woken across cores.  (If the
            # parent has already posted the next command, PARENT_CPU is the next step's: skip.)
            words.store(P.EARLY_WAKE, 1)
            words.wake_sleepers(P.PENDING, P.PARENT_SLEEPERS)
            self.sleep_next = True
        if self.outbox is not None:
            # Step 6b: only now, as the parent reads pipes only once PENDING is 0 (a message
            # larger than the socket's buffer would block here until it does).
            out, self.outbox = self.outbox, None
            if isinstance(out, bytes):
                self.conn.send_bytes(out)
            else:
                self.conn.send(out)

    def _put_result(self, items: list) -> int:
        """Writes the command's non-empty infos into the mailbox; returns RESULT_LEN.

        The info codec first (``shmvec._codec.encode_infos``: no pickler; timed in a worker,
        cheaper than ``pickle.dumps``: docs/design.md); a value it does not
        carry, or a message too large for the mailbox, is pickled (the pickle is smaller: its
        memo shares repeated keys), and a pickle too large for the mailbox goes through the pipe.
        """
        if not items:
            return 0
        n = encode_infos(items, self.mailbox)
        if n > 0:
            return n
        try:
            data = dumps(items)
        except Exception:
            # Name the env whose info (or observation, for leaves without a fixed size) cannot be sent.
            parts = self.leaves.per_env(items) if type(items) is tuple else [(item[0], item) for item in items]
            for i, part in parts:
                self.current = i
                dumps(part)
            raise
        n = len(data)
        if n < self.mailbox_bytes:
            self.mailbox[:n] = data
            return n
        self.outbox = data  # sent after the command completes (protocol step 6b)
        return P.RESULT_IN_PIPE

    def _arg(self, give_up: Any, what: str) -> Any:
        """The posted command's argument bytes (None: none): the mailbox's first ARG_LEN, or the
        pipe's message when it was larger (ARG_IN_PIPE), giving up once ``give_up()`` is true."""
        arg_len = self.words.load(P.word(self.index, P.ARG_LEN))
        if arg_len != P.ARG_IN_PIPE:
            return self.mailbox[:arg_len] if arg_len else None
        data = recv_bytes_or_give_up(self.conn, self.parent, give_up)
        if data is None:
            raise ShmVecEnvError(f"{what} abandoned: the parent stopped sending its arguments (interrupted)")
        return data

    def _load_actions(self) -> None:
        """The step's pickled action values (shmvec._pickled_leaves), read first.  A CLOSE posted
        meanwhile (the parent was interrupted before it sent them) ends the wait."""
        words, cmd_word, seq_word = self.words, P.word(self.index, P.CMD), P.word(self.index, P.CMD_SEQ)
        seq = words.load(seq_word)
        self.leaves.load_actions(self._arg(lambda: words.load(cmd_word) != P.Cmd.STEP
                                           or words.load(seq_word) != seq, "step"))

    def _step(self) -> list:
        start = self.start
        write_obs, write_term, keep = self.write_obs, self.write_term, self.last_obs
        rews, terms, truncs, items = [], [], [], []
        add_rew, add_term, add_trunc = rews.append, terms.append, truncs.append
        i = start
        try:
            for i, env, action in zip(range(start, self.stop), self.envs, self.read_actions()):
                obs, rew, term, trunc, info = env.step(action)
                add_rew(rew)
                add_term(term)
                add_trunc(trunc)
                if term or trunc:
                    write_term(i, obs)
                    obs, reset_info = env.reset()
                    if info or reset_info:
                        items.append((i, info, reset_info))
                elif info:
                    items.append((i, info, None))
                write_obs(i, obs)
                if keep is not None:  # zero_copy: the object itself, for a partial reset
                    keep[i - start] = obs
        except BaseException:
            self.current = i
            raise
        self._publish_slice(rews, terms, truncs)
        return items

    def _publish_slice(self, rews: list, terms: list, truncs: list) -> None:
        """The slice's rewards and flags in one write each, then its masks (both step bodies)."""
        start, stop = self.start, self.stop
        if not publish_step(self.rew, self.terminated, self.truncated, start, rews, terms, truncs):
            try:
                self.rew[start:stop] = rews  # numpy scalars and other types: numpy converts (or raises)
                self.terminated[start:stop] = terms
                self.truncated[start:stop] = truncs
            except Exception:
                # Env by env, as DummyVecEnv stores them: numpy takes a value a batch could not
                # hold (a flag or reward as a one-element array), or raises naming the env.
                for j, values in enumerate(zip(rews, terms, truncs)):
                    self.current = start + j
                    self.rew[start + j], self.terminated[start + j], self.truncated[start + j] = values
                self.current = None
        if self.masks_on:
            self.write_masks(range(start, stop))

    def write_masks(self, indices: Any) -> None:
        """Each env's action_masks() into the mask buffer (after its step/reset, see shmvec._masks)."""
        for i in indices:
            self.current = i
            write_mask(self.masks, i, self.envs[i - self.start])
        self.current = None

    def _step_next_reset(self) -> list:
        """NEXT_STEP autoreset: an env that finished on the previous step is reset, not stepped
        (its action is ignored, its reward is 0 and its flags False; its info is the reset info).
        DISABLED: the same, but nothing is marked finished (the parent resets ended envs)."""
        write_obs, finished, keep = self.write_obs, self.finished, self.last_obs
        next_step = self.autoreset == P.AUTORESET_NEXT_STEP
        rews, terms, truncs, items = [], [], [], []
        i = self.start
        try:
            for j, (env, action) in enumerate(zip(self.envs, self.read_actions())):
                if finished[j]:
                    obs, info = env.reset()
                    rew, term, trunc = 0.0, False, False
                else:
                    obs, rew, term, trunc, info = env.step(action)
                finished[j] = next_step and bool(term or trunc)
                rews.append(rew)
                terms.append(term)
                truncs.append(trunc)
                if info:
                    items.append((i, info, None))
                write_obs(i, obs)
                if keep is not None:
                    keep[j] = obs
                i += 1
        except BaseException:
            self.current = i
            raise
        self._publish_slice(rews, terms, truncs)
        return items

    def _reset(self, seq: int) -> list:
        """RESET (seq: its CMD_SEQ, to see a CLOSE posted while a piped argument is read)."""
        words = self.words
        assert words is not None
        seq_word = P.word(self.index, P.CMD_SEQ)  # an argument larger than the mailbox comes through the pipe
        data = self._arg(lambda: words.load(seq_word) != seq, "reset")
        args = pickle.loads(data) if data is not None else (None, None)
        seeds, options = args[0], args[1]
        mask = args[2] if len(args) > 2 else None  # reset only these envs (Gymnasium's reset_mask)
        items = []
        last_obs = self.last_obs
        for j, env in enumerate(self.envs):
            if mask is not None and not mask[j]:
                if last_obs is not None and last_obs[j] is not None:  # zero_copy: a new block gets every env
                    self.write_obs(self.start + j, last_obs[j])
                continue
            self.finished[j] = False
            i = self.current = self.start + j
            seed = seeds[j] if seeds is not None else None
            opts = options[j] if options is not None else None
            obs, reset_info = env.reset(seed=seed, **({"options": opts} if opts else {}))
            self.write_obs(i, obs)
            if last_obs is not None:  # zero_copy
                last_obs[j] = obs
            if reset_info:
                items.append((i, reset_info))
        self.current = None
        self.was_reset = True
        if self.masks_on:
            self.write_masks(range(self.start, self.stop))
        # With pickled observation leaves the result carries every env's values (shmvec._pickled_leaves).
        return items if self.leaves is None or not self.leaves.obs else self.leaves.message(items, None, None)

    def close_envs(self) -> BaseException | None:
        first: BaseException | None = None
        for j, env in enumerate(self.envs):
            try:
                env.close()
            except Exception as exc:
                if first is None:
                    self.current = self.start + j
                    first = exc
        return first


def unbatcher(space: gym.spaces.Space) -> Any:
    """``split(batch, n)``, which splits a batched container value into n per-env values (built
    once, by the container kinds of shmvec._containers); None for a space that is no container."""
    kids = children(space)
    if kids is None:
        return None
    build = assembler(space)
    subs = [(key, unbatcher(sub)) for key, sub in kids]

    def split(batch: Any, n: int) -> list:
        parts = [list(batch[key]) if sub is None else sub(batch[key], n) for key, sub in subs]
        return [build([part[j] for part in parts]) for j in range(n)]

    return split


def worker_main(args: WorkerStart, conn: Connection, crash: Connection) -> None:
    """Entry point of a worker process (the target of ``multiprocessing.Process``): ``args``, its
    start-up record (built by the parent's ``WorkerSet.worker_start``); ``conn``, its end of the
    command pipe; ``crash``, the write end of its crash pipe (shmvec._crash)."""
    index = args.index
    _lifeline.arm(args.parent_pid)  # (under spawn and forkserver, armed already as the process started)
    _crash.install(crash)  # first: a factory's native crash is reported too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    try:  # a process group of its own: the parent ends the env's own children with the worker
        os.setpgid(0, 0)
    except OSError:
        pass
    if args.affinity:  # before any env (or thread pool) is built: threads inherit the mask
        os.sched_setaffinity(0, args.affinity)
    cap_threads(args.threads, after_envs=False)
    parent = ParentWatch(args.parent_pid)
    worker: Worker | None = None
    try:
        envs: list[gym.Env] = []
        at: list[int | None] = [None]
        not_loaded: dict[str, str] = {}
        try:
            # The parent's registrations this process may lack, before any factory is unpickled or called.
            not_loaded = register_missing(args.registrations)
            build_envs(args.env_fns, args.env_range, envs, at, args.public_name)
            cap_threads(args.threads, after_envs=True)
        except BaseException as exc:  # a factory's sys.exit() too: the parent decides what it means
            explain_not_found(exc, not_loaded)
            conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=at[0], worker=index, command="env construction")))
            for env in envs:
                try:
                    env.close()
                except Exception:
                    pass  # the construction error is the one to report
            return
        worker = Worker(args, envs, conn, parent)
        try:
            spaces = hello(envs)
        except Exception as exc:
            conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=args.env_range.start, worker=index,
                                                    command="env construction")))
            return
        conn.send_bytes(spaces)
        msg = recv(conn, parent)
        try:
            if msg[0] == P.Pipe.ATTACH_FD:  # a restart: the block's name is unlinked, its descriptor follows
                wait_readable(conn, parent)
                worker.attach(msg[1], fd=reduction.recv_handle(conn))
            elif msg[0] == P.Pipe.ATTACH:
                worker.attach(msg[1])
            else:
                return
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise
        except Exception as exc:  # answered as such, never taken for "ready"
            conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=None, worker=index, command="attach")))
            return
        _lifeline.disarm()  # serve()'s waits check the parent from now on
        conn.send((P.Pipe.READY, None))
        worker.serve()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away: nothing to report to
    finally:
        if worker is not None:
            error = worker.close_envs()
            worker.detach()
            try:
                packed = None if error is None else pack_exception(
                    error, env_index=worker.current, worker=index, command="close")
                conn.send((P.Pipe.CLOSED, packed))
            except (OSError, EOFError):
                pass
        parent.close()
        conn.close()
