"""Checks that guard data on disk. Unlike ``assert`` they survive ``python -O``."""

from __future__ import annotations


class InvariantError(RuntimeError):
    """A storage invariant failed: a bug in rillet or a disk that lies, never user error."""


def invariant(condition: bool, message: str) -> None:
    """Raise InvariantError when ``condition`` is false. Always on, even under -O."""
    if not condition:
        raise InvariantError(message)
