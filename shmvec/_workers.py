"""The worker set: the engine's processes, pipes and shared block, and everything about their lives.

It launches each worker (:func:`shmvec._worker.worker_main`) with its start-up record, its
command pipe and its crash pipe (:mod:`shmvec._crash`), sends it the block to attach to (the
records of :mod:`shmvec._startup_args`, each built here once: ``worker_start``, ``send_attach``),
creates the shared block and the links over its control words (:class:`shmvec._link.Links`,
``links``: the engine, the channel and the restarts post through
them), notices dead workers through their process sentinels (never by hanging), turns a death
into a ``WorkerDiedError`` that names the env the worker was in and carries its Python stack, and
releases everything: politely (CLOSE posted through the links, then a bounded join), then
SIGTERM, then SIGKILL, then the pipes and the block.

It holds no reference to the engine, so ``weakref.finalize(engine, workers.release)`` frees
everything when an engine is dropped without ``close()``; class-level defaults make
``release()`` safe on a half-built set.  Who marks the engine broken is the caller's business:
the methods here return errors, they do not record them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import weakref
from collections.abc import Sequence
from multiprocessing import reduction, resource_tracker
from multiprocessing.connection import Connection, wait as mp_wait
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING, Any

from gymnasium import spaces

from shmvec import _crash
from shmvec import _protocol as P
from shmvec._errors import ShmVecEnvError, SpaceError, WorkerDiedError, WorkerStacks, describe_exitcode, envs_named
from shmvec._layout import Layout, check_same_spaces, close_mapping, same_shapes
from shmvec._leases import lease_count, starting_workers
from shmvec._link import BROKEN_HINT, Links
from shmvec._lifeline import WorkerName
from shmvec._machine import note_workers
from shmvec._masks import resolve as resolve_masks
from shmvec._options import Options
from shmvec._registrations import explain_not_found
from shmvec._segment import create_segment
from shmvec._startup_args import Attach, BlockSizes, WorkerStart
from shmvec._sync import Words
from shmvec._worker import worker_main

if TYPE_CHECKING:  # the channel is built over a worker set: no import of it at run time
    from shmvec._channel import Channel

# Bounds of release(): polite exit, then SIGTERM, then SIGKILL.
CLOSE_JOIN_S = 5.0
TERMINATE_JOIN_S = 1.0
# How long to wait to reap a worker whose sentinel says it is gone (for its exit code).
DIED_JOIN_S = 1.0
START_HINT = "The vec env was not built, and its workers were stopped: fix the cause and build it again."

_LIVE: "weakref.WeakSet[WorkerSet]" = weakref.WeakSet()


def _forget_workers_after_fork() -> None:
    """In the child of a bare ``os.fork()`` (not multiprocessing's, which starts afresh): the child
    inherits multiprocessing's set of this process's children, and at its exit multiprocessing
    terminates those that are daemonic, which are our workers: the parent's next step then met
    WorkerDiedError (SIGTERM).  They are the parent's, so the child forgets them."""
    children = getattr(mp.process, "_children", None)
    if children is None:
        return
    for workers in list(_LIVE):
        for proc in workers.processes:
            children.discard(proc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)


def is_alive(p: Any) -> bool:
    try:
        return p.is_alive()
    except ValueError:  # a Process object closed already (a restart stopped it): not running
        return False


class WorkerSet:
    """The processes, pipes and shared block of one engine (see the module docstring)."""

    processes: list = []
    conns: list[Connection] = []
    crash_conns: list[Connection] = []  # worker w's crash pipe, read end (shmvec._crash)
    shm: SharedMemory | None = None
    unlinked: bool = False
    words: Words | None = None
    links: Links | None = None  # the parent's end of the control words, once the block exists
    views: Any = None
    sizes: BlockSizes | None = None  # what the block is laid out from besides the spaces (shmvec._startup_args)
    released: bool = False
    died_in_close: list[tuple[int, int | None, str]] = []  # (worker, exit code, its crash report)
    ready: frozenset[int] | set[int] = frozenset()  # workers past the handshake (they serve the words)
    owner_pid: int | None = None  # the process that built them: a forked child never releases them
    sentinels: dict[int, int] = {}  # process sentinel -> worker
    groups: dict[int, int] = {}  # worker -> its process group (its pid), once seen to lead one

    def __init__(self, options: Options, payloads: list[bytes], registrations: bytes | None = None) -> None:
        self.owner_pid = os.getpid()
        self.options = options
        self.slices = options.slices
        self.payloads = payloads  # each worker's pickled factories, kept to restart it
        self.registrations = registrations  # the env registrations a fresh worker lacks (shmvec._registrations)
        self.processes, self.conns, self.crash_conns = [], [], []
        self.groups = {}
        _LIVE.add(self)

    # ---- launching ------------------------------------------------------------------------------
    def launch_all(self) -> None:
        # Started before any worker so that every worker shares it (fork copies its fd), and an
        # attach in a worker is a no-op for it rather than a tracker of its own.
        resource_tracker.ensure_running()
        for w in range(len(self.slices)):
            self.launch(w)
        self.refresh_sentinels()

    def launch(self, w: int) -> None:
        """Starts worker w, or a new one in place of a stopped worker w (a restart), with its
        command pipe and its crash pipe; ``release()`` covers all three from here on."""
        opts = self.options
        ctx = mp.get_context(opts.start_method)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        crash_reader, crash_writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=worker_main,
            args=(self.worker_start(w), child_conn, crash_writer),
            daemon=True,
            name=WorkerName(f"shmvec-worker-{w}", os.getpid()),  # arms its lifeline before it imports anything
        )
        if w == len(self.processes):
            self.conns.append(parent_conn)
            self.crash_conns.append(crash_reader)
            self.processes.append(proc)
        else:
            self.conns[w], self.crash_conns[w], self.processes[w] = parent_conn, crash_reader, proc
        try:
            with starting_workers():  # (fork: the child maps the block anew, it holds no observation)
                proc.start()
            note_workers([proc.pid])
        except AssertionError as exc:
            if "daemonic" not in str(exc):
                raise
            raise ShmVecEnvError(
                "this process is daemonic (a multiprocessing.Pool worker, or a worker of another vec env), and "
                "multiprocessing lets no daemonic process start processes of its own: build a DummyVecEnv "
                "there, or start this process with daemon=False."
            ) from exc
        finally:
            child_conn.close()
            crash_writer.close()

    def worker_start(self, w: int) -> WorkerStart:
        """Worker w's start-up arguments (the one place they are put together: a first start and a restart)."""
        opts = self.options
        return WorkerStart(w, self.slices[w], self.payloads[w], os.getpid(), opts.worker_threads, opts.worker_spin_s,
                           affinity=opts.cpu_sets[w], autoreset=opts.autoreset, registrations=self.registrations,
                           public_name=opts.public_name)

    def note_groups(self, workers: Sequence[int]) -> None:
        """Records the process group of each of ``workers`` that leads its own (they set it first
        thing): the group that :meth:`end_group` ends, env children included."""
        for w in workers:
            pid = self.processes[w].pid
            try:
                if os.getpgid(pid) == pid:
                    self.groups[w] = pid
            except OSError:  # gone already
                pass

    def end_group(self, w: int) -> None:
        """SIGKILL to what is left of worker w's process group (its env's own children), once the
        worker has exited; a child that left the group on purpose is out of reach."""
        pgid = self.groups.pop(w, None)
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:  # nobody left in it
                pass

    def start(self, channel: Channel, masks_live: bool, left_out: Any = None,
              observation_mode: Any = None) -> tuple[Layout, dict]:
        """Launches every worker and runs the two handshakes; returns the block's layout and the
        envs' metadata.  ``channel``: the engine's pipes (their waits are bounded); ``left_out``: the
        registrations that could not be sent (shmvec._registrations), named if an env id is not found."""
        opts, n = self.options, len(self.slices)
        self.launch_all()
        # Handshake 1: every worker reports its spaces (no env is ever built in the parent).
        try:
            hellos = [channel.recv(w, "env construction", START_HINT) for w in range(n)]
        except Exception as exc:
            explain_not_found(exc, left_out or {})
            raise
        for w, (o, a, *_) in enumerate(hellos):
            for name, space in (("observation_space", o), ("action_space", a)):
                if not isinstance(space, spaces.Space):
                    raise SpaceError(
                        f"env {self.slices[w].start}'s {name} is {space!r} ({type(space).__name__}), not a "
                        f"gymnasium.spaces.Space: set self.{name} in the env's __init__ (or in a wrapper).")
        obs_space, act_space, _, metadata, *_ = hellos[0]
        for w, (_, a, *_) in enumerate(hellos[1:], start=1):  # (observation spaces: observation_mode)
            check_same_spaces(self.slices[w].start, (obs_space, a), 0, (obs_space, act_space))
        self.observation_spaces = env_observation_spaces(hellos, self.slices, observation_mode)
        mask_size = resolve_masks(opts.action_masks, all(h[4] for h in hellos), act_space)
        n_envs = self.slices[-1].stop
        self.sizes = sizes = BlockSizes(n_envs, n, opts.mailbox_bytes, mask_size,
                                        lease_count(opts.zero_copy, obs_space, n_envs))
        layout = sizes.layout(obs_space, act_space)  # the workers build theirs the same way (Attach)
        shm = self.create_block(layout.nbytes, layout.base_nbytes)
        # Handshake 2: every worker attaches; then the name is unlinked, so no segment outlives us.
        # The words exist first: a worker that has attached serves them, and only a CLOSE posted
        # there reaches it if this is interrupted (on the pipe it would wait 5 s for SIGTERM).
        self.words = words = Words(shm.buf, layout.ctrl_offset, layout.ctrl_words)
        self.links = Links(words, self.slices)
        self.ready = set()
        for w in range(n):
            self.send_attach(w, masks_live)
        self.note_groups(range(n))
        for w in range(n):
            channel.recv(w, "attach", START_HINT)
            self.ready.add(w)
        self.unlink()
        return layout, metadata

    def send_attach(self, w: int, masks_live: bool, by_fd: bool = False) -> None:
        """Sends worker w the block to attach to (the one builder of :class:`Attach`): its name at
        start-up; ``by_fd`` (a restart, the name is unlinked) its descriptor after the message."""
        assert self.shm is not None and self.sizes is not None
        conn = self.conns[w]
        conn.send((P.Pipe.ATTACH_FD if by_fd else P.Pipe.ATTACH,
                   Attach(None if by_fd else self.shm.name, self.sizes, masks_live)))
        if by_fd:
            reduction.send_handle(conn, self.block_fd(), self.processes[w].pid)

    def refresh_sentinels(self) -> None:
        self.sentinels = {p.sentinel: w for w, p in enumerate(self.processes)}

    def create_block(self, nbytes: int, reserve: int | None = None) -> SharedMemory:
        """The shared block, the pages of its first ``reserve`` bytes (default all) reserved now
        (ENOSPC here, not SIGBUS mid-step: :func:`shmvec._segment.create_segment`); the lease
        blocks after them are reserved when first used (shmvec._leases)."""
        self.shm = shm = create_segment(nbytes, reserve)
        return shm

    def block_fd(self) -> int:
        """The block's file descriptor (a restarted worker maps the block from it: its name is unlinked)."""
        assert self.shm is not None
        return self.shm._fd

    # ---- who is alive -------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """The workers' process ids now (a restart replaces a process)."""
        return [p.pid for p in self.processes]

    def dead(self, workers: Sequence[int] | None = None) -> list[int]:
        """The workers (of ``workers``, default all) whose process has exited, sorted."""
        if workers is None:
            return sorted(self.sentinels[s] for s in mp_wait(list(self.sentinels), timeout=0))
        ready = set(mp_wait([self.processes[w].sentinel for w in workers], timeout=0))
        return [w for w in workers if self.processes[w].sentinel in ready]

    def death_hint(self, exitcode: int | None, starting: bool) -> str:
        """What usually makes a worker die with ``exitcode``."""
        method = self.options.start_method
        if exitcode == 1 and starting and method != "fork":
            main_file = getattr(sys.modules.get("__main__"), "__file__", None)
            if isinstance(main_file, str) and not os.path.exists(main_file):  # "<stdin>": python - < script.py
                return (f"Exit code 1 while starting: your main module is {main_file!r}, which a {method} "
                        "worker re-imports and cannot (its FileNotFoundError is on stderr). Save the script to a "
                        "file and run that, or use start_method=\"fork\".")
            return ("Exit code 1 while starting, before the worker could report an error, is an exception raised "
                    f"while it imported your main module ({method} re-imports it; its traceback is on "
                    "stderr): most often the code that builds the vec env is not under "
                    "`if __name__ == \"__main__\":`.")
        if exitcode == -15:
            return ("Something sent it SIGTERM: kill, a job scheduler or process manager, or the exit of a "
                    "process forked from this one by multiprocessing.")
        return "A native crash (SIGSEGV), the OOM killer (SIGKILL) or os._exit in an env are the usual causes."

    def died(self, w: int, what: str, join_s: float, starting: bool,
             why: str | None = None) -> tuple[WorkerDiedError, WorkerStacks | None]:
        """WorkerDiedError for worker w (once reaped, within ``join_s``) and the Python stack
        faulthandler wrote at a native crash (its ``__cause__``, for the caller to record).
        ``why``: what usually causes it (default: by its exit code)."""
        proc = self.processes[w]
        proc.join(join_s)
        if proc.exitcode is not None:
            self.end_group(w)
        if why is None:
            why = self.death_hint(proc.exitcode, starting)
        report = self.crash_report(w)
        if report:
            why += " Its Python stack when it died (faulthandler) is shown above."
        sl = self.slices[w]
        err = WorkerDiedError(
            f"worker {w} ({envs_named(sl)}) {what} with {describe_exitcode(proc.exitcode)}"
            f"{self.in_env(w)}. {why} " + (START_HINT if starting else BROKEN_HINT),
            worker=w, env_indices=sl, exitcode=proc.exitcode,
        )
        return err, WorkerStacks.of(report, "when it died")

    def env_of(self, w: int) -> int | None:
        """The env worker w is in by its ENV_AT word (shmvec._protocol: a hint), or None."""
        if self.links is None or self.words is None:
            return None
        return self.links[w].env_at()

    def in_env(self, w: int) -> str:
        """", in env i" (``env_of``), or ""."""
        i = self.env_of(w)
        return "" if i is None else f", in env {i}"

    def stacks(self, workers: Sequence[int]) -> WorkerStacks | None:
        """The Python stacks of live, stuck workers (shmvec._crash.dump_stacks), or None."""
        parts = []
        for w in workers:
            if w < len(self.crash_conns) and is_alive(self.processes[w]):
                stacks = _crash.dump_stacks(self.processes[w].pid, self.crash_conns[w])
                if stacks:
                    parts.append(f"worker {w}:\n{stacks}" if len(workers) > 1 else stacks)
        return WorkerStacks.of("\n\n".join(parts), "where it hung")

    def crash_report(self, w: int) -> str:
        """What dead worker w wrote to its crash pipe (shmvec._crash), or ""."""
        return _crash.read_report(self.crash_conns[w]) if w < len(self.crash_conns) else ""

    # ---- stopping ---------------------------------------------------------------------------------
    def stop(self, w: int, join_s: float) -> None:
        """Stops worker w for a restart: a live one closes its envs (within ``join_s``), then SIGTERM,
        SIGKILL; its pipes are drained and closed, its process object closed."""
        proc, conn = self.processes[w], self.conns[w]
        assert self.links is not None
        link = self.links[w]
        if proc.is_alive():  # an env raised: let the worker close its envs, then insist
            link.post(P.Cmd.CLOSE)
            proc.join(join_s)
            if proc.is_alive():
                proc.terminate()
                proc.join(TERMINATE_JOIN_S)
            if proc.is_alive():
                proc.kill()
        proc.join()
        self.end_group(w)
        try:
            while conn.poll(0):
                conn.recv_bytes()  # an error it had sent, or its "closed" message: nobody waits for them
        except (EOFError, OSError):
            pass
        conn.close()
        self.crash_conns[w].close()
        proc.close()
        link.forget_sleepers()  # (one killed in its futex wait stays counted as a sleeper)

    def unlink(self) -> None:
        if self.shm is not None and not self.unlinked:
            self.unlinked = True
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass

    def release(self, polite: bool = True) -> list[tuple[int, dict]]:
        """Stops the workers (politely if asked), frees the memory; returns errors env.close() raised.

        Interrupted (Ctrl-C while a worker's env.close() hangs), it still terminates every worker
        and frees everything before the interrupt goes on: there is no second chance, as a
        second call returns at once.
        """
        if self.released:
            return []
        if self.owner_pid is not None and os.getpid() != self.owner_pid:
            # A forked process (a worker of another vec env) collecting its copy of this object:
            # the workers and the block are its parent's to stop and free, not its own.  Its copy
            # of the mapping goes quietly (views of it may still be alive in the same garbage:
            # SharedMemory.__del__ would print a BufferError).
            if self.shm is not None:
                close_mapping(self.shm)
            return []
        self.released = True
        alive = [(w, p) for w, p in enumerate(self.processes) if is_alive(p)]
        try:
            if polite:
                self._ask_to_exit(alive)
        finally:
            close_errors = self._free(alive)
        return close_errors

    def _ask_to_exit(self, alive: list) -> None:
        if self.links is not None:
            self.links.send(P.Cmd.CLOSE, [w for w, _ in alive])
        for w, _ in alive:
            if w not in self.ready:  # still in the handshake (interrupted there): tell them on the pipe
                try:
                    self.conns[w].send((P.Pipe.ABORT, None))
                except OSError:
                    pass
        deadline = time.monotonic() + CLOSE_JOIN_S
        for w, p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        # Asked to close, they exited on their own: a non-zero code is a crash in env.close().
        self.died_in_close = [(w, p.exitcode, self.crash_report(w))
                              for w, p in alive if not p.is_alive() and p.exitcode != 0]

    def _free(self, alive: list) -> list[tuple[int, dict]]:
        close_errors: list[tuple[int, dict]] = []
        note_workers((p.pid for p in self.processes), live=False)
        for w, p in alive:
            if p.is_alive():
                p.terminate()
                p.join(TERMINATE_JOIN_S)
            if p.is_alive():
                p.kill()
                p.join()
        for w in list(self.groups):
            self.end_group(w)
        for w, conn in enumerate(self.conns):
            try:
                while conn.poll(0):
                    data = conn.recv_bytes()
                    try:
                        msg = pickle.loads(data)  # an answer nobody read may not unpickle here
                    except Exception:
                        continue
                    if msg[0] == P.Pipe.CLOSED and msg[1] is not None:
                        close_errors.append((w, msg[1]))
            except (EOFError, OSError):
                pass
            conn.close()
        for conn in self.crash_conns:
            conn.close()
        for p in self.processes:
            try:
                p.close()
            except (ValueError, AttributeError):  # closed already (a restart stopped it)
                pass
        if self.links is not None:
            self.links.release()
        if self.words is not None:
            self.words.release()
        self.words = None
        self.views = None
        if self.shm is not None:
            self.unlink()
            close_mapping(self.shm)
        return close_errors


