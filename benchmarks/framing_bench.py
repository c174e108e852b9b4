"""FrameDecoder throughput (MiB/s, best of several runs) for the shapes a node reads:

- ``whole_small``: 1 KiB frames arriving many to a 256 KiB chunk (the zero-copy path);
- ``split_1mib``: 1 MiB frames arriving in 64 KiB chunks (gathered);
- ``split_64mib``: 64 MiB frames in 256 KiB chunks (uvloop's read size; gathered);
- ``memcpy_64mib``: the baseline, joining the same 256 KiB chunks into one bytes object.

Prints JSON. ``--framing PATH`` loads the decoder from another checkout's
client/wire/framing.py, to compare before and after a change in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable
from types import ModuleType

from rillet.client.wire import framing as current


def load(path: str | None) -> ModuleType:
    if path is None:
        return current
    spec = importlib.util.spec_from_file_location("framing_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chunks(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def best_mib_s(run: Callable[[], object], nbytes: int, repeat: int) -> float:
    best = min(_timed(run) for _ in range(repeat))
    return round(nbytes / best / 2**20, 1)


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framing", help="framing.py of another checkout")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    mod = load(args.framing)
    header = {"api": 0, "version": 0, "correlation_id": 1}

    def decode(parts: list[bytes], expect: int) -> Callable[[], None]:
        def run() -> None:
            decoder = mod.FrameDecoder(128 << 20)
            n = 0
            for part in parts:
                n += len(decoder.feed(part))
            assert n == expect

        return run

    small = mod.encode_frame_bytes(header, bytes(1000)) * 4096
    mib = mod.encode_frame_bytes(header, bytes(1 << 20)) * 64
    big = mod.encode_frame_bytes(header, bytes(64 << 20)) * 2
    big_chunks = chunks(big, 256 << 10)
    out = {
        "decoder": args.framing or "this checkout",
        "whole_small": best_mib_s(decode(chunks(small, 256 << 10), 4096), len(small), args.repeat),
        "split_1mib": best_mib_s(decode(chunks(mib, 64 << 10), 64), len(mib), args.repeat),
        "split_64mib": best_mib_s(decode(big_chunks, 2), len(big), args.repeat),
        "memcpy_64mib": best_mib_s(lambda: b"".join(big_chunks), len(big), args.repeat),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
