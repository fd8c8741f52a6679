/*
 * shmvec_queue.h -- a bounded multi-producer single-consumer queue of 32-bit
 * indices in shared memory.  Workers (producers) publish the index of an env
 * they finished stepping; the parent (the one consumer) takes them in the
 * order the producers claimed their slots.
 *
 * Pure C11 + Linux futexes (through shmvec_sync.h); no Python.h.  Every
 * function is safe to call without the GIL.
 *
 * Layout (at a 64-byte aligned address, shmvec_queue_bytes(capacity) bytes,
 * zero-filled by the creator, then shmvec_queue_init):
 *
 *     word 0      capacity (a power of two), written once by init
 *     word 16     TAIL      producers' claim counter (one cache line)
 *     word 17     PUBLISHED producers' count of filled slots
 *     word 32     HEAD      consumer's read counter (its own cache line)
 *     word 33     SLEEPERS  1 while the consumer sleeps on a slot (pop)
 *     word 34     WANT      the PUBLISHED value the consumer waits for (wait_count)
 *     word 35     COUNT_SLEEPERS  1 while the consumer sleeps on PUBLISHED
 *     word 48 + k SLOT[k]   0 = empty, else value + 1
 *
 * Concurrency contract and memory ordering
 * ----------------------------------------
 * push (any process, any number at once):
 *   1. pos <- fetch_add(TAIL, 1)          (relaxed: only claims a distinct slot;
 *                                          each position goes to exactly one producer)
 *   2. waits while SLOT[pos % capacity] != 0 (acquire) -- only if more than
 *      `capacity` values are outstanding, which the caller must rule out;
 *      shmvec's pool never has more than num_envs in flight
 *   3. SLOT[pos % capacity] <- value + 1  (release: every store the producer
 *      made before push -- the observation, reward and info of the env --
 *      is visible to the consumer that reads this slot with acquire)
 *   4. wake_sleepers(SLOT, SLEEPERS)       (seq_cst fence, then FUTEX_WAKE only
 *      if the consumer counted itself asleep: never a lost wake-up, see
 *      shmvec_wake_sleepers)
 *   5. p <- fetch_add(PUBLISHED, 1) + 1 (seq_cst); fence; if COUNT_SLEEPERS > 0
 *      and p has reached WANT (or the push is urgent): FUTEX_WAKE on PUBLISHED.
 *      A consumer waiting for n values is woken once, by the push that makes
 *      them n, not by every push.
 * wait_count(n) (the consumer, before popping a batch):
 *   WANT <- HEAD + n (seq_cst); then, if PUBLISHED - HEAD < n, waits on
 *   PUBLISHED (spin, then sleep with COUNT_SLEEPERS counted).  No lost wake-up: if the producer
 *   whose push completes the n reads COUNT_SLEEPERS as 0, the consumer's
 *   increment comes later in the seq_cst order, so its FUTEX_WAIT sees the new
 *   PUBLISHED and does not sleep; if it reads 1, it also reads the WANT stored
 *   before that increment (or a later one, never an older one).  A stale,
 *   smaller WANT only causes a spurious wake-up.
 * pop (only ever one consumer at a time):
 *   1. s <- SLOT[HEAD % capacity] (acquire); while s == 0 it waits on that
 *      slot's futex (spin, then sleep; with a timeout)
 *   2. SLOT[HEAD % capacity] <- 0 (release: the producer that gets this slot
 *      a lap later sees it free only after the consumer has read it)
 *   3. HEAD <- HEAD + 1 (plain: the consumer is HEAD's only writer)
 *   returns s - 1.
 *
 * Values come out in the order of the producers' step 1.  No value is lost
 * or seen twice: each TAIL position is claimed by one producer, filled once,
 * and read and cleared once by the consumer.  Producers never wait on each
 * other nor on the consumer (given the capacity bound): push is wait-free.
 * The consumer can be held up by one thing only: a producer that claimed a
 * position (step 1) and has not filled it yet (step 3) -- two instructions,
 * but a preemption in between makes the consumer wait for that producer
 * even if later positions are already filled (it sleeps on the futex, it
 * does not spin forever).
 */
#ifndef SHMVEC_QUEUE_H
#define SHMVEC_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (also SHMVEC_OK / SHMVEC_TIMEOUT / SHMVEC_INTERRUPTED of shmvec_sync.h). */
#define SHMVEC_QUEUE_EMPTY 3
#define SHMVEC_QUEUE_BAD_ARG (-22) /* -EINVAL */

/* Largest value a queue carries (0xFFFFFFFF - 1 is reserved). */
#define SHMVEC_QUEUE_MAX_VALUE 0xFFFFFFFDu

/* Bytes a queue of `capacity` slots takes (capacity: a power of two >= 1), or 0. */
size_t shmvec_queue_bytes(uint32_t capacity);

/* Smallest valid capacity (a power of two) that holds `n` values. */
uint32_t shmvec_queue_capacity_for(uint32_t n);

/* Initializes zero-filled memory as an empty queue.  Before any push/pop;
 * publish the memory to other processes afterwards (e.g. through a pipe).
 * Returns SHMVEC_OK or SHMVEC_QUEUE_BAD_ARG. */
int shmvec_queue_init(uint32_t *q, uint32_t capacity);

/* Capacity of an initialized queue. */
uint32_t shmvec_queue_capacity(const uint32_t *q);

/* Appends `value` (<= SHMVEC_QUEUE_MAX_VALUE).  Any process, concurrently.
 * Returns SHMVEC_OK or SHMVEC_QUEUE_BAD_ARG. */
int shmvec_queue_push(uint32_t *q, uint32_t value);

/* As shmvec_queue_push, and always wakes a consumer in wait_count (for an
 * error report that the consumer must see before its batch is complete). */
int shmvec_queue_push_urgent(uint32_t *q, uint32_t value);

/* Consumer only.  Returns SHMVEC_OK at once if at least `n` values are
 * published and not popped; else waits once: until PUBLISHED changes (while
 * spinning), or until woken by the push that completes the `n` or by an
 * urgent push (asleep).  SHMVEC_OK therefore means "look again": the caller
 * pops what is there and calls again for the rest.  Also SHMVEC_TIMEOUT,
 * SHMVEC_INTERRUPTED or -errno. */
int shmvec_queue_wait_count(uint32_t *q, uint32_t n, int64_t spin_ns, int64_t timeout_ns);

/* Consumer only.  Takes the next value into *value: SHMVEC_OK, or
 * SHMVEC_QUEUE_EMPTY at once if the next slot is not filled yet. */
int shmvec_queue_try_pop(uint32_t *q, uint32_t *value);

/* Consumer only.  Waits for the next value: spins up to spin_ns, then sleeps
 * (timeout_ns < 0: no limit).  Returns SHMVEC_OK, SHMVEC_TIMEOUT,
 * SHMVEC_INTERRUPTED (a signal arrived) or -errno. */
int shmvec_queue_pop(uint32_t *q, int64_t spin_ns, int64_t timeout_ns, uint32_t *value);

/* Values pushed (claimed) and not popped yet; a snapshot, exact only when
 * no push is under way. */
uint32_t shmvec_queue_size(const uint32_t *q);

#ifdef __cplusplus
}
#endif
#endif /* SHMVEC_QUEUE_H */
