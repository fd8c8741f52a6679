"""Extension list for shmvec; all other metadata lives in pyproject.toml."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "shmvec._core",
                sources=["shmvec/_core.pyx", "csrc/shmvec_sync.c", "csrc/shmvec_queue.c"],
                include_dirs=["csrc", numpy.get_include()],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=["-O2", "-std=c11"],
            )
        ],
        compiler_directives={"language_level": "3"},
    )
)
