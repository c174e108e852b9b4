"""A bounded trace of simulation events, dumped when an invariant breaks."""

from __future__ import annotations

from collections import deque


class Trace:
    def __init__(self, max_lines: int = 400, echo: bool = False) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.echo = echo

    def add(self, now_ms: int, text: str) -> None:
        line = f"{now_ms:>8} ms  {text}"
        self.lines.append(line)
        if self.echo:
            print(line)

    def tail(self, count: int = 80) -> str:
        return "\n".join(list(self.lines)[-count:])
