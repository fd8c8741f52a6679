# Declarations of csrc/shmvec_sync.h, line for line.
from libc.stdint cimport int64_t, uint32_t

cdef extern from "shmvec_sync.h" nogil:
    int SHMVEC_OK
    int SHMVEC_TIMEOUT
    int SHMVEC_INTERRUPTED

    uint32_t shmvec_load_acquire(const uint32_t *word)
    void shmvec_store_release(uint32_t *word, uint32_t value)
    uint32_t shmvec_fetch_add(uint32_t *word, uint32_t delta)
    int shmvec_wake(uint32_t *word, int n)
    int shmvec_wait_while(uint32_t *word, uint32_t old, int64_t spin_ns,
                          int64_t timeout_ns, uint32_t *observed, uint32_t *sleepers)
    int shmvec_wake_sleepers(uint32_t *word, uint32_t *sleepers, int n)
    int64_t shmvec_now_ns()
    int shmvec_current_cpu()
