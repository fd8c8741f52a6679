"""Extension list for shmvec; all other metadata lives in pyproject.toml."""
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "shmvec._core",
                sources=["shmvec/_core.pyx", "csrc/shmvec_sync.c", "csrc/shmvec_queue.c"],
                include_dirs=["csrc"],
                extra_compile_args=["-O2", "-std=c11"],
            )
        ],
        compiler_directives={"language_level": "3"},
    )
)
