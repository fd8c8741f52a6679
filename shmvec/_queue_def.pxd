# Declarations of csrc/shmvec_queue.h, line for line.
from libc.stdint cimport int64_t, uint32_t

cdef extern from "shmvec_queue.h" nogil:
    int SHMVEC_QUEUE_EMPTY
    int SHMVEC_QUEUE_BAD_ARG
    uint32_t SHMVEC_QUEUE_MAX_VALUE

    size_t shmvec_queue_bytes(uint32_t capacity)
    uint32_t shmvec_queue_capacity_for(uint32_t n)
    int shmvec_queue_init(uint32_t *q, uint32_t capacity)
    uint32_t shmvec_queue_capacity(const uint32_t *q)
    int shmvec_queue_push(uint32_t *q, uint32_t value)
    int shmvec_queue_push_urgent(uint32_t *q, uint32_t value)
    int shmvec_queue_wait_count(uint32_t *q, uint32_t n, int64_t spin_ns, int64_t timeout_ns)
    int shmvec_queue_try_pop(uint32_t *q, uint32_t *value)
    int shmvec_queue_pop(uint32_t *q, int64_t spin_ns, int64_t timeout_ns, uint32_t *value)
    uint32_t shmvec_queue_size(const uint32_t *q)
