"""A Ctrl-C at every line of the step's path: the vec env is never left stale.

A real Ctrl-C raises ``KeyboardInterrupt`` wherever the interpreter checks for signals, which is
after nearly any call.  ``interrupt_at(func, line)`` makes it land, once, as ``line`` of ``func``
is about to run (a trace function that raises: Python then raises the exception in the traced
frame), so each test walks every line of every function a step runs through, and checks what the
interrupt left behind against ``DummyVecEnv`` on the same seeds.  Each interrupt must leave one of:

- nothing sent: no worker has the step, and the next step is the reference's next step;
- the step in flight: ``step()`` and rare calls say so, ``step_wait()`` returns the step (equal
  to the reference's), ``reset()`` finishes it and drops it;
- a broken vec env, only where it cannot be otherwise: a post that reached some workers and not
  others, or a step whose collection had consumed a worker's pipe message (infos larger than the
  mailbox), which cannot be read twice.

A step is lost (done in the workers, its results never returned) only when the interrupt lands on
the ``return`` of ``_finish_step`` (``step``'s and ``step_wait``'s tail): past it, the caller has the results.
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
from collections import Counter
from typing import Any, Callable

import numpy as np
import pytest
import testenvs
from helpers import assert_same, close_all

from shmvec import AlreadyPendingCallError, BrokenVecEnvError, ShmVecEnv
from shmvec._calls import RareCalls, check_idle
from shmvec._engine import Engine
from shmvec._link import Link, Links
from shmvec._state import State, Status


def _lines(func: Callable) -> list[int]:
    """The lines of ``func``'s body that start bytecode (where a line event fires)."""
    code = func.__code__
    return sorted({line for _, line in dis.findlinestarts(code) if line is not None and line > code.co_firstlineno})


def _source_line(func: Callable, line: int) -> str:
    lines, first = inspect.getsourcelines(func)
    return lines[line - first].strip()


def _every_line(funcs: list[Callable]) -> Any:
    """(func, line, a description of the place) for every line of every function in ``funcs``."""
    for func in map(inspect.unwrap, funcs):  # (public methods are wrapped: shmvec._state.serialized)
        for line in _lines(func):
            yield func, line, f"{func.__qualname__} line {line}: {_source_line(func, line)!r}"


def interrupt_at(func: Callable, line: int, when: Callable[[Any], bool] = lambda frame: True) -> tuple[Callable, list]:
    """A trace function that raises KeyboardInterrupt once, as ``line`` of ``func`` is about to
    run (in a frame for which ``when(frame)`` is true); and a list that is non-empty once it has."""
    code = func.__code__
    fired: list = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired and when(frame):
            fired.append(line)
            raise KeyboardInterrupt  # Python clears the trace function and raises this in the frame
        return local

    def calls(frame, event, arg):
        return local if frame.f_code is code else None

    return calls, fired


_STEP_PATH = [ShmVecEnv.step, ShmVecEnv.step_async, ShmVecEnv.step_wait, Engine.post_step, Engine.post,
              Links.arm, Links.post, Engine._wake_posted, Links.wake, Status.enter,
              ShmVecEnv._finish_step, Engine.complete_step, Engine.complete, Engine._complete_or_raise, Links.wait,
              Links.collect, Engine._consumed, Engine.read_result, Link.reply, ShmVecEnv._step_results,
              Engine.finish_step]


def _interrupted(func: Callable, line: int, call: Callable[[], Any]) -> tuple[Any, bool]:
    """``call()`` with a KeyboardInterrupt at ``line`` of ``func``: (its result or None, whether
    the interrupt fired)."""
    tracer, fired = interrupt_at(func, line)
    got = None
    sys.settrace(tracer)
    try:
        got = call()
    except KeyboardInterrupt:
        assert fired, f"KeyboardInterrupt from elsewhere than {func.__qualname__} line {line}"
    finally:
        sys.settrace(None)
    return got, bool(fired)


