"""The parent/worker protocol of shmvec: shared words, command codes, timings.

This module says what the words mean and in which order they are written; the parent's side of
it is written once, in :mod:`shmvec._link` (every store the parent makes into the control words,
every wait on PENDING, every read of a worker's answer), and the worker's in :mod:`shmvec._worker`.

Shared-memory layout (one ``multiprocessing.shared_memory`` block per vec env,
computed identically on both sides by :class:`shmvec._layout.Layout`)::

    control words   uint32, one 64-byte cache line per row:
                      row 0      PENDING PARENT_SLEEPERS PARENT_CPU EARLY_WAKE OBS_BLOCK
                                 (global)
                      row 1 + w  worker w: CMD_SEQ CMD ARG_LEN STATUS RESULT_LEN DONE_SEQ
                                 CMD_SLEEPERS ENV_AT
    actions         one buffer per leaf of the action space, (n_envs, *shape)
    observations    one buffer per leaf of the observation space, (n_envs, *shape)
    terminal obs    same shapes: the observation an episode ended on
    rewards         float64 (n_envs,) (ShmVecEnv hands SB3 float32, as DummyVecEnv)
    terminated      bool (n_envs,)
    truncated       bool (n_envs,)
    mailboxes       n_workers x mailbox_bytes: pickled seeds/options (and a
                    reset mask) going in, non-empty infos coming out (in the
                    info codec of shmvec._codec, first byte INFO_CODEC_MAGIC,
                    or pickled when the codec does not carry a value); and the
                    values of leaves without a fixed size (below)
    action masks    bool (n_envs, mask_size), only with action masks on
                    (shmvec._masks; mask_size travels in the attach message)
    lease blocks    K more sets of observation buffers, only with zero_copy on
                    (shmvec._leases; K travels in the attach message)

Worker w owns the envs ``[start_w, stop_w)``: a contiguous slice.

Who writes what, in which order (a synchronous command: STEP or RESET)
----------------------------------------------------------------------
Between commands every worker is idle and the parent owns every buffer.

  parent  1. writes the actions (STEP) and, per worker, an optional pickled
             argument into mailbox w and its length into ARG_LEN[w] (an
             argument too large for the mailbox: ARG_IN_PIPE, and the parent
             sends it through the worker's pipe right after step 3; the worker
             reads it first in step 5, watching CMD_SEQ as for a rare command);
             PARENT_CPU <- its core (STEP with a parent that sleeps) or NO_CPU;
             EARLY_WAKE <- 0; OBS_BLOCK <- the block the observations go to
             (0, or a lease block: shmvec._leases)
          2. PENDING <- n_workers            (no worker reads it yet)
          3. per worker: CMD[w] <- code; CMD_SEQ[w] <- seq (release); then, once
             every worker has its command, per worker:
             wake_sleepers(CMD_SEQ[w], CMD_SLEEPERS[w])
  worker  4. waits while CMD_SEQ[w] == last seen (acquire): steps 1-3 are visible
          5. steps its envs, writes observations (into block OBS_BLOCK), rewards,
             flags, terminal observations of its own slice; encodes (or pickles) the non-empty
             infos into mailbox w, RESULT_LEN[w] <- length (RESULT_IN_PIPE when
             they do not fit); STATUS[w] <- Reply.OK or Reply.ERROR.  The exception (ERROR)
             or the infos too large for the mailbox are only kept for now
          6. DONE_SEQ[w] <- seq (release); old <- fetch_add(PENDING, -1)
             (seq_cst: releases step 5); if old == 1:
             wake_sleepers(PENDING, PARENT_SLEEPERS); else, if PARENT_CPU is
             the core this worker runs on and CMD_SEQ[w] is still seq (no
             next command posted in the meantime): EARLY_WAKE <- 1,
             wake_sleepers(PENDING, PARENT_SLEEPERS), and its next wait sleeps
             at once (no spin)  (see "Early wake" below)
          6b. sends what step 5 kept (the exception, or the infos) through its
             pipe, *after* step 6: a message larger than the socket's buffer
             blocks the sender until the parent reads it, and the parent reads
             pipes only after step 7 (sent before step 6, it deadlocked both)
  parent  7. waits while PENDING != 0 (acquire: every worker's step 5 is visible)
          8. reads the buffers; for each worker whose STATUS is ERROR, or whose
             RESULT_LEN is RESULT_IN_PIPE, it receives that message from the
             worker's pipe (waiting on the pipe and the worker's sentinel).

Why it is safe: at any time each buffer region has one writer.  Ownership of
the actions and mailbox passes to the worker with the release/acquire pair on
CMD_SEQ, and ownership of the results passes back with the seq_cst decrement
of PENDING that the parent acquires when it reads 0.  The parent never
writes a shared buffer between steps 3 and 7, and a worker writes only its
own slice and mailbox, only between steps 4 and 6.  FUTEX_WAIT re-checks the
word in the kernel, so a wake between a waiter's last check and its sleep is
never lost.  A waiter counts itself in the *_SLEEPERS word before each
FUTEX_WAIT; a waker fences (seq_cst) after its store and skips the wake
syscall when the count is 0 -- either it sees the sleeper, or the sleeper's
FUTEX_WAIT sees the new value (csrc/shmvec_sync.h).  Waiters spin first
(yielding their core between bursts): the parent only when a core is free for
it, a worker only while the parent has lately answered within its budget.

Early wake (a sleeping parent on a core shared with a worker)
------------------------------------------------------------
With a worker on every core the parent does not spin (it would take half a
core from a worker): it sleeps on PENDING, on the core of one of the workers.
Woken by that worker, it runs within a few microseconds.  Woken by the worker
on another core, the wake-up crosses cores (an inter-processor interrupt, which
a virtual machine makes dear) and lands where the first worker is spinning: it
ran 24 us late on average on the 2-vCPU machine we measure on.  So a worker
that finishes while others still step, and finds the parent asleep on its own
core (PARENT_CPU, from sched_getcpu: a hint, since either may move), sets
EARLY_WAKE, wakes the parent (same core) and sleeps instead of spinning.  The
parent, seeing PENDING != 0 and EARLY_WAKE set, spins (up to EARLY_SPIN_S,
then sleeps again) on the core the worker has left, and sees the last worker's
decrement without being woken.  The next post wakes the sleeping worker with a
system call on the same core; the parent wakes sleepers only after every
worker has its command, because the woken worker may take the core at once.

Safety does not depend on the hint: the last worker to decrement PENDING still
calls wake_sleepers (a no-op when the parent spins), and a parent woken early
that missed EARLY_WAKE just sleeps again.  A wrong hint costs time only.

Leaves without a fixed size (Text, Sequence, Graph, OneOf, custom spaces)
------------------------------------------------------------------------
Such a leaf has no buffer; its values ride on the messages above
(shmvec._pickled_leaves).  With a pickled action leaf, step 1 of every STEP
writes each worker's pickled action values into its mailbox and ARG_LEN[w]
(ARG_IN_PIPE and the pipe when larger), and the worker reads them first in
step 5.  With a pickled observation leaf, every STEP and RESET result of step
5 is (items, the slice's values of each such leaf, the terminal values of the
envs that ended) in place of the items, encoded and sent as results are.

Action masks (sb3-contrib's MaskablePPO)
----------------------------------------
Each worker learns whether its envs have action_masks() when it reports its
spaces; the parent decides (the ``action_masks`` option) and sends mask_size
with "attach".  In step 5 of STEP and RESET the worker also calls
action_masks() of each env of its slice (after the automatic reset that ends
an episode) and writes row i of the mask buffer; the same release/acquire
pair hands the rows to the parent.  After a set_attr or env_method pipe
command (once a RESET has run) the worker rewrites the rows of the envs it
touched before it answers; the pipe's reply (a system call on each side)
orders those writes before the parent's read.  The parent answers
env_method("action_masks") (no arguments) and action_masks() from the
buffer, between commands only, sending nothing.

Autoreset modes (fixed per vec env, given to each worker at start)
-----------------------------------------------------------------
- same_step (SB3's VecEnv, Gymnasium's SAME_STEP): an env that ends in a STEP
  writes its last observation into terminal obs and is reset in the same
  STEP; the observation slot holds the reset observation.  Its item in the
  mailbox is (index, step info, reset info) when either is non-empty.
- next_step (Gymnasium's NEXT_STEP): the worker remembers which envs ended;
  on the next STEP it resets them instead of stepping them (their action is
  ignored, reward 0, flags False, the reset info is their info).
- disabled (Gymnasium's DISABLED): never resets; the parent refuses to step an
  env that ended until a RESET with a mask (the third element of the pickled
  RESET argument, one bool per env of the worker's slice) has reset it.
A RESET clears the worker's memory of ended envs for the envs it resets.

Rare commands (every :class:`Call`: get_attr, env_method, render, ..., pool_attach)
----------------------------------------------------------------------------------
The parent pickles ``(name, args)`` for every worker it calls (an argument
that does not pickle fails here, before anything is posted), then per worker:
CMD[w] <- PIPE, bumps CMD_SEQ[w] and wakes it (a sleeping worker waits on the
futex, not on the pipe), and only then sends the message: a worker already
reading its pipe drains a message larger than the socket's buffer (sent
first, it blocked the parent in send() forever).  The worker receives (polling
for the parent's death), runs it, and answers on the pipe; any exception,
even a SystemExit from an env or an argument that does not unpickle in the
worker, is the answer.  PENDING is not used.  An exception in the parent once
a worker has been posted (Ctrl-C) marks the vec env broken: an answer left in
a pipe would be taken for the next call's.  A worker waiting for a message
that never comes, or for the rest of one whose sending was interrupted, watches
CMD_SEQ meanwhile (it reads the message in pieces), so the CLOSE that follows
reaches it at once; it never reads that pipe again.

POOL (the asynchronous pool, shmvec._pool): a synchronous command like STEP
whose body serves single envs from the worker's in queue until it pops STOP;
its completion (steps 5-8 above) happens when the pool stops.

CLOSE: CMD[w] <- CLOSE and bump; the worker closes its envs, sends a last
message (None, or the first exception) and exits.

How failures are noticed
------------------------
- An env raises (any BaseException, SystemExit included): the worker marks
  STATUS=ERROR, completes the command normally, then sends the exception with
  its traceback through the pipe, so the parent never waits for a reply that
  will not come.  In the parent an exception that is not an ``Exception``
  (SystemExit, KeyboardInterrupt) arrives as a RemoteEnvError of that name: a
  worker's sys.exit() must not end the caller's program.
- A worker exits without answering (its last message, "closed", arrives where
  an answer was awaited): WorkerDiedError naming the worker, its envs, the
  command and the exit code, never the "closed" message taken as the answer.
- A worker dies: the parent's waits time out every POLL_S and then look at
  every worker's process sentinel; a dead one raises WorkerDiedError with its
  exit code or signal.  Pipe reads wait on the pipe and the sentinel together.
- Where a dead or stuck worker was (shmvec._crash): every worker writes
  faulthandler's report into a pipe of its own (the crash pipe: the parent
  holds the read end, the worker the non-blocking write end).  On a fatal
  signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) faulthandler writes the
  Python stack of every thread there before the process dies; the parent
  reads it once the worker is gone and attaches it to WorkerDiedError.  On a
  timeout the parent sends DUMP_SIGNAL to the late worker (only if the worker
  catches it: /proc/<pid>/status), faulthandler writes the stacks without
  stopping it, and the parent attaches them to WorkerTimeoutError.
  ENV_AT[w] says which env worker w is in: only the worker writes it, with
  relaxed stores, and the parent reads it only as a hint for these messages
  (after the worker died, or while it hangs), never to decide anything.  At
  the start of each synchronous command (STEP, RESET, POOL) the worker stores
  the first env of its slice; while it steps its envs in order, the observation writer (RowWriter, in C) stores
  i + 1 once env i's observation is in place, so that no Python store is
  added per env.  The pool (envs in any order) stores i before each env.
  Elsewhere (RESET, rare commands, masks, close) each assignment of the
  worker's ``current`` stores it, and NO_ENV when the worker is back in its
  own code.  A value outside the slice means "in none".
- The parent dies: each worker's wait times out every PARENT_POLL_S and
  checks the parent through a pidfd (or its pid); the worker then exits.  The
  segment itself was unlinked once every worker had attached, so nothing stays
  in /dev/shm whatever dies.

Restarting a worker (on_failure="restart"; shmvec._restarts)
-------------------------------------------------------------
The parent waits until every live worker has answered: PENDING reaches the
number of failed workers that never decremented it (a worker writes DONE_SEQ
before its decrement, so DONE_SEQ[w] != seq[w] tells them), then stores
PENDING <- 0.  It stops the failed worker (a live one gets CLOSE, with its own
bump of CMD_SEQ[w]), reaps it and zeroes CMD_SLEEPERS[w] (a worker killed in
its futex wait stays counted).  The new worker cannot open the segment by name
(unlinked): after its "spaces" message the parent sends ("attach_fd", an
Attach record of shmvec._startup_args) and then the segment's descriptor itself (SCM_RIGHTS through the worker's
pipe, multiprocessing.reduction.send_handle); the worker maps it
(shmvec._segment.FdSegment), reads CMD_SEQ[w] as its last seen command and
answers "ready".  The parent then posts RESET to the new workers only
(PENDING <- their number), and writes the truncation report of their envs
(rewards, flags, terminal observations) into their own slices, which it owns
again once PENDING is 0.  Workers restarted outside a step (a dead worker found
before a rare command) are left out of the next STEP: the parent bumps only the
others' CMD_SEQ and sets PENDING to their number.
"""

