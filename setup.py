"""Only the optional C extensions are declared here; everything else is in pyproject.toml.

Two hot paths in C, each with a pure-Python twin: the append (storage/batchwrite.py) and
the v2 record codec (client/wire/recordcodec.py). Both compute CRC-32C with the CPU's
own instructions (client/_crc32c_hw.c: the client owns it, storage may depend on the
client but not the reverse). Optional: with no C compiler the install goes on without
them and the twins run instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rillet.storage._batchwrite",
            sources=["storage/_batchwrite.c", "client/_crc32c_hw.c"],
            depends=["client/_crc32c_hw.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "rillet.client._recordcodec",
            sources=["client/_recordcodec.c", "client/_crc32c_hw.c"],
            depends=["client/_crc32c_hw.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