def _run(env: ShmVecEnv, how: str, act: np.ndarray) -> Any:
    if how == "step":
        return env.step(act)
    env.step_async(act)
    return env.step_wait()


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("how, infos", [("step", "mailbox"), ("step_async", "mailbox"), ("step", "pipe")])
def test_a_ctrl_c_at_any_line_of_a_step_leaves_it_unsent_in_flight_or_broken_never_stale(how, infos):
    from stable_baselines3.common.vec_env import DummyVecEnv

    if infos == "pipe":  # every step's infos are larger than the mailbox: they go through the pipe
        fns = [functools.partial(testenvs.make_big_info_env, i) for i in range(4)]
        kwargs: dict[str, Any] = {"mailbox_bytes": 1024}
    else:
        fns = testenvs.spaces_env_fns("box", "discrete", 4, term_prob=0.3)
        kwargs = {}
    build = functools.partial(ShmVecEnv, fns, n_workers=2, start_method="fork", timeout=30.0, **kwargs)
    ref, env = DummyVecEnv(fns), build()
    rng = np.random.default_rng(0)
    outcomes: Counter = Counter()

    def in_step(seed: int) -> None:  # both envs reset with one seed
        env.seed(seed)
        ref.seed(seed)
        assert_same(env.reset(), ref.reset(), "reset")

    try:
        in_step(1)
        for func, line, where in _every_line(_STEP_PATH):
            act = rng.integers(0, 3, size=4)
            seqs = list(env._engine.seqs)
            got, fired = _interrupted(func, line, functools.partial(_run, env, how, act))
            if not fired:  # a line this step does not run (an error path, another branch)
                outcomes["not reached"] += 1
                assert_same(got, ref.step(act), where)
                continue
            if env._engine.status.failure is not None:
                outcomes["broken"] += 1
                assert func in (Engine.post, Links.post) or env._engine.status._before is State.CONSUMED, \
                    f"broken by an interrupt at {where}"
                with pytest.raises(BrokenVecEnvError, match="KeyboardInterrupt"):
                    env.step(act)
                env.close()
                env = build()
                in_step(int(rng.integers(1000)))
                continue
            if env.waiting:
                outcomes["in flight"] += 1
                with pytest.raises(AlreadyPendingCallError, match="step_wait"):
                    env.step(act)
                if outcomes["in flight"] % 3:
                    assert_same(env.step_wait(), ref.step(act), where)
                else:
                    ref.step(act)
                    in_step(int(rng.integers(1000)))  # reset() finishes the step and drops it
                assert not env.waiting
            elif env._engine.seqs != seqs:
                outcomes["lost"] += 1
                assert func is ShmVecEnv._finish_step, f"step lost at {where}"
                assert _source_line(func, line) == "return out", f"step lost at {where}"
                ref.step(act)
            else:
                outcomes["not sent"] += 1
            act = rng.integers(0, 3, size=4)
            assert_same(env.step(act), ref.step(act), f"the step after an interrupt at {where}")
        # Each kind of outcome happened (the walk is not vacuous).
        assert outcomes["in flight"] >= 20 and outcomes["not sent"] >= 5, outcomes
        assert outcomes["broken"] >= 1, outcomes
        if infos == "pipe":  # the last worker's message consumed, the first's not yet unpickled
            assert outcomes["broken"] > 3, outcomes
    finally:
        close_all(env, ref)