from __future__ import annotations

import enum

# Row 0 of the control words holds the global counter and how many parents sleep on it, the
# core the parent sleeps on during a STEP (NO_CPU otherwise) and the early-wake flag.
PENDING = 0
PARENT_SLEEPERS = 1
PARENT_CPU = 2
EARLY_WAKE = 3
OBS_BLOCK = 4  # where this command's observations go: 0, or a lease block (shmvec._leases)
NO_CPU = 0xFFFFFFFF
# Each row is one cache line of 16 uint32 words.
ROW_WORDS = 16
# Offsets of a worker's words within its row (row 1 + w).
CMD_SEQ = 0
CMD = 1
ARG_LEN = 2
STATUS = 3
RESULT_LEN = 4
DONE_SEQ = 5
CMD_SLEEPERS = 6
ENV_AT = 7  # the env the worker is in (a hint for error messages: "How failures are noticed")
NO_ENV = 0xFFFFFFFF

# RESULT_LEN when the result did not fit in the mailbox and went through the pipe.
RESULT_IN_PIPE = 0xFFFFFFFF
# ARG_LEN when a reset's argument (seeds, options) does not fit in the mailbox: the parent sends
# it through the worker's pipe once the command is posted, and the worker reads it first.
ARG_IN_PIPE = 0xFFFFFFFF


