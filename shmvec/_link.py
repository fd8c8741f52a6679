"""The parent's end of the shared words: one :class:`Link` per worker, and the set of them.

Every store the parent makes into the control words, and every read of a worker's answer, is
here (the protocol, steps 1-3, 7 and 8 of :mod:`shmvec._protocol`):

- :meth:`Links.arm` (step 1): PARENT_CPU and EARLY_WAKE before a post;
- :meth:`Links.post` (steps 2-3a): PENDING <- the number of workers posted (a command that
  counts), then per worker CMD <- code, CMD_SEQ <- its next sequence number (release);
  :meth:`Links.wake` (step 3b) wakes their sleepers once every one has its command;
  :meth:`Links.send` posts and wakes at once a command that PENDING does not count (PIPE, CLOSE);
- :meth:`Links.wait` (step 7): waits while PENDING differs from a target, spinning, then
  sleeping on the futex (with the early wake of the protocol's "Early wake");
- :meth:`Links.collect` and :meth:`Link.reply` (step 8): each worker's STATUS and RESULT_LEN,
  then its items from the mailbox or the pipe, or its packed exception from the pipe;
- :meth:`Link.put_arg` (step 1): a command's argument into mailbox w and ARG_LEN[w], or
  ARG_IN_PIPE when it does not fit (the caller sends it once the command is posted).

The sequence numbers are the links' own (:attr:`Links.seqs`, worker w's at ``seqs[w]``): the
last CMD_SEQ the parent stored for each worker, which DONE_SEQ equals once that worker is done
(:attr:`Link.done`).  Nothing else in the parent writes a control word, except OBS_BLOCK
(:meth:`shmvec._leases.Leases.pick`, handed :attr:`Links.words`); the pickled values of action
leaves without a fixed size go through :meth:`Link.put_arg` too (:class:`shmvec._actions.ActionWriter`).

The links wait on and read shared memory only: a pipe read is the caller's function
(``recv``, :meth:`shmvec._channel.Channel.recv_raw`, whose waits notice a dead worker), and what
a failure means for the engine's state is the caller's business.  The batch methods loop over
the workers in one frame: they run on every step.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from shmvec import _protocol as P
from shmvec._codec import load_result
from shmvec._errors import ShmVecEnvError, envs_named

_SEQ_MASK = 0xFFFFFFFF
_OK = int(P.Reply.OK)
_ERROR = int(P.Reply.ERROR)
BROKEN_HINT = "The vec env cannot go on: call close() and build a new one."


class Links:
    """The links of every worker of one engine: ``links[w]`` is worker w's :class:`Link`.

    :param words: the control words (:class:`shmvec._sync.Words`) of the shared block.
    :param slices: each worker's envs.
    """

    mailbox: np.ndarray | None = None  # (n_workers, mailbox_bytes) view of the block, once mapped
    begun = 0  # posts that began storing commands: an interrupted post tells by it whether any worker may have one

    def __init__(self, words: Any, slices: Sequence[range]) -> None:
        self.words = words
        self.seqs = [0] * len(slices)
        # (worker, CMD_SEQ, CMD, CMD_SLEEPERS) and (worker, STATUS, RESULT_LEN) word indices
        self._posts = [(w, P.word(w, P.CMD_SEQ), P.word(w, P.CMD), P.word(w, P.CMD_SLEEPERS))
                       for w in range(len(slices))]
        self._replies = [(w, P.word(w, P.STATUS), P.word(w, P.RESULT_LEN)) for w in range(len(slices))]
        self.links = [Link(self, w, sl) for w, sl in enumerate(slices)]

    def __getitem__(self, w: int) -> Link:
        return self.links[w]

    def __len__(self) -> int:
        return len(self.links)

    def use_mailbox(self, mailbox: np.ndarray) -> None:
        """The mailboxes' view of the block, once it is mapped (:meth:`release` drops it)."""
        self.mailbox = mailbox

    def release(self) -> None:
        """Drops the view of the block (before it is unmapped)."""
        self.mailbox = None

    # ---- posting ----------------------------------------------------------------------------------
    def arm(self, cpu: int) -> None:
        """Step 1's global words: PARENT_CPU <- ``cpu`` (the core the parent will sleep on; < 0:
        NO_CPU), EARLY_WAKE <- 0 (protocol, "Early wake")."""
        words = self.words
        words.store(P.PARENT_CPU, cpu if cpu >= 0 else P.NO_CPU)
        words.store(P.EARLY_WAKE, 0)

    def post(self, code: int, workers: Iterable[int] | None = None, count: bool = True) -> bool:
        """Steps 2-3a: PENDING <- how many workers are posted (with ``count``), then to each of
        ``workers`` (default all) CMD <- ``code`` and CMD_SEQ <- its next number (release).  Wakes
        nobody (:meth:`wake`).  Returns True, for ``posted = links.post(...)``: the caller learns
        in one line that every worker has its command.  :attr:`begun` is counted before the first
        command: an interrupted caller compares it to tell "none posted" from "some may be"."""
        words, seqs = self.words, self.seqs
        rows = self._posts if workers is None else [self._posts[w] for w in workers]
        if count:
            words.store(P.PENDING, len(rows))
        if rows:
            self.begun += 1
        for w, seq_word, cmd_word, _ in rows:
            seqs[w] = seq = (seqs[w] + 1) & _SEQ_MASK
            words.store(cmd_word, code)
            words.store(seq_word, seq)
        return True

    def wake(self, workers: Iterable[int] | None = None) -> None:
        """Step 3b: wakes the sleepers of ``workers`` (default all), once every one has its
        command (a worker woken on this core may take it at once)."""
        words = self.words
        rows = self._posts if workers is None else [self._posts[w] for w in workers]
        for _, seq_word, _, sleepers_word in rows:
            words.wake_sleepers(seq_word, sleepers_word)

    def send(self, code: int, workers: Iterable[int]) -> None:
        """Posts ``code`` to ``workers`` and wakes them, PENDING untouched (PIPE, CLOSE)."""
        workers = list(workers)
        self.post(code, workers, count=False)
        self.wake(workers)

    # ---- waiting ----------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """The PENDING word: how many posted workers have not completed their command."""
        return self.words.load(P.PENDING)

    def wait(self, spin: float, timeout: float, target: int = 0) -> bool:
        """Step 7: waits while PENDING differs from ``target`` (acquire); False when ``timeout``
        seconds pass without a change.  ``spin``: seconds to spin before each sleep (0: sleep at
        once, unless the worker on this core set EARLY_WAKE: then spin for the others)."""
        words = self.words
        pending = words.load(P.PENDING)
        while pending != target:
            if not spin and words.load(P.EARLY_WAKE):
                spin = P.EARLY_SPIN_S  # the worker on this core is done and asleep: spin for the rest
            value = words.wait_while(P.PENDING, pending, timeout, spin, P.PARENT_SLEEPERS)
            if value is None:
                return False
            pending = value
        return True

    def clear_pending(self) -> None:
        """PENDING <- 0: the restarts' wait went on without failed workers that never decremented it."""
        self.words.store(P.PENDING, 0)

    def late(self, workers: Iterable[int] | None = None) -> list[int]:
        """The workers (of ``workers``, default all) that have not completed their last command."""
        links = self.links
        return [w for w in (range(len(links)) if workers is None else workers) if not links[w].done]

    # ---- reading ----------------------------------------------------------------------------------
    def collect(self, command: str, read: Callable[[int, str], tuple[dict | None, list]]
                ) -> tuple[list[list], dict[int, dict]]:
        """Step 8, once PENDING is 0: each worker's items ([] for most: STATUS OK and nothing in
        RESULT_LEN), and the packed exception of each worker that failed.  ``read(w, command)``
        reads the others (:meth:`Link.reply`, through the caller's pipe)."""
        words = self.words
        results: list[list] = []
        errors: dict[int, dict] = {}
        for w, status_word, length_word in self._replies:
            if words.load(status_word) == _OK and not words.load(length_word):
                results.append([])
                continue
            packed, items = read(w, command)
            if packed is not None:
                errors[w] = packed
            results.append(items)
        return results, errors


