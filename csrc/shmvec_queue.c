/*
 * shmvec_queue.c -- bounded MPSC queue of indices in shared memory.
 * See shmvec_queue.h for the layout and the memory ordering.
 */
#define _GNU_SOURCE
#include "shmvec_queue.h"

#include <sched.h>
#include <stdatomic.h>

#include "shmvec_sync.h"

#define Q_CAPACITY 0
#define Q_TAIL 16
#define Q_PUBLISHED 17
#define Q_HEAD 32
#define Q_SLEEPERS 33
#define Q_WANT 34
#define Q_COUNT_SLEEPERS 35
#define Q_SLOTS 48

static inline _Atomic uint32_t *at(const uint32_t *q, uint32_t i) {
    return (_Atomic uint32_t *)(q + i);
}

size_t shmvec_queue_bytes(uint32_t capacity) {
    if (capacity == 0 || (capacity & (capacity - 1)) != 0 || capacity > (1u << 30)) return 0;
    return ((size_t)Q_SLOTS + capacity) * sizeof(uint32_t);
}

uint32_t shmvec_queue_capacity_for(uint32_t n) {
    uint32_t c = 1;
    while (c < n && c < (1u << 30)) c <<= 1;
    return c;
}

int shmvec_queue_init(uint32_t *q, uint32_t capacity) {
    if (q == NULL || shmvec_queue_bytes(capacity) == 0) return SHMVEC_QUEUE_BAD_ARG;
    for (uint32_t k = 0; k < Q_SLOTS + capacity; k++) atomic_store_explicit(at(q, k), 0, memory_order_relaxed);
    atomic_store_explicit(at(q, Q_CAPACITY), capacity, memory_order_release);
    return SHMVEC_OK;
}

uint32_t shmvec_queue_capacity(const uint32_t *q) {
    return atomic_load_explicit(at(q, Q_CAPACITY), memory_order_acquire);
}

static int push(uint32_t *q, uint32_t value, int urgent) {
    if (value > SHMVEC_QUEUE_MAX_VALUE) return SHMVEC_QUEUE_BAD_ARG;
    uint32_t mask = shmvec_queue_capacity(q) - 1;
    uint32_t pos = atomic_fetch_add_explicit(at(q, Q_TAIL), 1, memory_order_relaxed);
    uint32_t *slot = q + Q_SLOTS + (pos & mask);
    /* Full (more than `capacity` outstanding): wait for the consumer to free the slot. */
    while (shmvec_load_acquire(slot) != 0) sched_yield();
    shmvec_store_release(slot, value + 1);
    int rc = shmvec_wake_sleepers(slot, q + Q_SLEEPERS, 1);
    if (rc < 0) return rc;
    uint32_t p = atomic_fetch_add_explicit(at(q, Q_PUBLISHED), 1, memory_order_seq_cst) + 1;
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(at(q, Q_COUNT_SLEEPERS), memory_order_relaxed) == 0) return SHMVEC_OK;
    uint32_t want = atomic_load_explicit(at(q, Q_WANT), memory_order_relaxed);
    if (urgent || (int32_t)(p - want) >= 0) {
        rc = shmvec_wake(q + Q_PUBLISHED, 1);
        if (rc < 0) return rc;
    }
    return SHMVEC_OK;
}

int shmvec_queue_push(uint32_t *q, uint32_t value) { return push(q, value, 0); }

int shmvec_queue_push_urgent(uint32_t *q, uint32_t value) { return push(q, value, 1); }

int shmvec_queue_wait_count(uint32_t *q, uint32_t n, int64_t spin_ns, int64_t timeout_ns) {
    uint32_t head = atomic_load_explicit(at(q, Q_HEAD), memory_order_relaxed);
    atomic_store_explicit(at(q, Q_WANT), head + n, memory_order_seq_cst);
    uint32_t pub = shmvec_load_acquire(q + Q_PUBLISHED);
    if (pub - head >= n) return SHMVEC_OK;
    /* One wait: returns once PUBLISHED changed (while spinning: at any push; asleep: at
     * the push that completes the n, or an urgent one).  The caller pops and loops. */
    return shmvec_wait_while(q + Q_PUBLISHED, pub, spin_ns, timeout_ns, &pub, q + Q_COUNT_SLEEPERS);
}

static inline uint32_t *head_slot(uint32_t *q) {
    uint32_t mask = shmvec_queue_capacity(q) - 1;
    uint32_t head = atomic_load_explicit(at(q, Q_HEAD), memory_order_relaxed);
    return q + Q_SLOTS + (head & mask);
}

static inline void take(uint32_t *q, uint32_t *slot) {
    shmvec_store_release(slot, 0);
    uint32_t head = atomic_load_explicit(at(q, Q_HEAD), memory_order_relaxed);
    atomic_store_explicit(at(q, Q_HEAD), head + 1, memory_order_release);
}

int shmvec_queue_try_pop(uint32_t *q, uint32_t *value) {
    uint32_t *slot = head_slot(q);
    uint32_t s = shmvec_load_acquire(slot);
    if (s == 0) return SHMVEC_QUEUE_EMPTY;
    take(q, slot);
    *value = s - 1;
    return SHMVEC_OK;
}

int shmvec_queue_pop(uint32_t *q, int64_t spin_ns, int64_t timeout_ns, uint32_t *value) {
    uint32_t *slot = head_slot(q);
    uint32_t s;
    int rc = shmvec_wait_while(slot, 0, spin_ns, timeout_ns, &s, q + Q_SLEEPERS);
    if (rc != SHMVEC_OK) return rc;
    take(q, slot);
    *value = s - 1;
    return SHMVEC_OK;
}

uint32_t shmvec_queue_size(const uint32_t *q) {
    uint32_t tail = atomic_load_explicit(at(q, Q_TAIL), memory_order_acquire);
    uint32_t head = atomic_load_explicit(at(q, Q_HEAD), memory_order_acquire);
    return tail - head;
}
