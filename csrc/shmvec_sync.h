/*
 * shmvec_sync.h -- the base concurrency primitive of shmvec: 32-bit words in
 * shared memory with explicit memory ordering, and a futex to sleep on them.
 * The parent/worker protocol (shmvec/_protocol.py) runs on these words alone;
 * the pool's queue (shmvec_queue.h) is built on them.
 *
 * Pure C11 + Linux syscalls; no Python.h.  Every function is safe to call
 * without the GIL (the Cython wrapper calls them inside `with nogil:`).
 *
 * Concurrency contract
 * --------------------
 * - A "word" is a naturally aligned uint32_t that lives in memory shared by
 *   several processes (a MAP_SHARED mapping of a POSIX shm object).  Words
 *   are only ever accessed through these functions.
 * - shmvec_store_release() publishes every plain store (numpy writes into
 *   the observation/action buffers) that precedes it in program order;
 *   a shmvec_load_acquire() that reads the stored value sees all of them.
 * - shmvec_fetch_add() is a sequentially consistent read-modify-write: it
 *   both acquires what earlier writers released and releases this caller's
 *   earlier stores.
 * - shmvec_wake() uses shared (not PRIVATE) futexes, so a waiter in another
 *   process that maps the same page at another address is woken.
 * - shmvec_wait_while() returns as soon as the word differs from `old`.  It
 *   first spins for up to `spin_ns` nanoseconds, yielding the core between
 *   short bursts (cheap when the answer comes within microseconds, and polite
 *   when cores are oversubscribed), then sleeps in FUTEX_WAIT until woken, until
 *   `timeout_ns` has passed (SHMVEC_TIMEOUT), or until a signal arrives
 *   (SHMVEC_INTERRUPTED) so that the caller can run its signal handlers.
 *   A waiter therefore never misses a wake-up: FUTEX_WAIT compares the word
 *   with `old` atomically in the kernel before sleeping.
 */
#ifndef SHMVEC_SYNC_H
#define SHMVEC_SYNC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes of shmvec_wait_while (>= 0) and of failures (< 0: -errno). */
#define SHMVEC_OK 0
#define SHMVEC_TIMEOUT 1
#define SHMVEC_INTERRUPTED 2

uint32_t shmvec_load_acquire(const uint32_t *word);
void shmvec_store_release(uint32_t *word, uint32_t value);
/* Adds `delta` (wrapping) and returns the value before the addition. */
uint32_t shmvec_fetch_add(uint32_t *word, uint32_t delta);

/* Wakes at most `n` processes sleeping on `word`.  Returns how many were
 * woken, or -errno. */
int shmvec_wake(uint32_t *word, int n);

/* Waits while *word == old.  On SHMVEC_OK stores the new value in *observed.
 * timeout_ns < 0 means no timeout.  Returns a status code or -errno.
 * `sleepers` (may be NULL) counts the processes asleep on `word`: it is
 * incremented (seq_cst) before each FUTEX_WAIT and decremented after, so that
 * a waker can skip the syscall when nobody sleeps (shmvec_wake_sleepers). */
int shmvec_wait_while(uint32_t *word, uint32_t old, int64_t spin_ns,
                      int64_t timeout_ns, uint32_t *observed, uint32_t *sleepers);

/* Call after storing a new value into `word`: a seq_cst fence, then a futex
 * wake only if *sleepers > 0.  Never misses a sleeper: either the waker's load
 * sees the sleeper's increment, or the sleeper's FUTEX_WAIT (which follows its
 * increment) sees the new value of `word` and does not sleep.  Returns how
 * many were woken, or -errno. */
int shmvec_wake_sleepers(uint32_t *word, uint32_t *sleepers, int n);

/* Monotonic clock in nanoseconds. */
int64_t shmvec_now_ns(void);

/* The CPU the calling thread runs on (sched_getcpu: a vDSO call, no syscall on
 * x86-64), or -1 where unknown.  A hint only: the thread may move at once. */
int shmvec_current_cpu(void);

#ifdef __cplusplus
}
#endif
#endif /* SHMVEC_SYNC_H */