class Link:
    """The parent's end of worker w's row of words and mailbox (see the module docstring)."""

    __slots__ = ("links", "w", "envs", "_arg_len", "_status", "_result_len", "_done_seq", "_sleepers", "_env_at")

    def __init__(self, links: Links, w: int, envs: range) -> None:
        self.links = links
        self.w = w
        self.envs = envs
        self._arg_len = P.word(w, P.ARG_LEN)
        self._status = P.word(w, P.STATUS)
        self._result_len = P.word(w, P.RESULT_LEN)
        self._done_seq = P.word(w, P.DONE_SEQ)
        self._sleepers = P.word(w, P.CMD_SLEEPERS)
        self._env_at = P.word(w, P.ENV_AT)

    @property
    def seq(self) -> int:
        """The last CMD_SEQ posted to this worker."""
        return self.links.seqs[self.w]

    def post(self, code: int) -> None:
        """Posts ``code`` to this worker alone and wakes it; PENDING untouched (PIPE, CLOSE)."""
        self.links.send(code, (self.w,))

    def put_arg(self, data: bytes) -> bytes | None:
        """Step 1: the command's argument (b"": none) into the mailbox and ARG_LEN; returns it when
        it does not fit (ARG_IN_PIPE): the caller sends it through the pipe once the command is posted."""
        links, n = self.links, len(data)
        # (No local name for a view of the block: a traceback would keep it mapped after close().)
        if n >= links.mailbox.shape[1]:
            links.words.store(self._arg_len, P.ARG_IN_PIPE)
            return data
        if n:
            links.mailbox[self.w, :n] = np.frombuffer(data, dtype=np.uint8)
        links.words.store(self._arg_len, n)
        return None

    @property
    def done(self) -> bool:
        """Whether DONE_SEQ is the last command's number: the worker completed it (step 6)."""
        return self.links.words.load(self._done_seq) == self.links.seqs[self.w]

    @property
    def by_pipe(self) -> bool:
        """Whether its answer is in its pipe (an error, or RESULT_IN_PIPE): read, it is gone."""
        words = self.links.words
        return words.load(self._status) == _ERROR or words.load(self._result_len) == P.RESULT_IN_PIPE

    def reply(self, command: str, recv: Callable[..., Any]) -> tuple[dict | None, list]:
        """Step 8 for this worker: (its packed exception, []) when STATUS is ERROR, else (None, its
        items): the mailbox's first RESULT_LEN bytes (the info codec or a pickle, told apart by
        ``load_result``), or a pickle in the pipe.  ``recv(w, command, raw_bytes=False)`` reads
        the pipe (:meth:`shmvec._channel.Channel.recv_raw`)."""
        links, w = self.links, self.w
        if links.words.load(self._status) == _ERROR:
            _, packed = recv(w, command)
            return packed, []
        n = links.words.load(self._result_len)
        try:
            if n == P.RESULT_IN_PIPE:
                return None, pickle.loads(recv(w, command, raw_bytes=True))
            return None, (load_result(links.mailbox[w, :n]) if n else [])
        except Exception as exc:
            if not isinstance(exc, ShmVecEnvError):  # (a dead worker, a timeout: they say it themselves)
                explain_unloadable(exc, w, self.envs, command)
            raise

    def env_at(self) -> int | None:
        """The env the worker is in by its ENV_AT word (a hint for error messages: the protocol's
        "How failures are noticed"), or None."""
        try:
            i = self.links.words.load(self._env_at)
        except ValueError:  # released
            return None
        return i if i in self.envs else None

    def clear_result(self) -> None:
        """RESULT_LEN <- 0 once read: a worker left out of the next STEP keeps its words until its
        next command, and a pipe result must not be read twice (close())."""
        self.links.words.store(self._result_len, 0)

    def forget_sleepers(self) -> None:
        """CMD_SLEEPERS <- 0 once the worker is gone: one killed in its futex wait stays counted."""
        self.links.words.store(self._sleepers, 0)


def explain_unloadable(exc: Exception, w: int, sl: range, command: str) -> None:
    """Notes on ``exc`` why worker ``w``'s result (of its envs ``sl``) may not load here."""
    exc.add_note(
        f"shmvec: the {command} result of worker {w} ({envs_named(sl)}) was written there "
        "but does not load in this process: an info holds an object only the worker can rebuild "
        "(a CUDA tensor, a class the worker imported, a lock). Return plain data in infos. " + BROKEN_HINT)
