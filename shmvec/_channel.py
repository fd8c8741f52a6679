"""The pipe channel: the engine's rare commands and every message that does not fit the shared words.

Each worker has a duplex pipe.  The parent sends on it the handshake, a posted command's
arguments that did not fit the mailbox (``ARG_IN_PIPE``), and the rare commands
(``get_attr``, ``env_method``, ..., :class:`shmvec._protocol.Call`); a worker answers on it
with an error, a result too large for its mailbox, or a rare command's answer
(:class:`shmvec._protocol.Pipe` tags).  The protocol, "Rare commands", says in which order:
a rare command is posted to each worker on the shared words (:meth:`shmvec._link.Link.post`,
PIPE) before its message is sent here.

Every wait here is bounded: it polls the pipe and the worker's process sentinel together, so a
dead worker is noticed at once (``WorkerDiedError``), and past ``timeout`` a live one that does
not answer gives ``WorkerTimeoutError`` with the stacks of where it is stuck.  A send of a
message larger than the socket's buffer is written as the worker reads it, so a worker that
does not read cannot block the parent for ever either.  Failures are recorded on the engine's
:class:`shmvec._state.Status` (the channel holds it, not the engine).
"""

from __future__ import annotations

import os
import pickle
import select
import time
from multiprocessing import reduction
from multiprocessing.connection import wait as mp_wait
from typing import Any

from shmvec import _protocol as P
from shmvec._errors import WorkerTimeoutError, envs_named, unpack_exception
from shmvec._layout import group_by_slice
from shmvec._state import Status, record
from shmvec._workers import BROKEN_HINT, CLOSE_JOIN_S, DIED_JOIN_S, START_HINT, WorkerSet

CALL_HINT = "The vec env is still usable."