@pytest.mark.timeout(300, method="thread")
def test_ppo_learns_again_after_a_ctrl_c_in_the_middle_of_a_step():
    """The usual Ctrl-C: in a notebook, while the parent waits for the workers.  Running learn()
    again (it resets the env) goes on; so does step_wait() to collect the interrupted step."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=ShmVecEnv,
                       vec_env_kwargs={"n_workers": 2, "start_method": "fork", "timeout": 30.0})
    try:
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=1, seed=0)
        wait_lines = [line for line in _lines(Engine._complete_or_raise)
                      if "links.wait(" in _source_line(Engine._complete_or_raise, line)]
        assert len(wait_lines) == 1
        tracer, fired = interrupt_at(Engine._complete_or_raise, wait_lines[0],
                                     when=lambda frame: frame.f_locals["command"] == "step")  # not learn()'s reset
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                model.learn(256)
        finally:
            sys.settrace(None)
        assert fired and env.waiting and env._engine.status.failure is None, (fired, env.waiting, env._engine.status.failure)
        model.learn(128)  # reset_num_timesteps=True: learn() resets the env, which drops the step
        assert model.num_timesteps == 128
        assert not env.waiting and env._engine.status.failure is None
    finally:
        env.close()


@pytest.mark.timeout(300, method="thread")
def test_a_ctrl_c_at_any_line_of_an_sb3_pool_step_leaves_it_unsent_or_in_flight():
    """The same walk for ShmVecEnvPool (SB3's VecEnv over ShmEnvPool): its send() marks and
    pushes in one C call and its recv() keeps what arrived, so no line may break it."""
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv

    from shmvec.env_pool import ShmEnvPool
    from shmvec.vec_env_pool import ShmVecEnvPool

    from helpers import POOL_INFO_KEYS

    fns = testenvs.spaces_env_fns("box", "discrete", 4, term_prob=0.3)
    ref, env = DummyVecEnv(fns), ShmVecEnvPool(fns, n_workers=2, start_method="fork", timeout=30.0)
    rng = np.random.default_rng(0)
    outcomes: Counter = Counter()

    def same(got: Any, act: np.ndarray, where: str) -> None:
        assert_same(got, ref.step(act), where, ignore=POOL_INFO_KEYS)
        assert [info["pool_action"] for info in got[3]] == act.tolist(), where

    try:
        ref.seed(3)
        env.seed(3)
        assert_same(env.reset(), ref.reset(), "reset")
        for func, line, where in _every_line([
                VecEnv.step, ShmVecEnvPool.step_async, ShmVecEnvPool.step_wait, ShmVecEnvPool._build,
                ShmVecEnvPool._sorted, ShmVecEnvPool._remember, ShmEnvPool.send, ShmEnvPool.recv,
                ShmEnvPool._recv_held, ShmEnvPool._release_received]):
            act = rng.integers(0, 3, size=4)
            got, fired = _interrupted(func, line, functools.partial(env.step, act))
            if not fired:
                outcomes["not reached"] += 1
                same(got, act, where)
                continue
            assert env._pool._engine.status.failure is None, f"broken by an interrupt at {where}"
            if env.waiting:
                outcomes["in flight"] += 1
                with pytest.raises(AlreadyPendingCallError, match="step_wait"):
                    env.step(act)
                same(env.step_wait(), act, where)
            else:
                assert not env._pool._in_flight.any(), f"envs left in flight by an interrupt at {where}"
                if func is ShmVecEnvPool.step_wait:  # past "self.waiting = False": the step is over
                    outcomes["lost"] += 1
                    assert _source_line(func, line).startswith(("self._received = self._built = None", "return out")), where
                    ref.step(act)
                else:
                    outcomes["not sent"] += 1
            act = rng.integers(0, 3, size=4)
            same(env.step(act), act, f"the step after an interrupt at {where}")
        assert outcomes["in flight"] >= 20 and outcomes["not sent"] >= 3, outcomes
    finally:
        close_all(env, ref)


@pytest.mark.timeout(300, method="thread")
def test_a_ctrl_c_at_any_line_of_a_vector_env_step_leaves_it_unsent_in_flight_or_broken_never_stale():
    """ShmVectorEnv (Gymnasium's API): a step left in flight is collected by step_wait() (as
    AsyncVectorEnv's) or finished and dropped by reset(); every other call says so.  Checked
    against SyncVectorEnv."""
    from gymnasium.vector import SyncVectorEnv

    from shmvec import ShmVectorEnv

    fns = testenvs.spaces_env_fns("box", "discrete", 4, term_prob=0.3)
    build = functools.partial(ShmVectorEnv, fns, n_workers=2, start_method="fork", timeout=30.0)
    ref, env = SyncVectorEnv(fns), build()
    rng = np.random.default_rng(0)
    outcomes: Counter = Counter()

    def both_reset() -> None:
        seed = int(rng.integers(1000))
        assert_same(env.reset(seed=seed), ref.reset(seed=seed), "reset")

    try:
        both_reset()
        for func, line, where in _every_line([
                ShmVectorEnv.step, ShmVectorEnv.step_async, ShmVectorEnv.step_wait, ShmVectorEnv._step_return,
                Engine.post_step, Engine.check_idle, check_idle, Engine.post, Links.post, Engine._wake_posted,
                Links.wake, Status.enter, Engine.complete_step, Engine.complete, Engine._complete_or_raise, Links.wait,
                Links.collect, Engine.finish_step]):
            act = rng.integers(0, 3, size=4)
            engine = env._engine
            seqs = list(engine.seqs)
            got, fired = _interrupted(func, line, functools.partial(env.step, act))
            if not fired:
                outcomes["not reached"] += 1
                assert_same(got, ref.step(act), where)
                continue
            if engine.status.failure is not None:
                outcomes["broken"] += 1
                assert func in (Engine.post, Links.post), f"broken by an interrupt at {where}"
                env.close()
                env = build()
                both_reset()
                continue
            if engine.status.waiting:
                outcomes["in flight"] += 1
                with pytest.raises(AlreadyPendingCallError, match="call step_wait.*call reset"):
                    env.step(act)
                with pytest.raises(AlreadyPendingCallError, match="call step_wait"):
                    env.get_attr("tag")
                if outcomes["in flight"] % 2:
                    assert_same(env.step_wait(), ref.step(act), where)  # collected, as AsyncVectorEnv's
                else:
                    ref.step(act)
                    both_reset()  # finishes the step and drops it
            elif engine.seqs != seqs:
                outcomes["lost"] += 1  # done; the interrupt landed as step_wait() returned
                assert func is inspect.unwrap(ShmVectorEnv.step_wait) and _source_line(func, line) == "return out", where
                ref.step(act)
            else:
                outcomes["not sent"] += 1
            act = rng.integers(0, 3, size=4)
            assert_same(env.step(act), ref.step(act), f"the step after an interrupt at {where}")
        assert outcomes["in flight"] >= 15 and outcomes["not sent"] >= 5 and outcomes["broken"] >= 1, outcomes
    finally:
        close_all(env, ref)



@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("what", ["reset", "call"])
def test_a_ctrl_c_at_any_line_of_reset_async_or_call_async_and_their_waits_never_leaves_them_stale(what):
    """ShmVectorEnv's reset_async/reset_wait and call_async/call_wait: an interrupt at any line
    leaves nothing sent, the reset or call in flight (its wait collects it, equal to the
    reference's), or the vector env broken (a post or a pipe message half done); lost only as the
    engine's wait returns (its state IDLE).  Checked against SyncVectorEnv."""
    from gymnasium.vector import SyncVectorEnv

    from shmvec import ShmVectorEnv
    from shmvec._channel import Channel, RareCall

    fns = testenvs.spaces_env_fns("box", "discrete", 4, term_prob=0.3)
    build = functools.partial(ShmVectorEnv, fns, n_workers=2, start_method="fork", timeout=30.0)
    ref, env = SyncVectorEnv(fns), build()
    rng = np.random.default_rng(1)
    outcomes: Counter = Counter()
    if what == "reset":
        funcs = [ShmVectorEnv.reset_async, ShmVectorEnv.reset_wait, ShmVectorEnv._usable, ShmVectorEnv._waiting_for,
                 Engine.reset, Engine.reset_wait, Engine.check_idle, check_idle, Engine.post, Links.post, Engine.complete,
                 Engine._complete_or_raise, Links.wait, Links.collect, Status.enter]
        lost_at = {(Engine.reset_wait, "return results")}
    else:
        funcs = [ShmVectorEnv.call_async, ShmVectorEnv.call_wait, RareCalls.call_async, RareCalls.call_wait,
                 check_idle, RareCall.__init__, RareCall.result, Channel.send_call, Channel._send,
                 Channel.answered, Channel.read_answers, Channel._read, Status.enter]
        lost_at = {(RareCalls.call_wait, "self.pending = None"), (RareCalls.call_wait, "return call.result()")} | {
            (RareCall.result, _source_line(RareCall.result, n)) for n in _lines(RareCall.result)}

    def start_and_wait(arg: int) -> Any:
        if what == "reset":
            env.reset_async(seed=arg)
            return env.reset_wait(timeout=20)
        env.call_async("bump", arg)
        return env.call_wait(timeout=20)

    def reference(arg: int) -> Any:
        return ref.reset(seed=arg) if what == "reset" else ref.call("bump", arg)

    def both_reset() -> None:
        seed = int(rng.integers(1000))
        assert_same(env.reset(seed=seed), ref.reset(seed=seed), "reset")

    try:
        both_reset()
        for func, line, where in _every_line(funcs):
            arg = int(rng.integers(1, 1000))
            engine = env._engine
            seqs = list(engine.seqs)
            got, fired = _interrupted(func, line, functools.partial(start_and_wait, arg))
            if not fired:
                outcomes["not reached"] += 1
                assert_same(got, reference(arg), where)
                continue
            if engine.status.failure is not None:
                outcomes["broken"] += 1
                with pytest.raises(BrokenVecEnvError, match="KeyboardInterrupt"):
                    env.get_attr("tag")
                close_all(env, ref)
                ref, env = SyncVectorEnv(fns), build()  # (the envs' counters start again)
                both_reset()
                continue
            if engine.status.in_flight_call == what:
                outcomes["in flight"] += 1
                with pytest.raises(AlreadyPendingCallError, match=f"{what}_wait"):
                    env.step(np.zeros(4, dtype=np.int64))
                got = env.reset_wait() if what == "reset" else env.call_wait()
                assert_same(got, reference(arg), where)
            elif engine.seqs != seqs:
                outcomes["lost"] += 1  # done; the interrupt landed as the engine's wait returned
                assert (func, _source_line(func, line)) in lost_at, where
                reference(arg)
            else:
                outcomes["not sent"] += 1
            assert engine.status.in_flight_call is None, where
            assert_same(env.call("bump", 0), ref.call("bump", 0), f"the counters after an interrupt at {where}")
            both_reset()
            act = rng.integers(0, 3, size=4)
            assert_same(env.step(act), ref.step(act), f"the step after an interrupt at {where}")
        assert outcomes["in flight"] >= 5 and outcomes["not sent"] >= 3 and outcomes["broken"] >= 1, outcomes
    finally:
        close_all(env, ref)


def test_a_step_whose_results_fail_to_read_is_not_left_in_flight():
    """Only an interrupt leaves a step in flight: an info that does not unpickle in the parent
    breaks the vec env (it would fail again at every read), and an info SB3's dicts cannot take
    ends the step with its error, the vec env usable (both were left in flight for ever)."""
    from shmvec import NoAsyncCallError, ShmVectorEnv

    env = ShmVecEnv([testenvs.make_unloadable_info_env] * 2, n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(Exception, match="only the worker can rebuild this"):
            env.step(np.zeros(2, dtype=np.int64))
        assert not env.waiting
        with pytest.raises(BrokenVecEnvError):
            env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()
    envs = ShmVectorEnv([testenvs.make_unloadable_info_env] * 2, n_workers=2, start_method="fork", timeout=30.0)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(Exception, match="only the worker can rebuild this"):
            envs.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(BrokenVecEnvError):
            envs.reset(seed=0)
    finally:
        envs.close()
    env = ShmVecEnv([testenvs.make_list_info_env] * 2, n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(TypeError):
            env.step(np.zeros(2, dtype=np.int64))
        assert not env.waiting and env._engine.status.failure is None
        with pytest.raises(NoAsyncCallError):
            env.step_wait()
        env.step(np.zeros(2, dtype=np.int64))  # as DummyVecEnv, which raises the same TypeError, goes on
    finally:
        env.close()


def test_restart_mode_breaks_on_an_interrupt_as_a_failed_step_is_collected():
    """Collected twice, a step whose worker was restarted lost its truncation report
    (``shmvec_restarted``): restart mode keeps its own books, so an interrupt breaks the env."""
    import warnings

    from shmvec import WorkerRestartWarning

    fns = [functools.partial(testenvs.make_raising_env, 10**6), functools.partial(testenvs.make_raising_env, 2)]
    env = ShmVecEnv(fns, n_workers=2, start_method="fork", timeout=30.0, on_failure="restart")
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        line = next(n for n in _lines(Engine.complete_step)
                    if _source_line(Engine.complete_step, n).startswith("self.done_step = results"))
        tracer, fired = interrupt_at(Engine.complete_step, line)
        sys.settrace(tracer)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", WorkerRestartWarning)
                with pytest.raises(KeyboardInterrupt):
                    env.step(np.zeros(2, dtype=np.int64))  # env 1 raises: worker 1 is restarted
        finally:
            sys.settrace(None)
        assert fired and env.restarts == 1
        with pytest.raises(BrokenVecEnvError, match="KeyboardInterrupt"):
            env.step_wait()
    finally:
        env.close()
