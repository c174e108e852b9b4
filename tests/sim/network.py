"""A simulated network between actors of any kind, every fault drawn from one seeded RNG."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .scheduler import Scheduler


class Actor(Protocol):
    """Anything with an address on the simulated network (a Raft node, a broker, ...)."""

    actor_id: int

    def deliver(self, src: int, payload: object) -> None:
        """Called at delivery time; a crashed actor ignores it."""


@dataclass(slots=True)
class LinkFaults:
    loss_rate: float = 0.0
    duplicate_rate: float = 0.0
    min_delay_ms: int = 1
    max_delay_ms: int = 10  # random delays reorder messages on the same link


class SimNetwork:
    """Delivers payloads after a random delay unless the link is cut or the dice say drop.

    `cut(a, b)` blocks a -> b only (one-way); `partition(groups)` blocks both ways between
    groups. A message in flight when its link is cut is dropped on arrival.
    """

    def __init__(
        self, scheduler: Scheduler, rng: random.Random, faults: LinkFaults | None = None
    ) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.faults = faults or LinkFaults()
        self.actors: dict[int, Actor] = {}
        self.blocked: set[tuple[int, int]] = set()
        self.sent = 0
        self.dropped = 0

    def register(self, actor: Actor) -> None:
        if actor.actor_id in self.actors:
            raise ValueError(f"actor id {actor.actor_id} already registered")
        self.actors[actor.actor_id] = actor

    def send(self, src: int, dst: int, payload: object) -> None:
        self.sent += 1
        faults = self.faults
        if (src, dst) in self.blocked or self.rng.random() < faults.loss_rate:
            self.dropped += 1
            return
        copies = 2 if self.rng.random() < faults.duplicate_rate else 1
        for _ in range(copies):
            delay_ms = self.rng.randint(faults.min_delay_ms, faults.max_delay_ms)
            self.scheduler.after(
                delay_ms, lambda: self._arrive(src, dst, payload), f"deliver {src}->{dst}"
            )

    def _arrive(self, src: int, dst: int, payload: object) -> None:
        if (src, dst) in self.blocked:
            self.dropped += 1
            return
        actor = self.actors.get(dst)
        if actor is not None:
            actor.deliver(src, payload)

    def cut(self, src: int, dst: int) -> None:
        self.blocked.add((src, dst))

    def partition(self, groups: Iterable[Iterable[int]]) -> None:
        """Only actors in the same group can talk; actors in no group keep all links."""
        group_of = {a: i for i, group in enumerate(groups) for a in group}
        for a, ga in group_of.items():
            for b, gb in group_of.items():
                if ga != gb:
                    self.blocked.add((a, b))

    def isolate(self, actor_id: int) -> None:
        for other in self.actors:
            if other != actor_id:
                self.blocked.update({(actor_id, other), (other, actor_id)})

    def cut_between(self, group: Iterable[int], others: Iterable[int]) -> set[tuple[int, int]]:
        """Blocks both ways between the two groups; returns the links it blocked anew,
        for `mend` to unblock later."""
        others = list(others)
        pairs = {(a, b) for a in group for b in others} | {(b, a) for a in group for b in others}
        new = pairs - self.blocked
        self.blocked |= new
        return new

    def mend(self, pairs: Iterable[tuple[int, int]]) -> None:
        self.blocked.difference_update(pairs)

    def heal(self) -> None:
        self.blocked.clear()
