# Words, for the modules that cimport it: shmvec._rows (a RowWriter stores a worker's ENV_AT
# through a Words, with no Python call).  The attributes are read there directly; _word is
# inline and private to _sync.pyx (declared here because Cython wants every C method of a
# class in its .pxd).
from libc.stdint cimport uint32_t


cdef class Words:
    cdef uint32_t *base
    cdef Py_ssize_t count
    cdef object view

    cdef inline uint32_t *_word(self, Py_ssize_t i) except NULL
