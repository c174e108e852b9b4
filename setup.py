"""Only the optional C extension is declared here; everything else is in pyproject.toml.

The append hot path in C (storage/batchwrite.py has its pure-Python twin). Optional:
with no C compiler the install goes on without it and the twin runs instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rillet.storage._batchwrite",
            sources=["storage/_batchwrite.c", "storage/_crc32c_hw.c"],
            depends=["storage/_crc32c_hw.h"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
