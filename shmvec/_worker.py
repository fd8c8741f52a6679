"""The worker process: builds a slice of the envs and serves the parent's commands.

The protocol (who writes which word, in which order) is written down in
:mod:`shmvec._protocol`.  This module imports nothing heavy: no SB3, no torch,
unless the user's env factories import them.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import cloudpickle
import gymnasium as gym

from shmvec import _crash, _lifeline
from shmvec import _protocol as P
from shmvec._codec import encode_infos
from shmvec._errors import ShmVecEnvError, pack_exception
from shmvec._layout import Layout, check_same_spaces, close_mapping, make_gather, make_scatter
from shmvec._masks import has_action_masks, write_mask
from shmvec._pickled_leaves import WorkerLeaves
from shmvec._pickling import dumps
from shmvec._pool import PoolServer
from shmvec._registrations import explain_not_found, register_missing
from shmvec._rows import publish_step
from shmvec._segment import FdSegment
from shmvec._sync import Words, current_cpu
from shmvec.factories import not_an_env_error

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS")


class _ParentWatch:
    """Tells whether the parent process is still alive (a pidfd where the kernel has them)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None

    def alive(self) -> bool:
        if self.fd is not None:
            readable, _, _ = select.select([self.fd], [], [], 0)
            return not readable
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _cap_threads(n: int | None, after_envs: bool) -> None:
    if n is None:
        return
    if not after_envs:
        for var in _THREAD_VARS:
            os.environ[var] = str(n)
        return
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except Exception:  # threadpoolctl is best effort: a library it cannot drive keeps its threads
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


def _is_wrapped(env: gym.Env, wrapper_class: type) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return False


def _build_envs(env_fns_bytes: bytes, env_range: range, envs: list[gym.Env], at: list[int | None],
                public_name: str = "ShmVecEnv") -> None:
    """Builds the slice's envs into ``envs`` (what was built is there if it raises, for closing);
    ``at[0]`` is the env being built or checked."""
    env_fns = cloudpickle.loads(env_fns_bytes)
    seen: dict[int, int] = {}
    for i, fn in zip(env_range, env_fns):
        at[0] = i
        env = fn()
        if not isinstance(env, gym.Env):
            error = not_an_env_error(f"env_fns[{i}]", env, public_name)
            if not isinstance(env, type) and callable(getattr(env, "close", None)):
                try:  # a vector env's processes, a multi-agent env's simulator
                    env.close()
                except Exception:
                    pass  # the error to report is that it is no gymnasium.Env
            raise error
        key = id(env.unwrapped)
        if key in seen:
            raise ValueError(
                f"env_fns[{i}] returned the same env instance as env_fns[{seen[key]}]. Each factory must build a "
                "new env (use gymnasium.make(...) inside it, not `lambda: env`)."
            )
        seen[key] = i
        envs.append(env)
    first = envs[0]
    for i, env in zip(env_range, envs):
        at[0] = i
        # Observation spaces are checked by the parent, which gets every env's in the hello
        # (ShmVectorEnv's observation_mode lets them differ in bounds), before any layout is built.
        check_same_spaces(i, (first.observation_space, env.action_space), env_range.start,
                          (first.observation_space, first.action_space))  # (the action space only)
    at[0] = None


