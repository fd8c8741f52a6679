"""shmvec._queue.IndexQueue (csrc/shmvec_queue.h): the lock-free MPSC index queue, across real processes.

Many producer processes push at once while one consumer pops: no value may be lost or seen twice,
and what a producer wrote before pushing a value must be visible once the consumer pops it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import time
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import pytest

from shmvec._queue import (
    QUEUE_MAX_VALUE,
    IndexQueue,
    push_in_flight,
    queue_bytes,
    queue_capacity_for,
    send_ids_valid,
)
from shmvec._sync import Words

CAPACITY = 64
CREDIT = 8           # values a producer may have outstanding (producers x CREDIT <= CAPACITY)
N_PER_PRODUCER = 3000
PAYLOAD_OFFSET = 4096  # int64 payload[value], written by the producer before it pushes value


def _layout(n_producers: int, n_values: int) -> tuple[int, int, int]:
    q_bytes = queue_bytes(CAPACITY)
    words_offset = (q_bytes + 63) // 64 * 64
    payload_offset = max(PAYLOAD_OFFSET, words_offset + 64 * 4)
    return words_offset, payload_offset, payload_offset + 8 * n_values


def _producer(name: str, k: int, n_producers: int, n: int, start_at: float) -> None:
    shm = SharedMemory(name=name)
    words_offset, payload_offset, _ = _layout(n_producers, n_producers * n)
    q = IndexQueue(shm.buf, 0, CAPACITY, False)
    words = Words(shm.buf, words_offset, 64)
    payload = np.frombuffer(shm.buf, dtype=np.int64, count=n_producers * n, offset=payload_offset)
    try:
        while time.monotonic() < start_at:  # everyone starts together: maximal contention
            pass
        pushed = 0
        for v in range(k, n_producers * n, n_producers):
            while pushed - words.load(k) >= CREDIT:  # flow control keeps <= CAPACITY outstanding
                os.sched_yield()
            payload[v] = 7 * v + 3  # a plain store, published by the push below
            q.push(v)
            pushed += 1
    finally:
        del payload
        words.release()
        q.release()
        shm.close()


@pytest.mark.parametrize("method, n_producers", [("fork", 6), ("spawn", 3)])
def test_many_producers_one_consumer_no_loss_no_duplicate(method, n_producers):
    n_values = n_producers * N_PER_PRODUCER
    words_offset, payload_offset, nbytes = _layout(n_producers, n_values)
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=nbytes)
    procs = []
    q = words = payload = None
    try:
        shm.buf[:nbytes] = bytes(nbytes)
        q = IndexQueue(shm.buf, 0, CAPACITY, True)
        words = Words(shm.buf, words_offset, 64)
        payload = np.frombuffer(shm.buf, dtype=np.int64, count=n_values, offset=payload_offset)
        ctx = mp.get_context(method)
        start_at = time.monotonic() + (3.0 if method == "spawn" else 0.5)
        procs = [ctx.Process(target=_producer, args=(shm.name, k, n_producers, N_PER_PRODUCER, start_at))
                 for k in range(n_producers)]
        for p in procs:
            p.start()
        seen = np.zeros(n_values, dtype=np.int64)
        last = [-1] * n_producers
        consumed = [0] * n_producers
        deadline = time.monotonic() + 120
        got = 0
        while got < n_values:
            v = q.pop(0.5, 0.0)
            if v is None:
                assert time.monotonic() < deadline, f"only {got} of {n_values} values arrived"
                assert all(p.is_alive() or p.exitcode == 0 for p in procs)
                continue
            assert payload[v] == 7 * v + 3, f"value {v} popped before its payload was visible"
            k = v % n_producers
            assert v > last[k], f"producer {k}'s values out of order: {v} after {last[k]}"
            last[k] = v
            seen[v] += 1
            consumed[k] += 1
            words.store(k, consumed[k])
            got += 1
        assert (seen == 1).all(), f"lost: {np.flatnonzero(seen == 0)[:10]}, duplicated: {np.flatnonzero(seen > 1)[:10]}"
        assert q.try_pop() is None and len(q) == 0
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
            p.close()
        del payload
        for obj in (q, words):
            if obj is not None:
                obj.release()
        shm.close()
        shm.unlink()


def _push_later(name: str, delay: float, value: int) -> None:
    shm = SharedMemory(name=name)
    q = IndexQueue(shm.buf, 0, 8, False)
    try:
        time.sleep(delay)
        q.push(value)
    finally:
        q.release()
        shm.close()


@pytest.mark.parametrize("spin", [0.0, 1e-3])
def test_sleeping_consumer_is_woken_by_another_process(spin):
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=queue_bytes(8))
    q = None
    proc = mp.get_context("fork").Process(target=_push_later, args=(shm.name, 0.3, 12345))
    try:
        q = IndexQueue(shm.buf, 0, 8, True)
        t0 = time.monotonic()  # before start(): the child's 0.3 s sleep may begin before start() returns
        proc.start()
        assert q.pop(30.0, spin) == 12345
        assert 0.2 < time.monotonic() - t0 < 10.0  # it waited, and was woken, not timed out
    finally:
        proc.join(10)
        proc.close()
        if q is not None:
            q.release()
        shm.close()
        shm.unlink()


def test_single_process_semantics_and_wraparound():
    mv = np.zeros(queue_bytes(4) // 8 + 16, dtype=np.int64)  # room to pick a 64-byte aligned offset
    raw = memoryview(mv).cast("B")
    offset = (-mv.ctypes.data) % 64
    q = IndexQueue(raw, offset, 4, True)
    try:
        assert q.capacity == 4 and len(q) == 0
        assert q.try_pop() is None
        t0 = time.monotonic()
        assert q.pop(0.05) is None and time.monotonic() - t0 >= 0.04
        for lap in range(10):  # the positions wrap around the ring many times; order is FIFO
            values = [lap * 10 + j for j in range(1 + lap % 4)]
            for v in values:
                q.push(v)
            assert len(q) == len(values)
            assert [q.pop(1.0) for _ in values] == values
        q.push(0)
        q.push(QUEUE_MAX_VALUE)
        assert q.try_pop() == 0 and q.try_pop() == QUEUE_MAX_VALUE
        with pytest.raises(ValueError):
            q.push(QUEUE_MAX_VALUE + 1)
        other = IndexQueue(raw, offset, 4, False)  # attach to the same bytes
        q.push(9)
        assert other.try_pop() == 9
        other.release()
        with pytest.raises(ValueError, match="capacity 4, not 8"):
            IndexQueue(raw, offset, 8, False)
    finally:
        q.release()
    with pytest.raises(ValueError):
        q.push(1)
    for bad in (0, 3, 6):
        with pytest.raises(ValueError, match="power of two"):
            queue_bytes(bad)
    assert queue_capacity_for(5) == 8 and queue_capacity_for(8) == 8 and queue_capacity_for(1) == 1
    with pytest.raises(ValueError, match="aligned"):
        IndexQueue(raw, offset + 4, 4, True)
    with pytest.raises(ValueError, match="outside"):
        IndexQueue(raw, len(raw) - 8, 4, True)


def _push_values_later(name: str, delay: float, values: list[int], urgent: bool) -> None:
    shm = SharedMemory(name=name)
    q = IndexQueue(shm.buf, 0, 8, False)
    try:
        time.sleep(delay)
        for v in values:
            q.push(v, urgent)
    finally:
        q.release()
        shm.close()


@pytest.mark.parametrize("case", ["completing", "urgent", "not_completing"])
def test_wait_count_is_woken_by_the_push_that_completes_the_batch(case):
    """Asleep in wait_count(3): the push that makes 3 wakes it, as does an urgent push; a push
    that leaves the batch short does not (the wait runs to its timeout)."""
    values, urgent = {"completing": ([1, 2, 3], False), "urgent": ([7], True), "not_completing": ([1], False)}[case]
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=queue_bytes(8))
    q = None
    proc = mp.get_context("fork").Process(target=_push_values_later, args=(shm.name, 1.0, values, urgent))
    try:
        q = IndexQueue(shm.buf, 0, 8, True)
        assert q.wait_count(0, 0.0)  # nothing to wait for
        proc.start()
        timeout = 4.0 if case == "not_completing" else 30.0
        t0 = time.monotonic()
        while len(q) < len(values):  # (the queue's own count: the wait may return early and be called again)
            q.wait_count(3, timeout)
            if time.monotonic() - t0 > timeout:
                break
        elapsed = time.monotonic() - t0
        if case == "not_completing":
            assert elapsed >= 3.0, "a push that did not complete the batch woke the consumer"
        else:
            assert elapsed < 20.0
        proc.join(10)  # a producer slowed down past the timeout may not have pushed yet
        assert proc.exitcode == 0
        assert [q.try_pop() for _ in values] == values
        assert q.try_pop() is None
    finally:
        proc.join(10)
        proc.close()
        if q is not None:
            q.release()
        shm.close()
        shm.unlink()


def _batch_producer(name: str, k: int, n_producers: int, n: int) -> None:
    _producer(name, k, n_producers, n, time.monotonic())


def test_batched_consumer_many_producers():
    """The pool's recv() pattern: wait_count for a batch, then try_pop; no value lost or doubled."""
    n_producers, n_per = 4, 1500
    n_values = n_producers * n_per
    words_offset, payload_offset, nbytes = _layout(n_producers, n_values)
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=nbytes)
    procs, q, words, payload = [], None, None, None
    try:
        shm.buf[:nbytes] = bytes(nbytes)
        q = IndexQueue(shm.buf, 0, CAPACITY, True)
        words = Words(shm.buf, words_offset, 64)
        payload = np.frombuffer(shm.buf, dtype=np.int64, count=n_values, offset=payload_offset)
        procs = [mp.get_context("fork").Process(target=_batch_producer, args=(shm.name, k, n_producers, n_per))
                 for k in range(n_producers)]
        for p in procs:
            p.start()
        seen = np.zeros(n_values, dtype=np.int64)
        consumed = [0] * n_producers
        got, deadline = 0, time.monotonic() + 120
        while got < n_values:
            batch = min(5, n_values - got)
            q.wait_count(batch, 0.5)
            assert time.monotonic() < deadline, f"only {got} of {n_values} values arrived"
            while (v := q.try_pop()) is not None:
                assert payload[v] == 7 * v + 3
                seen[v] += 1
                consumed[v % n_producers] += 1
                words.store(v % n_producers, consumed[v % n_producers])
                got += 1
        assert (seen == 1).all()
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
            p.close()
        del payload
        for obj in (q, words):
            if obj is not None:
                obj.release()
        shm.close()
        shm.unlink()


