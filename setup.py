"""Extension list for shmvec; all other metadata lives in pyproject.toml.

One compiled module per primitive, each with only the C sources it calls: ``shmvec._sync``
(csrc/shmvec_sync.c), ``shmvec._queue`` (the queue waits and wakes through shmvec_sync.c),
``shmvec._rows`` (a RowWriter's ENV_AT store is shmvec_store_release) and ``shmvec._codec``
(no C of its own).
"""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

SYNC = "csrc/shmvec_sync.c"
QUEUE = "csrc/shmvec_queue.c"


def _extension(name: str, *c_sources: str) -> Extension:
    return Extension(
        f"shmvec.{name}",
        sources=[f"shmvec/{name}.pyx", *c_sources],
        include_dirs=["csrc", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O2", "-std=c11"],
    )


setup(
    ext_modules=cythonize(
        [
            _extension("_sync", SYNC),
            _extension("_queue", QUEUE, SYNC),
            _extension("_rows", SYNC),
            _extension("_codec"),
        ],
        compiler_directives={"language_level": "3"},
    )
)
