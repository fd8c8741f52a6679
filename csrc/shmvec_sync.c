/*
 * shmvec_sync.c -- atomics and futex wait/wake on shared 32-bit words.
 * See shmvec_sync.h for the concurrency contract.
 */
#define _GNU_SOURCE
#include "shmvec_sync.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SHMVEC_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define SHMVEC_CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define SHMVEC_CPU_RELAX() ((void)0)
#endif

/* How many relax iterations between two reads of the clock while spinning. */
#define SHMVEC_SPIN_CHECK_EVERY 64

static inline _Atomic uint32_t *as_atomic(const uint32_t *word) {
    return (_Atomic uint32_t *)word;
}

uint32_t shmvec_load_acquire(const uint32_t *word) {
    return atomic_load_explicit(as_atomic(word), memory_order_acquire);
}

void shmvec_store_release(uint32_t *word, uint32_t value) {
    atomic_store_explicit(as_atomic(word), value, memory_order_release);
}

uint32_t shmvec_fetch_add(uint32_t *word, uint32_t delta) {
    return atomic_fetch_add_explicit(as_atomic(word), delta, memory_order_seq_cst);
}

int64_t shmvec_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int shmvec_current_cpu(void) {
    return sched_getcpu();
}

int shmvec_wake(uint32_t *word, int n) {
    long rc = syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
    return rc < 0 ? -errno : (int)rc;
}

int shmvec_wake_sleepers(uint32_t *word, uint32_t *sleepers, int n) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(as_atomic(sleepers), memory_order_relaxed) == 0) return 0;
    return shmvec_wake(word, n);
}

int shmvec_wait_while(uint32_t *word, uint32_t old, int64_t spin_ns,
                      int64_t timeout_ns, uint32_t *observed, uint32_t *sleepers) {
    uint32_t v = shmvec_load_acquire(word);
    if (v != old) {
        *observed = v;
        return SHMVEC_OK;
    }
    int64_t start = shmvec_now_ns();
    /* Phase 1: spin for up to spin_ns.  After each short burst of pause
     * instructions the spinner calls sched_yield(), so that on a machine
     * with fewer cores than busy processes it hands its core to whoever is
     * runnable (the process it waits for, typically) instead of stealing it;
     * on an idle core it costs a cheap syscall and keeps the wake-up latency
     * at a few hundred nanoseconds instead of a futex wake-up. */
    if (spin_ns > 0) {
        for (;;) {
            for (int i = 0; i < SHMVEC_SPIN_CHECK_EVERY; i++) {
                SHMVEC_CPU_RELAX();
                v = shmvec_load_acquire(word);
                if (v != old) {
                    *observed = v;
                    return SHMVEC_OK;
                }
            }
            if (shmvec_now_ns() - start >= spin_ns) break;
            sched_yield();
        }
    }
    /* Phase 2: sleep in the kernel until the word changes. */
    for (;;) {
        struct timespec ts, *tsp = NULL;
        if (timeout_ns >= 0) {
            int64_t left = timeout_ns - (shmvec_now_ns() - start);
            if (left <= 0) return SHMVEC_TIMEOUT;
            ts.tv_sec = (time_t)(left / 1000000000LL);
            ts.tv_nsec = (long)(left % 1000000000LL);
            tsp = &ts;
        }
        if (sleepers) atomic_fetch_add_explicit(as_atomic(sleepers), 1, memory_order_seq_cst);
        long rc = syscall(SYS_futex, word, FUTEX_WAIT, old, tsp, NULL, 0);
        int err = rc < 0 ? errno : 0;
        if (sleepers) atomic_fetch_sub_explicit(as_atomic(sleepers), 1, memory_order_seq_cst);
        v = shmvec_load_acquire(word);
        if (v != old) {
            *observed = v;
            return SHMVEC_OK;
        }
        if (rc == 0 || err == EAGAIN) continue; /* spurious or raced: recheck */
        if (err == ETIMEDOUT) return SHMVEC_TIMEOUT;
        if (err == EINTR) return SHMVEC_INTERRUPTED;
        return -err;
    }
}