BIG_CAPACITY = 1 << 17
BURST = 40_000  # values per producer, pushed from C without the GIL: the claims really collide


def _burst_producer(name: str, k: int, n_producers: int, start_at: float) -> None:
    shm = SharedMemory(name=name)
    q = IndexQueue(shm.buf, 0, BIG_CAPACITY, False)
    try:
        values = np.arange(k, n_producers * BURST, n_producers, dtype=np.uint32)
        while time.monotonic() < start_at:
            pass
        q.push_many(values)
    finally:
        q.release()
        shm.close()


def test_burst_of_concurrent_pushes_from_c():
    """Producers push as fast as C goes while the consumer drains: every claim is distinct."""
    n_producers = 3
    n_values = n_producers * BURST
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_{secrets.token_hex(4)}", create=True,
                       size=queue_bytes(BIG_CAPACITY))
    procs, q = [], None
    try:
        q = IndexQueue(shm.buf, 0, BIG_CAPACITY, True)
        start_at = time.monotonic() + 0.5
        procs = [mp.get_context("fork").Process(target=_burst_producer, args=(shm.name, k, n_producers, start_at))
                 for k in range(n_producers)]
        for p in procs:
            p.start()
        seen = np.zeros(n_values, dtype=np.int64)
        last = [-1] * n_producers
        out_of_order = 0
        got, deadline = 0, time.monotonic() + 120
        while got < n_values:
            v = q.pop(0.5)
            if v is None:
                assert time.monotonic() < deadline, f"only {got} of {n_values} values arrived"
                continue
            seen[v] += 1
            out_of_order += v < last[v % n_producers]  # each producer's values come out in its order
            last[v % n_producers] = v
            got += 1
        assert (seen == 1).all(), f"duplicated: {np.flatnonzero(seen > 1)[:10]}"
        assert out_of_order == 0
        assert q.try_pop() is None
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        if q is not None:
            q.release()
        shm.close()
        shm.unlink()