class Channel:
    """The pipes of a :class:`~shmvec._workers.WorkerSet` (see the module docstring)."""

    def __init__(self, workers: WorkerSet, status: Status, timeout: float | None) -> None:
        self.workers = workers
        self.status = status
        self.timeout = timeout  # raised for a while by the start and restarts (imports are slow)

    # ---- liveness -----------------------------------------------------------------------------
    def check_alive(self, command: str, workers: Any = None) -> None:
        """Raises WorkerDiedError if a worker (of ``workers``, default all) has died (recorded)."""
        self.status.check_closing(command)  # closed by a signal handler in this wait, or by another thread
        dead = self.workers.dead(workers)
        if dead:
            # The sentinel is ready once the process has closed its descriptors, which can be a
            # moment before it can be reaped: join(0) would often report it as "still running".
            raise self.died(dead[0], f"died during {command}", DIED_JOIN_S)

    def died(self, w: int, what: str, join_s: float, why: str | None = None) -> BaseException:
        """Worker w's WorkerDiedError, recorded as what broke the engine, to be raised."""
        err, stacks = self.workers.died(w, what, join_s, self.status.starting, why)
        return record(self.status, err, stacks)

    def raise_if_died(self, w: int, command: str) -> None:
        """After a failed pipe operation: raises WorkerDiedError if worker w is exiting.

        A dead peer shows on the pipe as EOF, ECONNRESET (it died with our message unread) or
        EPIPE, possibly a moment before its sentinel is ready, so wait for the sentinel briefly.
        """
        mp_wait([self.workers.processes[w].sentinel], timeout=DIED_JOIN_S)
        self.check_alive(command)

    # ---- receiving ----------------------------------------------------------------------------
    def wait(self, w: int, command: str) -> None:
        """Blocks until worker w's pipe has data; raises if the worker dies or the timeout passes."""
        workers = self.workers
        conn = workers.conns[w]
        since = time.monotonic()
        while not conn.poll(0):
            ready = mp_wait([conn, workers.processes[w].sentinel], timeout=P.POLL_S)
            if conn in ready or conn.poll(0):
                return
            if ready:
                self.check_alive(command, [w])
            else:
                self.status.check_closing(command)
            if self.timeout is not None and time.monotonic() - since >= self.timeout:
                sl = workers.slices[w]
                what = (START_HINT if self.status.starting
                        else "Call close() (it terminates it) and build a new vec env.")
                stacks = workers.stacks([w])
                raise record(self.status, WorkerTimeoutError(
                    f"{command}: worker {w} ({envs_named(sl)}{workers.in_env(w)}) did not answer "
                    f"within {self.timeout:g} s. " + ("Where it was is shown above (faulthandler). " if stacks else "")
                    + what
                ), stacks)

    def recv_raw(self, w: int, command: str, raw_bytes: bool = False) -> Any:
        """The next message from worker w (its bytes with ``raw_bytes``); WorkerDiedError if it died."""
        self.wait(w, command)
        conn = self.workers.conns[w]
        try:
            return conn.recv_bytes() if raw_bytes else conn.recv()
        except (EOFError, OSError):
            self.raise_if_died(w, command)
            raise

    def recv(self, w: int, command: str, hint: str) -> Any:
        """The payload of worker w's next message; its exception if it sent one."""
        tag, payload = self.recv_raw(w, command)
        if tag == P.Pipe.ERROR:
            raise unpack_exception(payload, hint)
        if tag == P.Pipe.CLOSED:
            self.exited_instead(w, command, payload)
        return payload

    def exited_instead(self, w: int, command: str, packed: dict | None) -> None:
        """Worker w sent its last message (CLOSED: it is exiting) where an answer to ``command``
        was awaited: WorkerDiedError with its exit code, and what its envs' close() raised."""
        err = self.died(w, f"exited during {command} without answering,", CLOSE_JOIN_S,
                        "The worker loop itself failed (see the cause, if any).")
        if packed is not None:
            err.__cause__ = unpack_exception(packed, BROKEN_HINT)
            self.status.fail(err, first=False)  # again, with its cause: the status keeps a copy
        try:
            raise err
        finally:
            del err  # a local holding it would hold this frame (and the engine) through its traceback

    # ---- sending ------------------------------------------------------------------------------
    def send_bytes(self, w: int, data: Any, command: str) -> None:
        """``conn.send_bytes(data)`` to worker w, bounded by ``timeout`` like every wait here.

        A message larger than the socket's buffer is written as the worker reads it: a worker
        that is alive but does not read (stopped, or stuck in native code) would block a plain
        send for ever.  Written non-blocking, polling the socket; same framing as
        ``Connection.send_bytes`` (a 4-byte big-endian length, or -1 and 8 bytes above 2 GiB).
        EPIPE/ECONNRESET (the worker died) propagate as from ``send_bytes``.

        :raises WorkerTimeoutError: the worker took none of it for ``timeout`` seconds (the vec
            env is broken: half a message is in the pipe).
        """
        conn = self.workers.conns[w]
        view = memoryview(data).cast("B")
        n = len(view)
        header = n.to_bytes(4, "big", signed=True) if n <= 0x7FFFFFFF else b"\xff\xff\xff\xff" + n.to_bytes(8, "big")
        if n <= 16384:  # fits the socket's buffer: one write, as Connection does
            conn.send_bytes(view)
            return
        fd = conn.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        since = time.monotonic()
        os.set_blocking(fd, False)
        try:
            for part in (memoryview(header), view):
                done = 0
                while done < len(part):
                    try:
                        wrote = os.write(fd, part[done:done + (1 << 20)])
                    except BlockingIOError:
                        wrote = 0
                    if wrote:
                        done += wrote
                        since = time.monotonic()  # the worker reads: the timeout counts idle time
                        continue
                    if poller.poll(int(P.POLL_S * 1000)):
                        continue
                    if not self.workers.processes[w].is_alive():
                        raise BrokenPipeError(f"worker {w} died while {command}'s message was sent")
                    if self.timeout is not None and time.monotonic() - since >= self.timeout:
                        sl = self.workers.slices[w]
                        raise record(self.status, WorkerTimeoutError(
                            f"{command}: worker {w} ({envs_named(sl)}) did not read its message "
                            f"({n} bytes) within {self.timeout:g} s. The env may hang; call close() (it terminates "
                            "it) and build a new vec env."))
        finally:
            os.set_blocking(fd, True)

    def send_args(self, in_pipe: dict[int, bytes], command: str, restarting: bool) -> None:
        """Sends the posted command's arguments that did not fit in the mailbox (ARG_IN_PIPE).
        ``restarting``: a worker that died or does not read is left (killed) for the restart."""
        for w, data in in_pipe.items():
            try:
                self.send_bytes(w, data, command)
            except (BrokenPipeError, ConnectionResetError) as exc:
                if restarting:
                    continue  # the worker died: the command's completion restarts it
                self.raise_if_died(w, command)
                self.status.fail(exc)
                raise
            except WorkerTimeoutError:
                if restarting:  # alive but not reading: killed, and restarted like a hung step
                    self.status.recover()
                    self.workers.processes[w].kill()
                    continue
                raise
            except BaseException as exc:  # interrupted half way: the worker waits for the rest
                self.status.fail(exc)
                raise

    # ---- rare commands ------------------------------------------------------------------------
    def call(self, name: str, targets: list[int], args: tuple) -> list[Any]:
        """Runs rare command ``name`` on the envs ``targets``; their answers, in that order.

        The engine checked that it may (state IDLE).  An exception an env raised is re-raised
        as itself and leaves the engine usable; an interruption or a dead worker breaks it.
        """
        call = RareCall(name, targets, args, self.workers.slices)
        try:
            self._send(call)
            self._read(call)
        except BaseException as exc:
            # Interrupted (or a worker died): an answer left in a pipe would be taken for the
            # next call's, and a worker posted but never sent its message waits for it.
            self.status.fail(exc)
            raise
        return call.result()

    # The two halves of call(), for call_async()/call_wait(): each breaks the engine as call() does.
    def send_call(self, call: RareCall) -> None:
        """Posts ``call`` to its workers and sends each its message (``call.result()`` after :meth:`read_answers`)."""
        try:
            self._send(call)
        except BaseException as exc:
            self.status.fail(exc)
            raise

    def answered(self, call: RareCall, timeout: float) -> bool:
        """Whether every worker of ``call`` has begun to answer, waiting up to ``timeout`` seconds
        for them; reads nothing.  :raises WorkerDiedError: a worker died (recorded)."""
        workers = self.workers
        deadline = time.monotonic() + timeout
        for w in call.workers:
            conn = workers.conns[w]
            while not conn.poll(0):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                ready = mp_wait([conn, workers.processes[w].sentinel], timeout=min(P.POLL_S, left))
                if ready and conn not in ready and not conn.poll(0):
                    self.check_alive(call.name, [w])
        return True

    def read_answers(self, call: RareCall) -> None:
        """Reads the answers of ``call`` (sent by :meth:`send_call`) into it: ``call.result()``."""
        try:
            self._read(call)
        except BaseException as exc:
            self.status.fail(exc)
            raise

    def _send(self, call: RareCall) -> None:
        links = self.workers.links
        assert links is not None
        for w in call.workers:  # post, then send (protocol, "Rare commands")
            links[w].post(P.Cmd.PIPE)
            try:
                self.send_bytes(w, call.messages[w], call.name)
            except (BrokenPipeError, ConnectionResetError):
                self.raise_if_died(w, call.name)
                raise

    def _read(self, call: RareCall) -> None:
        name = call.name
        answers: list[Any] = [None] * call.n_targets
        error: BaseException | None = None
        for w, idx in call.workers.items():
            data = self.recv_raw(w, name, raw_bytes=True)
            try:
                tag, payload = pickle.loads(data)
            except Exception as exc:  # read whole: the pipe is in step, the env stays usable
                exc.add_note(
                    f"shmvec: the answer of worker {w} ({envs_named(idx)}) to {name} pickled there but does "
                    "not unpickle in this process (an object only the worker can rebuild: a CUDA tensor, "
                    "a class the worker imported); return plain data (numbers, numpy arrays) instead."
                )
                error = error or exc
                continue
            if tag == P.Pipe.ERROR:
                if payload["command"] is None:  # the message did not unpickle in the worker
                    payload["command"] = f"{name} (unpickling its arguments in the worker)"
                error = error or unpack_exception(payload, CALL_HINT)
            elif tag == P.Pipe.CLOSED:
                self.exited_instead(w, name, payload)
            else:
                for pos, value in zip(call.positions[w], payload):
                    answers[pos] = value
        call.answers, call.error, call.done = answers, error, True
        error = None  # a local holding it would hold this frame (and the engine) through its traceback