def env_observation_spaces(hellos: list, slices: Sequence[range], mode: Any) -> list:
    """Every env's observation space, in env order, from the workers' hellos, checked against
    ``observation_mode``: None or "same" (all equal), "different" (the same shapes and dtypes as
    env 0's: :func:`shmvec._layout.same_shapes`), or a space (the same shapes and dtypes as it).

    :raises SpaceError: an env's space that ``mode`` does not allow.
    """
    found: list = []
    for (obs_space, *_, own), sl in zip(hellos, slices):
        found.extend(own if own is not None else [obs_space] * len(sl))
    first = found[0]
    named = mode is None or isinstance(mode, str)
    for i, space in enumerate(found):
        if named and mode != "different":
            if space != first:
                try:  # (the message, and its hint for a Space subclass without __eq__, are check_same_spaces')
                    check_same_spaces(i, (space,), 0, (first,))
                except SpaceError as exc:
                    if mode == "same":
                        exc.args = (exc.args[0] + " If they differ only in bounds (the same shapes and dtypes), "
                                    "pass observation_mode='different'.",)
                    raise
        elif not (space == (first if named else mode) or same_shapes(first if named else mode, space)):
            raise SpaceError(
                f"observation_mode={mode!r}: env {i} has observation_space {space}, which differs from "
                + ("env 0's" if named else "that space") + " in shape, dtype or structure. Envs may differ only in "
                "bounds: each part of the observations has one shared-memory buffer of one shape and dtype for "
                "all envs (AsyncVectorEnv requires the same).")
    return found
