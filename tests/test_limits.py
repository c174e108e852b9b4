"""A node raises its soft open-files limit to the hard one at start-up."""

from __future__ import annotations

import resource

import pytest

from rillet.client.runtime import limits


def test_the_soft_open_files_limit_is_raised_to_the_hard_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    current = [(1024, 524288)]
    monkeypatch.setattr(resource, "getrlimit", lambda _: current[0])
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: current.__setitem__(0, value))
    caplog.set_level("INFO")
    assert limits.raise_open_files_limit() == (524288, 524288)
    assert current[0] == (524288, 524288)
    assert "soft 1024 raised to the hard limit 524288" in caplog.text
    # Already at the hard limit: nothing to raise, both logged.
    assert limits.raise_open_files_limit() == (524288, 524288)
    assert "soft 524288, hard 524288" in caplog.text


def test_a_refused_raise_keeps_the_soft_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_: int, __: tuple[int, int]) -> None:
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert limits.raise_open_files_limit() == (256, resource.RLIM_INFINITY)
