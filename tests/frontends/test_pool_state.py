"""A pool's run is the engine's state POOLING (shmvec._state): from its reset until it stops.

The engine never reads IDLE while the pool's workers serve it; a rare call stops the pool and
starts it again; a failure while serving leaves BROKEN with ``serving_pool`` still true, so that
the pool's close() stops the workers first.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import testenvs
from shmvec import AlreadyPendingCallError, BrokenVecEnvError, WorkerDiedError
from shmvec._state import TRANSITIONS, State
from shmvec.env_pool import ShmEnvPool


def _pool() -> ShmEnvPool:
    return ShmEnvPool([testenvs.make_cartpole] * 4, batch_size=2, n_workers=2, start_method="fork", timeout=30)


def test_pooling_is_entered_from_idle_and_left_for_idle_only():
    assert TRANSITIONS[State.IDLE] >= {State.POOLING}
    assert TRANSITIONS[State.POOLING] == {State.IDLE}
    assert all(State.POOLING not in after for before, after in TRANSITIONS.items() if before is not State.IDLE)


def test_the_pools_run_is_the_engines_state():
    pool = _pool()
    engine = pool._engine
    try:
        assert engine.state is State.IDLE and engine.in_flight_call is None and not engine.serving_pool
        pool.reset(seed=0)
        assert engine.state is State.POOLING and engine.in_flight_call == "pool" and engine.serving_pool
        assert not engine.waiting  # no step of the lockstep faces is in flight
        with pytest.raises(AlreadyPendingCallError, match="serve a pool"):
            engine.call("get_attr", None, ("spec",))  # the engine's own calls wait for the pool to stop
        assert engine.state is State.POOLING and engine.failure is None
        assert len(pool.get_attr("spec")) == 4  # stops the pool, calls, starts it again
        assert engine.state is State.POOLING
        pool.send(np.zeros(2, dtype=np.int64), [0, 1])
        pool.recv()
        pool.async_reset(seed=1)  # stops the pool (IDLE), resets, starts it again
        assert engine.state is State.POOLING
    finally:
        pool.close()
    assert engine.state is State.CLOSED and not engine.serving_pool


def test_a_pool_broken_while_serving_still_stops_its_workers_on_close():
    pool = _pool()
    engine = pool._engine
    try:
        pool.reset(seed=0)
        engine.workers.processes[0].kill()
        engine.workers.processes[0].join(10)
        deadline = time.monotonic() + 20
        with pytest.raises(WorkerDiedError):
            while time.monotonic() < deadline:  # (recv checks the workers every POLL_S)
                pool.send(np.zeros(2, dtype=np.int64), pool.recv()[4]["env_id"])
        assert engine.state is State.BROKEN and engine.serving_pool
        with pytest.raises(BrokenVecEnvError):
            pool.recv()
    finally:
        pool.close()
    assert engine.state is State.CLOSED  # (the suite's leak check sees a worker left running)