class _Worker:
    leaves: WorkerLeaves | None = None  # values of the leaves without a fixed size (shmvec._pickled_leaves)
    last_obs: list | None = None  # zero_copy: each env's last observation as the env returned it

    def __init__(self, index: int, env_range: range, envs: list[gym.Env], conn: Connection,
                 parent: _ParentWatch, spin: float, autoreset: str = P.AUTORESET_SAME_STEP) -> None:
        self.index = index
        self.start, self.stop = env_range.start, env_range.stop
        self.envs = envs
        self.conn = conn
        self.parent = parent
        self.spin = spin
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
    def attach(self, shm_name: str | None, n_envs: int, n_workers: int, mailbox_bytes: int, mask_size: int = 0,
               masks_on: bool = True, obs_blocks: int = 0, fd: int | None = None) -> None:
        """Maps the block by name, or (a restarted worker: the name is gone) from the descriptor ``fd``."""
        env = self.envs[0]
        self.shm = SharedMemory(name=shm_name) if fd is None else FdSegment(fd)
        layout = Layout(env.observation_space, env.action_space, n_envs, n_workers, mailbox_bytes, mask_size,
                        obs_blocks)
        views = layout.views(self.shm.buf)
        self.masks = views.mask  # None unless the block has a mask buffer
        self.masks_on = masks_on and self.masks is not None
        self.words = Words(self.shm.buf, layout.ctrl_offset, layout.ctrl_words)
        self.mailbox_bytes = mailbox_bytes
        self.mailbox = memoryview(views.mailbox[self.index])
        self.rew, self.terminated, self.truncated = views.rew, views.terminated, views.truncated
        if layout.obs_pickled or layout.act_pickled:  # leaves without a fixed size: lists of values in views
            self.leaves = WorkerLeaves(layout, views, self.start, self.stop, self.autoreset == P.AUTORESET_SAME_STEP)
        # One private copy of this worker's actions per step, handed out env by env: an env
        # that keeps its action never sees the next step's.
        act_slice = make_gather(env.action_space, views.act, copy=True, batch=list)
        own = slice(self.start, self.stop)
        n = self.stop - self.start
        if isinstance(env.action_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            self.read_actions = lambda: _unbatch(env.action_space, act_slice(own), n)
        else:
            self.read_actions = lambda: list(act_slice(own))
        # Each observation written sets ENV_AT to the next env: the env a step loop is in.  One
        # writer per observation block; each command's OBS_BLOCK word picks one (shmvec._leases).
        self.obs_writers = [make_scatter(env.observation_space, block, "observation", (self.words, self._env_at))
                            for block in views.obs_blocks]
        if obs_blocks:  # zero_copy: the step and reset loops keep each env's last observation (shmvec._leases)
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
                self._pipe_command(seen)
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
        data = _recv_bytes_or_give_up(self.conn, self.parent, give_up)
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
            self._write_masks(range(start, stop))

    def _write_masks(self, indices: Any) -> None:
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
            self._write_masks(range(self.start, self.stop))
        # With pickled observation leaves the result carries every env's values (shmvec._pickled_leaves).
        return items if self.leaves is None or not self.leaves.obs else self.leaves.message(items, None, None)

    def _pipe_command(self, seq: int) -> None:
        # Posted first, sent after (protocol, "Rare commands"): wait for the message, for the
        # parent's death (a fork-inherited copy of its end keeps EOF from showing), and for a
        # newer command (the parent was interrupted before it sent the message, and closes us).
        words = self.words
        assert words is not None
        seq_word = P.word(self.index, P.CMD_SEQ)
        data = _recv_bytes_or_give_up(self.conn, self.parent, lambda: words.load(seq_word) != seq)
        if data is None:
            return  # the serve loop takes the newer command (CLOSE)
        name = None  # not known until unpickled: the parent fills it in
        try:
            name, args = pickle.loads(data)  # an argument that does not unpickle here is the answer
            result = self._run_pipe_command(name, args)
            self.conn.send_bytes(dumps((P.Pipe.OK, result)))
        except BaseException as exc:  # an env's sys.exit() too: it is the answer, the worker stays
            self.conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=self.current, worker=self.index, command=name)))
        self.current = None

    def _run_pipe_command(self, name: str, args: tuple) -> Any:
        indices = args[0]
        out = []
        for i in indices:
            self.current = i
            env = self.envs[i - self.start]
            if name == P.Call.GET_ATTR:
                out.append(env.get_wrapper_attr(args[1]))
            elif name == P.Call.HAS_ATTR:
                try:
                    env.get_wrapper_attr(args[1])
                    out.append(True)
                except AttributeError:
                    out.append(False)
            elif name == P.Call.SET_ATTR:
                setattr(env, args[1], args[2])
                out.append(None)
            elif name == P.Call.ENV_METHOD:
                out.append(env.get_wrapper_attr(args[1])(*args[2], **args[3]))
            elif name == P.Call.CALL:  # Gymnasium's VectorEnv.call: call it if callable, else return it
                attr = env.get_wrapper_attr(args[1])
                out.append(attr(*args[2], **args[3]) if callable(attr) else attr)
            elif name == P.Call.SET_WRAPPER_ATTR:  # Gymnasium's VectorEnv.set_attr: {env index: value}
                env.set_wrapper_attr(args[1], args[2][i])
                out.append(None)
            elif name == P.Call.IS_WRAPPED:
                out.append(_is_wrapped(env, args[1]))
            elif name == P.Call.RENDER:
                out.append(env.render())
            elif name == P.Call.ACTION_MASKS:  # the parent's first ask for masks: now, then after every step
                if not self.masks_on and self.masks is not None:
                    if self.was_reset:
                        self._write_masks(range(self.start, self.stop))  # raises: still off, asked again
                    self.masks_on = True
                out.append(None)
            elif name == P.Call.ACTION_MASKS_OFF:  # the first ask failed in another worker: all stay off
                self.masks_on = False
                out.append(None)
            elif name == P.Call.POOL_ATTACH:  # once per worker: attach the pool's segment (shmvec._pool)
                self.pool = PoolServer(self, *args[1:])
                out.append(None)
            else:
                raise ShmVecEnvError(f"unknown command {name!r}")
        if self.masks_on and self.was_reset and name in (P.Call.SET_ATTR, P.Call.ENV_METHOD):
            self._write_masks(indices)  # the call may have changed what the envs allow
        return out

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


