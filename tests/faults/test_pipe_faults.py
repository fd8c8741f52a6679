"""Messages through the workers' pipes: larger than a socket's buffer, failing to pickle or to
unpickle on either side, a worker's ``sys.exit()``, and interrupts while a command is being
posted.  Each of these once hung, lost the error's type, or left an answer in a pipe that the
next call took for its own (protocol: ``shmvec/_protocol.py``, step 6b and "Rare commands").
"""

from __future__ import annotations

import functools
import signal
import time

import numpy as np
import psutil
import pytest

import faultenvs
import testenvs
from helpers import assert_same, close_all
from shmvec import BrokenVecEnvError, RemoteEnvError, ShmVecEnv, TooManyRestartsError, WorkerDiedError
from shmvec import _protocol as P
from shmvec._channel import Channel

# Far more than a Unix socket's buffer (about 200 KB here): sent at the wrong moment, it deadlocks.
HUGE = 2_000_000


def _pipe_envs(n: int = 4, bad: int | None = None, **kwargs) -> list:
    return [functools.partial(testenvs.make_pipe_env, i, **(kwargs if bad in (None, i) else {})) for i in range(n)]


def _env(fns: list, **kwargs) -> ShmVecEnv:
    kwargs.setdefault("timeout", 30.0)  # a regression shows as WorkerTimeoutError, not as a hung suite
    return ShmVecEnv(fns, n_workers=2, start_method="fork", **kwargs)


def _actions(n: int = 4) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