class Cmd(enum.IntEnum):
    NONE = 0
    STEP = 1
    RESET = 2
    PIPE = 3
    CLOSE = 4
    POOL = 5  # serve the asynchronous pool until STOP (shmvec._pool)


class Reply(enum.IntEnum):
    """The values of a worker's STATUS word: how its last synchronous command ended."""

    OK = 0
    ERROR = 1


class Pipe(enum.StrEnum):
    """The tag of a message on a worker's pipe (a ``(tag, payload)`` pair).  String values: a
    tag compares equal to its plain string, and a message pickles as small as before."""

    # parent -> worker, during the handshake
    ATTACH = "attach"  # map the block by name (first start)
    ATTACH_FD = "attach_fd"  # map the block from the descriptor that follows (a restart)
    ABORT = "abort"  # the parent gave up during the handshake: exit
    # worker -> parent
    # handshake 1: the first env's spaces, render mode, metadata, mask support, and every env's
    # observation space where they differ (the parent checks them against its observation_mode)
    SPACES = "spaces"
    READY = "ready"  # handshake 2: attached, serving the words
    OK = "ok"  # a rare command's answer
    ERROR = "error"  # an exception, packed (shmvec._errors.pack_exception)
    CLOSED = "closed"  # the worker's last message: it is exiting (with what env.close() raised)