def _unbatch(space: gym.spaces.Space, batch: Any, n: int) -> list:
    """Splits a batched Dict/Tuple value into n per-env values."""
    if isinstance(space, gym.spaces.Dict):
        parts = {key: _unbatch(sub, batch[key], n) for key, sub in space.spaces.items()}
        return [{key: parts[key][j] for key in parts} for j in range(n)]
    if isinstance(space, gym.spaces.Tuple):
        parts_t = [_unbatch(sub, batch[k], n) for k, sub in enumerate(space.spaces)]
        return [tuple(p[j] for p in parts_t) for j in range(n)]
    return list(batch)


def _wait_readable(conn: Connection, parent: _ParentWatch, give_up: Any = None,
                   poll_s: float = P.PARENT_POLL_S) -> bool:
    """Waits until ``conn`` has data: True; False as soon as ``give_up()`` is true.  Raises
    EOFError when the parent dies (fork copies of its end make EOF on the pipe unreliable)."""
    while not conn.poll(poll_s):
        if give_up is not None and give_up():
            return False
        if not parent.alive():
            raise EOFError("parent process died")
    return True


def _recv_bytes_or_give_up(conn: Connection, parent: _ParentWatch, give_up: Any,
                           poll_s: float = P.PIPE_WAIT_POLL_S) -> bytes | None:
    """``conn.recv_bytes()`` read in pieces, checking ``give_up()`` while the message has not
    begun *and* between its pieces: None once it is true.

    A parent interrupted (Ctrl-C) in the middle of ``send_bytes()`` leaves half a message in the
    pipe and then posts CLOSE; a plain ``recv_bytes()`` would wait for the other half forever (the
    parent waited 5 s, then sent SIGTERM, and the envs' ``close()`` never ran).  The pipe is not
    read again after giving up: the worker closes.  Framing as ``Connection._send_bytes`` writes
    it: a 4-byte big-endian signed length, or -1 and an 8-byte length above 2 GiB.
    """
    fd = conn.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    timeout_ms = max(1, int(poll_s * 1000))

    def read(n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            while not poller.poll(timeout_ms):
                if give_up():
                    return None
                if not parent.alive():
                    raise EOFError("parent process died")
            chunk = os.read(fd, min(left, 1 << 22))
            if not chunk:
                raise EOFError("the parent closed its end of the pipe")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    header = read(4)
    if header is None:
        return None
    size = int.from_bytes(header, "big", signed=True)
    if size == -1:
        header = read(8)
        if header is None:
            return None
        size = int.from_bytes(header, "big")
    return read(size) if size else b""


def _recv(conn: Connection, parent: _ParentWatch) -> Any:
    """conn.recv(), giving up when the parent dies."""
    _wait_readable(conn, parent)
    return conn.recv()


def worker_main(index: int, env_range: range, env_fns_bytes: bytes, conn: Connection, crash: Connection,
                parent_pid: int, threads: int | None, spin: float, affinity: frozenset[int] | None = None,
                autoreset: str = P.AUTORESET_SAME_STEP, registrations: bytes | None = None,
                public_name: str = "ShmVecEnv") -> None:
    """Entry point of a worker process (the target of ``multiprocessing.Process``); ``crash`` is
    the write end of its crash pipe (shmvec._crash); ``registrations``: the parent's env
    registrations this process may lack (shmvec._registrations), registered before any factory
    is unpickled; ``public_name``: the class the user called, named in errors."""
    _lifeline.arm(parent_pid)  # (under spawn and forkserver, armed already as the process started)
    _crash.install(crash)  # first: a factory's native crash is reported too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    try:  # a process group of its own: the parent ends the env's own children with the worker
        os.setpgid(0, 0)
    except OSError:
        pass
    if affinity:  # before any env (or thread pool) is built: threads inherit the mask
        os.sched_setaffinity(0, affinity)
    _cap_threads(threads, after_envs=False)
    parent = _ParentWatch(parent_pid)
    worker: _Worker | None = None
    try:
        envs: list[gym.Env] = []
        at: list[int | None] = [None]
        not_loaded: dict[str, str] = {}
        try:
            not_loaded = register_missing(registrations)  # before any factory is unpickled or called
            _build_envs(env_fns_bytes, env_range, envs, at, public_name)
            _cap_threads(threads, after_envs=True)
        except BaseException as exc:  # a factory's sys.exit() too: the parent decides what it means
            explain_not_found(exc, not_loaded)
            conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=at[0], worker=index, command="env construction")))
            for env in envs:
                try:
                    env.close()
                except Exception:
                    pass  # the construction error is the one to report
            return
        worker = _Worker(index, env_range, envs, conn, parent, spin, autoreset)
        first = envs[0]
        obs_spaces = [env.observation_space for env in envs]
        try:
            hello = dumps((P.Pipe.SPACES, (first.observation_space, first.action_space,
                                      getattr(first, "render_mode", None), dict(first.metadata),
                                      all(has_action_masks(env) for env in envs),
                                      # every env's observation space, where they differ
                                      None if all(s == obs_spaces[0] for s in obs_spaces) else obs_spaces)))
        except Exception as exc:
            exc.add_note("shmvec: the first env's observation_space, action_space, render_mode and metadata "
                         "go to the parent pickled (cloudpickle for lambdas and classes of your script): keep open "
                         "handles (locks, sockets, files) out of them.")
            conn.send((P.Pipe.ERROR, pack_exception(exc, env_index=env_range.start, worker=index,
                                               command="env construction")))
            return
        conn.send_bytes(hello)
        msg = _recv(conn, parent)
        try:
            if msg[0] == P.Pipe.ATTACH_FD:  # a restart: the block's name is unlinked, its descriptor follows
                _wait_readable(conn, parent)
                worker.attach(None, *msg[1], fd=reduction.recv_handle(conn))
            elif msg[0] == P.Pipe.ATTACH:
                worker.attach(*msg[1])
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
