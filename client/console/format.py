"""Jinja filters the console's tables share: sizes and rates a person reads at a glance."""

from __future__ import annotations

import time

import jinja2

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float | None) -> str:
    """1536 -> "1.5 KiB"; None (unknown) -> "-"."""
    if n is None:
        return "-"
    value = float(n)
    for unit in UNITS:
        if abs(value) < 1024 or unit == UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_rate(n: float | None, unit: str = "") -> str:
    """Per-second figures: bytes with a unit ("1.5 KiB/s"), counts plain ("12.3/s")."""
    if n is None:
        return "-"
    if unit == "B":
        return human_bytes(n) + "/s"
    return f"{n:.0f}/s" if n >= 100 or n == 0 else f"{n:.1f}/s"


def clock(at: float) -> str:
    """A wall-clock time (UTC) to the second."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def register(env: jinja2.Environment) -> None:
    env.filters["bytes"] = human_bytes
    env.filters["rate"] = human_rate
    env.filters["clock"] = clock