@pytest.mark.parametrize("mailbox_bytes", [4096, None])
def test_infos_larger_than_the_mailbox_and_the_pipe_buffer_arrive(mailbox_bytes):
    kwargs = {} if mailbox_bytes is None else {"mailbox_bytes": mailbox_bytes}
    env = _env(_pipe_envs(how="info", at=2, huge=HUGE), **kwargs)
    try:
        env.reset()
        env.step(_actions())
        _, _, _, infos = env.step(_actions())
        for i, info in enumerate(infos):
            assert info["blob"].shape == (HUGE // 8,) and (info["blob"] == i).all()
        env.step(_actions())  # and the pipes are in step afterwards
        assert env.get_attr("tag") == [0, 1, 2, 3]
    finally:
        env.close()


def test_an_exception_larger_than_the_pipe_buffer_arrives_as_itself():
    env = _env(_pipe_envs(bad=3, how="raise", at=2, huge=HUGE))
    try:
        env.reset()
        env.step(_actions())
        with pytest.raises(RuntimeError, match="a large exception") as info:
            env.step(_actions())
        assert info.value.args[1].shape == (HUGE // 8,)
        assert any("env 3" in note and "step" in note for note in info.value.__notes__)
    finally:
        env.close()


@pytest.mark.parametrize("method", ["set_attr", "env_method"])
def test_rare_commands_carry_arguments_larger_than_the_pipe_buffer(method):
    env = _env(_pipe_envs())
    try:
        blob = b"x" * HUGE
        if method == "set_attr":
            env.set_attr("payload", blob)
            assert [len(x) for x in env.get_attr("payload")] == [HUGE] * 4
        else:
            assert env.env_method("size_of", blob, indices=[1, 2]) == [HUGE, HUGE]
        env.reset()
        env.step(_actions())
    finally:
        env.close()


def test_sys_exit_in_an_env_step_is_an_error_of_that_env_not_an_exit():
    env = _env(_pipe_envs(bad=2, how="exit", at=2))
    try:
        env.reset()
        env.step(_actions())
        with pytest.raises(RemoteEnvError) as info:
            env.step(_actions())
        assert info.value.type_name == "builtins.SystemExit" and info.value.message == "5"
        assert any("env 2" in note and "step" in note for note in info.value.__notes__)
        assert "sys.exit(5)" in info.value.__cause__.tb
        with pytest.raises(BrokenVecEnvError):
            env.step(_actions())
    finally:
        env.close()


def test_sys_exit_in_env_method_is_the_answer_and_the_env_stays_usable():
    env = _env(_pipe_envs())
    try:
        with pytest.raises(RemoteEnvError, match="SystemExit") as info:
            env.env_method("exit_now", indices=[3])
        assert any("env 3" in note and "env_method" in note for note in info.value.__notes__)
        assert all(p.is_alive() for p in env._engine.workers.processes)
        env.reset()
        env.step(_actions())
        assert env.get_attr("tag") == [0, 1, 2, 3]
    finally:
        env.close()


def test_an_argument_that_does_not_unpickle_in_the_worker_is_the_answer():
    env = _env(_pipe_envs())
    try:
        with pytest.raises(LookupError, match="only the worker") as info:
            env.set_attr("thing", testenvs.RaiseOnLoad(), indices=[0])
        assert any("set_attr" in note for note in info.value.__notes__)
        assert env.get_attr("tag") == [0, 1, 2, 3]  # no answer was left behind in a pipe
    finally:
        env.close()


def test_an_argument_that_does_not_pickle_is_refused_before_anything_is_posted():
    env = _env(_pipe_envs())
    try:
        with pytest.raises(Exception, match="pickle"):
            env.set_attr("thing", lambda: None if False else __import__("threading").Lock())
        assert env.get_attr("tag") == [0, 1, 2, 3]
    finally:
        env.close()


def test_an_answer_that_does_not_unpickle_here_names_the_worker_and_leaves_the_env_usable():
    env = _env(_pipe_envs())
    try:
        with pytest.raises(LookupError) as info:
            env.env_method("unloadable", indices=[0, 3])
        assert any("worker 0" in note and "env_method" in note and "unpickle" in note for note in info.value.__notes__)
        assert env.env_method("size_of", "abc") == [3] * 4  # both workers' answers were read
        env.reset()
        env.step(_actions())
    finally:
        env.close()


def test_an_exception_whose_str_raises_still_arrives():
    env = _env(_pipe_envs(bad=1, how="bad_str", at=1))
    try:
        env.reset()
        with pytest.raises(testenvs.BadStrError) as info:
            env.step(_actions())
        assert any("env 1" in note for note in info.value.__notes__)
    finally:
        env.close()


def test_a_reward_numpy_cannot_convert_names_its_env():
    env = _env(_pipe_envs(bad=3, how="reward", at=2))
    try:
        env.reset()
        env.step(_actions())
        with pytest.raises(ValueError) as info:
            env.step(_actions())
        assert any("env 3" in note and "step" in note for note in info.value.__notes__)
    finally:
        env.close()


def test_metadata_that_does_not_pickle_fails_construction_saying_so():
    with pytest.raises(Exception) as info:
        _env([testenvs.make_lock_metadata_env] * 2)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "metadata" in notes and "env construction" in notes, (info.value, notes)


def test_metadata_holding_a_lambda_arrives_through_cloudpickle():
    env = _env([testenvs.make_lambda_metadata_env] * 2)
    try:
        assert callable(env.metadata["hook"]) and env.metadata["hook"]() is None
    finally:
        env.close()


class _InterruptAfter:
    """Stands in for the shared words and raises KeyboardInterrupt at the n-th store (a Ctrl-C
    landing between two bytecodes of a post)."""

    def __init__(self, words, n: int) -> None:
        self._words, self._left = words, n

    def store(self, *args):
        self._left -= 1
        if self._left == 0:
            raise KeyboardInterrupt
        return self._words.store(*args)

    def __getattr__(self, name):
        return getattr(self._words, name)


@pytest.mark.parametrize("n", [2, 3, 5, 7])
def test_an_interrupt_while_a_step_is_posted_breaks_the_env_once_a_worker_may_have_it(n):
    """Stores 1-3 (PARENT_CPU, EARLY_WAKE, PENDING) come before any worker's command: nothing was
    sent, and the env goes on.  From store 4 (worker 0's CMD) until worker 1's CMD_SEQ (store 7),
    a worker may run a step that nobody waits for: the env is broken."""
    env = _env(_pipe_envs())
    try:
        env.reset()
        env.step(_actions())
        words = env._engine.words
        env._engine.words = _InterruptAfter(words, n)
        with pytest.raises(KeyboardInterrupt):
            env.step(_actions())
        env._engine.words = words
        assert not env.waiting
        if n <= 3:
            assert env._engine.status.failure is None
            env.step(_actions())
            assert env.get_attr("tag") == [0, 1, 2, 3]
        else:
            with pytest.raises(BrokenVecEnvError):
                env.step(_actions())
    finally:
        env.close()


def _interrupt_on_entry(obj, name: str, after: bool = False) -> None:
    """The next call of ``obj.name`` raises KeyboardInterrupt as it begins (``after``: as it
    returns), once: a Ctrl-C that lands between two calls, outside any try of theirs."""
    orig = getattr(obj, name)

    def interrupted(*args, **kwargs):
        delattr(obj, name)
        if after:
            orig(*args, **kwargs)
        raise KeyboardInterrupt

    setattr(obj, name, interrupted)


def test_a_step_interrupted_between_its_post_and_its_wait_is_left_for_step_wait():
    """Posted, then interrupted before the wait began: the step stays in flight (it was dropped,
    the env neither waiting nor broken, and the next post landed under running workers)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import AlreadyPendingCallError

    fns = testenvs.spaces_env_fns("box", "discrete", 4)
    ref, env = DummyVecEnv(fns), _env(fns)
    try:
        ref.seed(5)
        env.seed(5)
        assert_same(env.reset(), ref.reset(), "reset")
        rng = np.random.default_rng(0)
        for t in range(8):
            act = rng.integers(0, 3, size=4)
            if t == 2:  # env.step(): interrupted as its wait begins
                _interrupt_on_entry(env._engine, "complete")
                with pytest.raises(KeyboardInterrupt):
                    env.step(act)
            elif t == 5:  # step_async(): interrupted as the post returns
                _interrupt_on_entry(env._engine, "post", after=True)
                with pytest.raises(KeyboardInterrupt):
                    env.step_async(act)
            if t in (2, 5):
                assert env.waiting and env._engine.status.failure is None
                with pytest.raises(AlreadyPendingCallError):
                    env.step(act)
                got = env.step_wait()
            else:
                got = env.step(act)
            assert_same(got, ref.step(act), f"step {t}")
        _interrupt_on_entry(env._engine, "post", after=True)
        with pytest.raises(KeyboardInterrupt):
            env.step_async(_actions())
        start = time.monotonic()
        env.close()  # waits for the step in flight, then closes politely
        assert time.monotonic() - start < 3.0
    finally:
        close_all(env, ref)


def test_a_reset_interrupted_between_its_post_and_its_wait_breaks_the_env():
    env = _env(_pipe_envs())
    try:
        env.reset()
        _interrupt_on_entry(env._engine, "complete")
        with pytest.raises(KeyboardInterrupt):
            env.reset()
        with pytest.raises(BrokenVecEnvError):
            env.reset()
        with pytest.raises(BrokenVecEnvError):
            env.step(_actions())
        start = time.monotonic()
        env.close()
        assert time.monotonic() - start < 3.0
    finally:
        env.close()


@pytest.mark.parametrize("where", ["complete", "post_step"])
def test_a_vector_env_step_interrupted_before_its_wait_is_finished_by_reset(where):
    """Gymnasium's API has no step_wait() to resume with: every call but reset() and close() says
    to reset, and reset() finishes the step, drops it, and resets.  (As step_async returned, the
    env was left waiting for ever; before the wait, it was broken.)"""
    from gymnasium.vector import SyncVectorEnv

    from shmvec import AlreadyPendingCallError, ShmVectorEnv

    ref = SyncVectorEnv(_pipe_envs())
    envs = ShmVectorEnv(_pipe_envs(), n_workers=2, start_method="fork", timeout=30.0)
    try:
        assert_same(envs.reset(seed=0), ref.reset(seed=0))
        assert_same(envs.step(_actions()), ref.step(_actions()))
        _interrupt_on_entry(envs._engine, where, after=where == "post_step")
        with pytest.raises(KeyboardInterrupt):
            envs.step(_actions())
        assert envs._engine.status.waiting and envs._engine.status.failure is None
        with pytest.raises(AlreadyPendingCallError, match="call reset"):
            envs.step(_actions())
        with pytest.raises(AlreadyPendingCallError, match="call reset"):
            envs.get_attr("tag")
        assert_same(envs.reset(seed=1), ref.reset(seed=1))
        assert_same(envs.step(_actions()), ref.step(_actions()))
    finally:
        close_all(envs, ref)


def test_an_interrupt_while_a_rare_command_is_sent_breaks_the_env():
    env = _env(_pipe_envs())
    try:
        conn = env._engine.workers.conns[1]

        def interrupted(data):
            raise KeyboardInterrupt

        conn.send_bytes = interrupted  # worker 0 has its command and message; worker 1 is posted
        with pytest.raises(KeyboardInterrupt):
            env.get_attr("tag")
        del conn.send_bytes
        with pytest.raises(BrokenVecEnvError):
            env.get_attr("tag")  # never worker 0's stale answer
        procs = [psutil.Process(p.pid) for p in env._engine.workers.processes]
        start = time.monotonic()
        env.close()  # worker 1 waits for a message that never comes: it must still see CLOSE
        assert time.monotonic() - start < 2.0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    finally:
        env.close()


def test_close_reads_past_a_leftover_answer_that_does_not_unpickle():
    """An answer nobody read (here: posted by hand) is drained at close(); one that does not
    unpickle in this process must not stop close() half way."""
    env = _env(_pipe_envs())
    w = 0
    env._engine.seqs[w] = (env._engine.seqs[w] + 1) & 0xFFFFFFFF
    env._engine.words.store(P.word(w, P.CMD), P.Cmd.PIPE)
    env._engine.words.store(P.word(w, P.CMD_SEQ), env._engine.seqs[w])
    env._engine.words.wake(P.word(w, P.CMD_SEQ))
    env._engine.workers.conns[w].send(("env_method", ([0], "unloadable", (), {})))
    deadline = time.monotonic() + 10
    while not env._engine.workers.conns[w].poll(0.05) and time.monotonic() < deadline:
        pass
    env.close()  # the conftest fixture fails the test on any descriptor, mapping or process left
    assert env._engine.workers is None or env._engine.workers.released


def test_an_interrupt_during_close_still_stops_every_worker():
    fns = [functools.partial(faultenvs.make_crash_env, i, **({"at": 0, "how": "hang", "where": "close"} if i == 0
                                                              else {})) for i in range(4)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork")
    env.reset()
    procs = list(env._engine.workers.processes)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # worker 0 hangs in env.close(): close() joins it
    try:
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            env.close()
        assert time.monotonic() - start < 4.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert all(p._closed for p in procs)  # terminated, reaped and closed before the interrupt went on
    env.close()  # nothing left to do


def test_two_workers_failing_past_max_restarts_count_no_restart():
    fns = _pipe_envs(how="raise", at=2, huge=1000)
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart", max_restarts=1)
    try:
        env.reset()
        env.step(_actions())
        with pytest.raises(TooManyRestartsError, match="2 workers failed"):
            env.step(_actions())
        assert env.restarts == 0
    finally:
        env.close()


def test_a_worker_exiting_instead_of_answering_is_reported_as_died():
    env = _env(_pipe_envs())
    try:
        w = 1
        env._engine.seqs[w] = (env._engine.seqs[w] + 1) & 0xFFFFFFFF  # an unknown command code: the worker loop fails
        env._engine.words.store(P.word(w, P.CMD), 99)
        env._engine.words.store(P.word(w, P.CMD_SEQ), env._engine.seqs[w])
        env._engine.words.wake(P.word(w, P.CMD_SEQ))
        with pytest.raises(WorkerDiedError, match="worker 1 .* exited during get_attr without answering"):
            env._engine.channel.recv(w, "get_attr", "")
        with pytest.raises(BrokenVecEnvError):
            env.get_attr("tag")
    finally:
        env.close()


def test_an_interrupt_during_the_attach_handshake_closes_the_workers_at_once(monkeypatch):
    """Ctrl-C while the parent waits for worker 1's "ready" (worker 0 serves already)."""
    recv = Channel.recv

    def interrupted(self, w, command, hint):
        if command == "attach" and w == 1:
            time.sleep(0.3)  # both workers have attached by now
            raise KeyboardInterrupt
        return recv(self, w, command, hint)

    monkeypatch.setattr(Channel, "recv", interrupted)
    fns = [functools.partial(testenvs.make_pipe_env, i) for i in range(4)]
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ShmVecEnv(fns, n_workers=2, start_method="fork")
    assert time.monotonic() - start < 3.0  # no 5 s wait for a SIGTERM: CLOSE reached them


def test_restart_mode_restarts_a_worker_that_dies_once_done_before_its_message_is_out():
    """Worker 1 completes its step (PENDING decremented) and is blocked sending 2 MB of infos when
    it is killed: on_failure="restart" restarts it like any other failure, and its envs are
    reported as truncated."""
    import os
    import warnings

    from shmvec import WorkerRestartWarning

    env = _env(_pipe_envs(bad=3, how="info", at=2, huge=HUGE), mailbox_bytes=4096, on_failure="restart")
    try:
        env.reset()
        env.step(_actions())
        env.step_async(_actions())
        deadline = time.monotonic() + 10
        while env._engine.words.load(P.PENDING) != 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # worker 1 is in send(): the socket's buffer holds a part of the message
        os.kill(env._engine.workers.processes[1].pid, signal.SIGKILL)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, _, dones, infos = env.step_wait()
        assert any(issubclass(w.category, WorkerRestartWarning) for w in caught)
        assert dones[2:].all() and all("shmvec_restarted" in infos[i] for i in (2, 3))
        assert "SIGKILL" in infos[3]["shmvec_restarted"]
        assert not dones[:2].any() and env.restarts == 1
        env.step(_actions())
    finally:
        env.close()


def _half_then_interrupted(env):
    """Stands in for ShmVecEnv._send_bytes: writes the frame's header and half the message to the
    worker, then raises KeyboardInterrupt (a Ctrl-C in the middle of a large send)."""

    def send(w, data, command):
        n = len(data)
        env._engine.workers.conns[w]._send(n.to_bytes(4, "big", signed=True) + bytes(data[: n // 2]))
        raise KeyboardInterrupt

    return send


def test_an_interrupt_in_the_middle_of_a_large_message_still_closes_the_worker_gracefully():
    """Ctrl-C while send_bytes() is half way through a large argument: the worker holds half a
    message.  close() must reach it at once (CLOSE through shared memory), and the worker must
    close its envs and exit by itself (exit code 0), not wait out the 5 s before SIGTERM."""
    env = _env(_pipe_envs())
    try:
        env._engine.channel.send_bytes = _half_then_interrupted(env)
        with pytest.raises(KeyboardInterrupt):
            env.env_method("size_of", b"x" * HUGE, indices=[2])
        del env._engine.channel.send_bytes
        with pytest.raises(BrokenVecEnvError):
            env.get_attr("tag")
        codes = {}
        for p in env._engine.workers.processes:  # the exit codes, read before close() closes the objects
            p.close = functools.partial(lambda p, close: (codes.setdefault(p.name, p.exitcode), close()), p, p.close)
        start = time.monotonic()
        env.close()
        assert time.monotonic() - start < 2.0
        assert sorted(codes.values()) == [0, 0], codes
    finally:
        env.close()


@pytest.mark.parametrize("face", ["ShmVecEnv", "ShmVectorEnv"])
def test_reset_options_larger_than_the_mailbox_go_through_the_pipe(face):
    """A 1 MiB level map in the reset options (more than the mailbox): sent through the worker's
    pipe once RESET is posted, as DummyVecEnv / SyncVectorEnv pass any options."""
    from shmvec import ShmVectorEnv

    fns = [functools.partial(testenvs.make_pipe_env, i) for i in range(4)]
    level = np.arange(HUGE // 8, dtype=np.int64)
    if face == "ShmVecEnv":
        env = _env(fns, mailbox_bytes=4096)
        try:
            env.set_options({"level": level})
            env.reset()
            assert env.env_method("last_option_sum") == [int(level.sum())] * 4
            env.set_options([{"level": level[: 10 * (i + 1)]} for i in range(4)])
            env.reset()
            assert env.env_method("last_option_sum") == [int(level[: 10 * (i + 1)].sum()) for i in range(4)]
        finally:
            env.close()
    else:
        env = ShmVectorEnv(fns, n_workers=2, start_method="fork", mailbox_bytes=4096)
        try:
            env.reset(seed=1, options={"level": level})
            assert env.call("last_option_sum") == (int(level.sum()),) * 4
        finally:
            env.close()


def test_an_interrupt_while_large_reset_options_are_sent_breaks_the_env_and_close_is_prompt():
    env = _env(_pipe_envs(), mailbox_bytes=4096)
    try:
        env._engine.channel.send_bytes = _half_then_interrupted(env)
        env.set_options({"level": np.zeros(HUGE // 8)})
        with pytest.raises(KeyboardInterrupt):
            env.reset()
        del env._engine.channel.send_bytes
        with pytest.raises(BrokenVecEnvError):
            env.reset()
        start = time.monotonic()
        env.close()
        assert time.monotonic() - start < 3.0
    finally:
        env.close()


@pytest.mark.parametrize("on_failure", ["raise", "restart"])
def test_a_worker_that_does_not_read_a_large_argument_times_out(on_failure):
    """Alive but not reading its pipe (stopped here; stuck in native code in life): sending it
    more than the socket's buffer is bounded by timeout= like every wait, and in restart mode the
    worker is killed and restarted, as a hung step is."""
    import os
    import warnings

    from shmvec import WorkerRestartWarning, WorkerTimeoutError

    env = _env(_pipe_envs(), mailbox_bytes=4096, timeout=1.0, on_failure=on_failure)
    pid = env._engine.workers.processes[1].pid
    try:
        env.reset()
        env.set_options({"level": np.zeros(HUGE // 8)})
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        if on_failure == "raise":
            with pytest.raises(WorkerTimeoutError, match="did not read its message"):
                env.reset()
            assert time.monotonic() - start < 10.0
            with pytest.raises(BrokenVecEnvError):
                env.get_attr("tag")
            os.kill(pid, signal.SIGCONT)
        else:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                env.reset()
            assert env.restarts == 1 and "shmvec_restarted" in env.reset_infos[2]
            assert env.env_method("last_option_sum") == [0] * 4
            with pytest.raises(WorkerTimeoutError, match="did not read its message"):
                os.kill(env._engine.workers.processes[0].pid, signal.SIGSTOP)
                try:
                    env.env_method("size_of", b"x" * HUGE, indices=[0])
                finally:
                    os.kill(env._engine.workers.processes[0].pid, signal.SIGCONT)
    finally:
        env.close()
