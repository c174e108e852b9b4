"""The C extensions under AddressSanitizer and UBSan: tens of thousands of damaged,
truncated and random inputs, and no memory error or undefined behaviour.

Each extension is compiled here with ``-fsanitize=address,undefined`` into a temporary
directory and fuzzed in a subprocess that preloads libasan (CPython itself is not
instrumented; PYTHONMALLOC=malloc puts every object where ASan sees its bounds);
tests/sanitizer_fuzz.py drives it with a fixed seed. The default run
takes seconds; the ``slow`` variants (``make fuzz-codec``) take RILLET_CODEC_FUZZ inputs.
Skipped where gcc or its libasan is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "sanitizer_fuzz.py"
SOURCES = {
    "_recordcodec": ["client/_recordcodec.c", "client/_crc32c_hw.c"],
    "_batchwrite": ["storage/_batchwrite.c", "client/_crc32c_hw.c"],
}
FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]


def libasan() -> str:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    path = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip("gcc has no libasan here")
    return path


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Both extensions built with the sanitizers, and the libasan to preload."""
    asan = libasan()
    out = tmp_path_factory.mktemp("sanitized")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name, sources in SOURCES.items():
        subprocess.run(
            [
                "gcc",
                *FLAGS,
                "-shared",
                "-fPIC",
                f"-I{sysconfig.get_paths()['include']}",
                *(str(ROOT / s) for s in sources),
                "-o",
                str(out / f"{name}{suffix}"),
            ],
            check=True,
        )
    return out, asan


def fuzz(sanitized: tuple[Path, str], which: str, count: int, seed: int) -> None:
    module_dir, asan = sanitized
    env = dict(
        os.environ,
        LD_PRELOAD=asan,
        # Python's own allocator carves objects out of arenas ASan cannot see into: an
        # over-read of a bytes object would land in its neighbour, unreported.
        PYTHONMALLOC="malloc",
        ASAN_OPTIONS="detect_leaks=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        RILLET_NO_NATIVE="1",  # the uninstrumented extensions stay out of the process
    )
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(module_dir), which, str(count), str(seed)],
        capture_output=True,
        text=True,
        env=env,
    )
    report = proc.stderr
    assert proc.returncode == 0, report[-8000:]
    assert "AddressSanitizer" not in report and "runtime error:" not in report, report[-8000:]
    assert "clean" in proc.stdout


def test_record_codec_under_sanitizers(sanitized: tuple[Path, str]) -> None:
    fuzz(sanitized, "codec", 30000, seed=1)


def test_batchwrite_under_sanitizers(sanitized: tuple[Path, str]) -> None:
    fuzz(sanitized, "batchwrite", 30000, seed=1)


LONG = int(os.environ.get("RILLET_CODEC_FUZZ", "1000000"))
# A million inputs take 1-3 minutes alone, more on a shared machine: past pytest's
# default per-test limit.
LONG_TIMEOUT_S = 3600


@pytest.mark.slow
@pytest.mark.timeout(LONG_TIMEOUT_S)
@pytest.mark.parametrize("seed", [2, 3])
def test_record_codec_under_sanitizers_long(sanitized: tuple[Path, str], seed: int) -> None:
    fuzz(sanitized, "codec", LONG, seed)


@pytest.mark.slow
@pytest.mark.timeout(LONG_TIMEOUT_S)
def test_batchwrite_under_sanitizers_long(sanitized: tuple[Path, str]) -> None:
    fuzz(sanitized, "batchwrite", LONG, seed=2)