class Call(enum.StrEnum):
    """The rare commands: sent on the pipe as ``(call, args)`` once ``Cmd.PIPE`` is posted."""

    GET_ATTR = "get_attr"
    HAS_ATTR = "has_attr"
    SET_ATTR = "set_attr"
    ENV_METHOD = "env_method"
    CALL = "call"  # Gymnasium's VectorEnv.call: call it if callable, else return it
    SET_WRAPPER_ATTR = "set_wrapper_attr"  # Gymnasium's VectorEnv.set_attr: {env index: value}
    IS_WRAPPED = "is_wrapped"
    RENDER = "render"
    ACTION_MASKS = "action_masks"  # the parent's first ask for masks: now, then after every step
    ACTION_MASKS_OFF = "action_masks_off"  # the first ask failed in another worker: all stay off
    POOL_ATTACH = "pool_attach"  # once per worker: attach the pool's segment (shmvec._pool)


def word(worker: int, offset: int) -> int:
    """Index of a worker's word in the control array."""
    return (1 + worker) * ROW_WORDS + offset


# How often a waiting parent checks that its workers are alive (seconds).
POLL_S = 0.05
# How often an idle worker checks that its parent is alive (seconds).
PARENT_POLL_S = 0.2
# Longest spin of an idle pool worker before it sleeps on its queue (seconds).
POOL_SPIN_S = 1e-3
# Shortest spin before a futex sleep (seconds): catches answers already on their way.
MIN_SPIN_S = 2e-6
# How long a parent woken early by the worker on its core spins for the others (seconds).
EARLY_SPIN_S = 5e-3
# A parent that usually takes longer than this between two commands computes there (a policy's
# forward pass): the worker on its core sleeps instead of spinning (seconds; docs/design.md).
PARENT_COMPUTES_S = 5e-5
# Autoreset modes of a worker (see the module docstring).
AUTORESET_SAME_STEP = "same_step"
AUTORESET_NEXT_STEP = "next_step"
AUTORESET_DISABLED = "disabled"
AUTORESET_MODES = (AUTORESET_SAME_STEP, AUTORESET_NEXT_STEP, AUTORESET_DISABLED)

# How often a worker waiting for a rare command's message (posted, not yet sent) checks for a
# newer command: a parent interrupted between the post and the send closes it with CLOSE.
PIPE_WAIT_POLL_S = 0.02

# Default size of each worker's mailbox (bytes); larger results use the pipe.
MAILBOX_BYTES = 1 << 20

# The info key that marks an env restarted by on_failure="restart" (shmvec._restarts).
RESTART_INFO_KEY = "shmvec_restarted"
