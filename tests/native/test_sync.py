"""shmvec._sync.Words (csrc/shmvec_sync.h): atomics and futex wait/wake on shared words, across real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import time
from multiprocessing.shared_memory import SharedMemory

import psutil
import pytest

from shmvec import _sync
from shmvec._sync import Words

N_WORDS = 64
FUTEX = 0  # the word waiters sleep on
READY = 1  # children increment it once they are about to wait
COUNTER = 2  # fetch_add target
GO = 3  # start signal of the fetch_add race
RESULT = 16  # child k writes RESULT + 2k (value) and RESULT + 2k + 1 (elapsed ms)
NONE_MARK = 0xFFFFFFFF  # stored by a child whose wait returned None

START_METHODS = ("fork", "spawn")


# ---------------------------------------------------------------------------------------------
# Children (module level: spawn imports this module by name)
# ---------------------------------------------------------------------------------------------

def _attach(name: str) -> tuple[SharedMemory, Words]:
    shm = SharedMemory(name=name)
    return shm, Words(shm.buf, 0, N_WORDS)


def _child_wait(name: str, k: int, old: int, timeout: float, spin: float = 0.0) -> None:
    shm, words = _attach(name)
    try:
        words.fetch_add(READY, 1)
        start = time.monotonic()
        value = words.wait_while(FUTEX, old, timeout, spin)
        elapsed_ms = int((time.monotonic() - start) * 1000)
        words.store(RESULT + 2 * k, NONE_MARK if value is None else value)
        words.store(RESULT + 2 * k + 1, elapsed_ms)
    finally:
        words.release()
        shm.close()


def _child_store_later(name: str, delay: float, value: int) -> None:
    shm, words = _attach(name)
    try:
        time.sleep(delay)
        words.store(FUTEX, value)
        words.wake(FUTEX)
    finally:
        words.release()
        shm.close()


def _child_count(name: str, k: int, n: int) -> None:
    shm, words = _attach(name)
    try:
        words.fetch_add(READY, 1)
        words.wake(READY)
        while words.wait_while(GO, 0, 10.0) is None:
            pass
        total = 0
        for _ in range(n):
            total += words.fetch_add(COUNTER, 1)
        words.store(RESULT + 2 * k, total & 0xFFFFFFFF)
    finally:
        words.release()
        shm.close()


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def block():
    shm = SharedMemory(name=f"shmvec_{os.getpid()}_test_{secrets.token_hex(4)}", create=True, size=4096)
    words = Words(shm.buf, 0, N_WORDS)
    try:
        yield shm, words
    finally:
        words.release()
        shm.close()
        shm.unlink()


@pytest.fixture
def procs():
    """Processes a test starts; whatever is still running at the end is killed and reaped."""
    started: list = []
    yield started
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(5)
        p.close()


def _start(procs: list, method: str, target, *args) -> mp.Process:
    p = mp.get_context(method).Process(target=target, args=args, daemon=True)
    p.start()
    procs.append(p)
    return p


def _join_ok(p: mp.Process, timeout: float = 10.0) -> None:
    p.join(timeout)
    assert not p.is_alive(), "child did not finish"
    assert p.exitcode == 0, f"child failed with exit code {p.exitcode}"


def _in_futex(pid: int) -> bool:
    """True when the process sleeps in the kernel (in a futex wait where /proc tells)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = ""
    if wchan and wchan != "0":
        return "futex" in wchan
    try:
        return psutil.Process(pid).status() == psutil.STATUS_SLEEPING
    except psutil.NoSuchProcess:
        return False