class RareCall:
    """One rare command on some envs: each worker's message, pickled at once (an argument that
    does not pickle raises here, before anything is posted), then its answers once read."""

    def __init__(self, name: str, targets: list[int], args: tuple, slices: Any) -> None:
        groups = group_by_slice(targets, slices)  # answers go back by position (see there)
        self.name = name
        self.n_targets = len(targets)
        self.workers = {w: idx for w, (idx, _) in groups.items()}
        self.positions = {w: pos for w, (_, pos) in groups.items()}
        if name == P.Call.SET_WRAPPER_ATTR:  # one value per env: each worker gets only its own envs' values
            values = args[1]
            self.messages = {w: reduction.ForkingPickler.dumps((name, (idx, args[0], {i: values[i] for i in idx})))
                             for w, idx in self.workers.items()}
        else:
            self.messages = {w: reduction.ForkingPickler.dumps((name, (idx, *args)))
                             for w, idx in self.workers.items()}
        self.done = False  # answers read (or the env's error): the call is over
        self.answers: list[Any] = []
        self.error: BaseException | None = None

    def result(self) -> list[Any]:
        """The answers, in the order of the targets; raises the first env's error instead."""
        error, self.error = self.error, None
        if error is not None:
            try:
                raise error
            finally:
                error = None  # a local holding it would hold this frame (and the engine) through its traceback
        return self.answers