def test_push_in_flight_marks_and_pushes_each_env_to_its_workers_queue():
    """A pool's send() in one C call: env ids[k] marked in flight and pushed to its worker's
    queue as an index into the worker's slice; bad ids raise before anything is marked."""
    step = (queue_bytes(8) + 63) // 64 * 64
    buf = bytearray(2 * step + 64)
    base = (-np.frombuffer(buf, dtype=np.uint8).ctypes.data) % 64
    qs = [IndexQueue(buf, base, 8), IndexQueue(buf, base + step, 8)]
    owner = np.array([0, 0, 0, 1, 1], dtype=np.int64)  # worker 0: envs 0..2, worker 1: envs 3..4
    starts = np.array([0, 3], dtype=np.int64)
    in_flight = np.zeros(5, dtype=np.bool_)
    push_in_flight(qs, in_flight.view(np.uint8), np.array([4, 1, 3], dtype=np.int64), owner, starts)
    assert in_flight.tolist() == [False, True, False, True, True]
    assert [qs[0].try_pop(), qs[0].try_pop()] == [1, None]
    assert [qs[1].try_pop(), qs[1].try_pop(), qs[1].try_pop()] == [1, 0, None]
    for bad in ([5], [-1]):
        with pytest.raises(IndexError):
            push_in_flight(qs, in_flight.view(np.uint8), np.array([0, *bad], dtype=np.int64), owner, starts)
    assert in_flight.tolist() == [False, True, False, True, True] and len(qs[0]) == 0
    for q in qs:
        q.release()


@pytest.mark.parametrize("ids, ok", [([2, 0, 4], True), ([], True), ([0, 1], False), ([2, 2], False),
                                     ([0, 5], False), ([-1], False), ([4, 0, 4], False)])
def test_send_ids_valid_checks_range_repeats_and_in_flight_and_changes_nothing(ids, ok):
    in_flight = np.array([False, True, False, False, False])
    before = in_flight.copy()
    assert send_ids_valid(in_flight.view(np.uint8), np.array(ids, dtype=np.int64)) is ok
    assert (in_flight == before).all() and in_flight.view(np.uint8).max() <= 1