def _wait_asleep(words: Words, ps: list, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if words.load(READY) == len(ps) and all(_in_futex(p.pid) for p in ps):
            return
        time.sleep(0.01)
    raise AssertionError("children never went to sleep on the futex")


# ---------------------------------------------------------------------------------------------
# Across processes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", START_METHODS)
def test_wake_wakes_waiter_in_other_process(block, procs, method):
    _, words = block
    p = _start(procs, method, _child_wait, block[0].name, 0, 0, 30.0)
    _wait_asleep(words, [p])
    words.store(FUTEX, 42)
    assert words.wake(FUTEX) == 1
    _join_ok(p)
    assert words.load(RESULT) == 42
    assert words.load(RESULT + 1) < 10_000  # woken, not timed out


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("spin", [0.0, 0.002])
def test_waiter_here_woken_by_other_process(block, procs, method, spin):
    _, words = block
    _start(procs, method, _child_store_later, block[0].name, 0.2, 9)
    start = time.monotonic()
    value = None
    while value is None and time.monotonic() - start < 30:
        value = words.wait_while(FUTEX, 0, 30.0, spin)
    assert value == 9
    assert time.monotonic() - start < 25
    _join_ok(procs[0])


@pytest.mark.parametrize("method", START_METHODS)
def test_one_wake_wakes_all_waiters(block, procs, method):
    _, words = block
    ps = [_start(procs, method, _child_wait, block[0].name, k, 0, 30.0) for k in range(4)]
    _wait_asleep(words, ps)
    words.store(FUTEX, 5)
    assert words.wake(FUTEX) == 4
    for k, p in enumerate(ps):
        _join_ok(p)
        assert words.load(RESULT + 2 * k) == 5
        assert words.load(RESULT + 2 * k + 1) < 10_000


def test_wake_n_wakes_at_most_n(block, procs):
    _, words = block
    ps = [_start(procs, "fork", _child_wait, block[0].name, k, 0, 30.0) for k in range(2)]
    _wait_asleep(words, ps)
    words.store(FUTEX, 3)
    assert words.wake(FUTEX, 1) == 1
    deadline = time.monotonic() + 10
    while all(p.is_alive() for p in ps) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert sum(p.is_alive() for p in ps) == 1, "wake(i, 1) must wake exactly one waiter"
    assert words.wake(FUTEX) == 1
    for k, p in enumerate(ps):
        _join_ok(p)
        assert words.load(RESULT + 2 * k) == 3


@pytest.mark.parametrize("method", START_METHODS)
def test_timeout_in_other_process(block, procs, method):
    _, words = block
    p = _start(procs, method, _child_wait, block[0].name, 0, 0, 0.3)
    _join_ok(p, 30)
    assert words.load(RESULT) == NONE_MARK
    assert 290 <= words.load(RESULT + 1) < 5000


@pytest.mark.parametrize("method", START_METHODS)
def test_fetch_add_from_several_processes_loses_nothing(block, procs, method):
    _, words = block
    n_procs, n_adds = 4, 50_000
    ps = [_start(procs, method, _child_count, block[0].name, k, n_adds) for k in range(n_procs)]
    deadline = time.monotonic() + 30
    while words.load(READY) < n_procs and time.monotonic() < deadline:
        words.wait_while(READY, words.load(READY), 0.1)
    assert words.load(READY) == n_procs
    words.store(GO, 1)
    words.wake(GO)
    for p in ps:
        _join_ok(p, 60)
    total = n_procs * n_adds
    assert words.load(COUNTER) == total
    # Every old value 0..total-1 was returned exactly once, so they sum to total*(total-1)/2.
    returned = sum(words.load(RESULT + 2 * k) for k in range(n_procs)) & 0xFFFFFFFF
    assert returned == (total * (total - 1) // 2) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# In one process
# ---------------------------------------------------------------------------------------------

def test_timeout_returns_none_roughly_on_time():
    words = Words(bytearray(64), 0, 16)
    for timeout in (0.0, 0.05, 0.3):
        start = time.monotonic()
        assert words.wait_while(0, 0, timeout) is None
        elapsed = time.monotonic() - start
        assert timeout * 0.95 <= elapsed < timeout + 2.0
    start = time.monotonic()
    assert words.wait_while(0, 0, 0.1, spin=0.05) is None
    assert 0.095 <= time.monotonic() - start < 2.1
    words.release()


@pytest.mark.parametrize("spin", [0.0, 0.01])
def test_wait_returns_at_once_when_value_differs(spin):
    words = Words(bytearray(64), 0, 16)
    words.store(3, 5)
    start = time.monotonic()
    assert words.wait_while(3, 4, 10.0, spin) == 5
    assert words.wait_while(3, 4, -1.0, spin) == 5  # no limit, still immediate
    assert time.monotonic() - start < 1.0
    words.release()


def test_load_store_fetch_add_wrap():
    words = Words(bytearray(64), 0, 16)
    assert len(words) == 16
    assert words.load(0) == 0
    words.store(0, 0xFFFFFFFF)
    assert words.load(0) == 0xFFFFFFFF
    assert words.fetch_add(0, 1) == 0xFFFFFFFF
    assert words.load(0) == 0
    assert words.fetch_add(0, -1) == 0
    assert words.load(0) == 0xFFFFFFFF
    assert words.fetch_add(0, 5) == 0xFFFFFFFF
    assert words.load(0) == 4
    assert words.load(1) == 0  # neighbours untouched
    with pytest.raises(OverflowError):
        words.store(0, 1 << 32)
    with pytest.raises(OverflowError):
        words.store(0, -1)
    assert words.wake(0) == 0  # nobody waits
    words.release()


def test_words_share_the_buffer():
    buf = bytearray(64)
    words = Words(buf, 8, 4)
    words.store(1, 0x01020304)
    assert int.from_bytes(buf[12:16], "little") == 0x01020304
    words.release()


def test_now_ns_is_the_monotonic_clock():
    # The same clock: Python's reading lies between the two of ours, however long this process
    # is preempted between the calls (a fixed tolerance such as 100 ms can be exceeded on a
    # loaded machine).
    a = _sync.now_ns()
    b = time.monotonic_ns()
    c = _sync.now_ns()
    assert a <= b <= c


class _Alarm(Exception):
    pass


@pytest.mark.timeout(60, method="thread")  # pytest-timeout's own method uses SIGALRM
def test_signal_interrupts_wait_and_exception_propagates():
    words = Words(bytearray(64), 0, 16)
    old_handler = signal.getsignal(signal.SIGALRM)

    def raise_alarm(signum, frame):
        raise _Alarm()

    try:
        signal.signal(signal.SIGALRM, raise_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        start = time.monotonic()
        with pytest.raises(_Alarm):
            words.wait_while(0, 0, 30.0)
        assert 0.15 <= time.monotonic() - start < 10.0
        # no limit at all: the signal is still the way out
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Alarm):
            words.wait_while(0, 0, -1.0)
        # a handler that returns: the wait returns None early, as documented
        signal.signal(signal.SIGALRM, lambda signum, frame: None)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        start = time.monotonic()
        assert words.wait_while(0, 0, 30.0) is None
        assert time.monotonic() - start < 10.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        words.release()


def test_index_out_of_range_raises():
    words = Words(bytearray(64), 0, 4)
    for i in (4, 100, -1):
        with pytest.raises(IndexError):
            words.load(i)
        with pytest.raises(IndexError):
            words.store(i, 1)
        with pytest.raises(IndexError):
            words.fetch_add(i, 1)
        with pytest.raises(IndexError):
            words.wake(i)
        with pytest.raises(IndexError):
            words.wait_while(i, 0, 0.0)
    words.release()


def test_use_after_release_raises():
    words = Words(bytearray(64), 0, 4)
    words.store(0, 1)
    words.release()
    words.release()  # idempotent
    with pytest.raises(ValueError):
        words.load(0)
    with pytest.raises(ValueError):
        words.store(0, 1)
    with pytest.raises(ValueError):
        words.fetch_add(0, 1)
    with pytest.raises(ValueError):
        words.wake(0)
    with pytest.raises(ValueError):
        words.wait_while(0, 0, 0.0)


def test_bad_construction_raises():
    buf = bytearray(64)
    with pytest.raises(ValueError):
        Words(buf, 0, 17)  # past the end
    with pytest.raises(ValueError):
        Words(buf, 60, 2)
    with pytest.raises(ValueError):
        Words(buf, -4, 1)
    with pytest.raises(ValueError):
        Words(buf, 0, 0)
    with pytest.raises(ValueError):
        Words(buf, 2, 1)  # misaligned
    with pytest.raises((TypeError, ValueError, BufferError)):
        Words(bytes(64), 0, 4)  # read-only


def test_words_pin_the_shared_memory(block):
    shm, words = block
    extra = Words(shm.buf, 0, 4)
    with pytest.raises(BufferError):
        shm.close()  # the mapping cannot go away under a Words
    extra.release()


def test_current_cpu_is_a_core_this_process_may_run_on():
    cpu = _sync.current_cpu()
    assert cpu == -1 or cpu in os.sched_getaffinity(0)
    allowed = os.sched_getaffinity(0)
    target = max(allowed)
    try:
        os.sched_setaffinity(0, {target})
        assert _sync.current_cpu() in (target, -1)
    finally:
        os.sched_setaffinity(0, allowed)
