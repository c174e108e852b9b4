"""Fetch sessions (Kafka's KIP-227 incremental fetch), the client's side: one
``FetchSessionBuilder`` per destination broker, used by the consumer and by follower
brokers alike. Pure: it turns "the partitions I want now" into the next request's
partition list and session fields, and learns from the answer.

The broker's side and the protocol are described in broker/fetch_session.py. In short:
the first fetch is full and opens a session; afterwards each request lists only
partitions that are new or whose ``FetchPartition`` row changed (fetch offset, epochs,
max bytes), and ``forgotten`` ones; the answer lists only partitions with news, so a
partition absent from it has nothing new. Any trouble (a session error from the broker,
a broken connection, a request that may or may not have arrived) is answered by
``reset``: the next fetch is full again and opens a new session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from rillet.client.wire import errors
from rillet.client.wire import messages as m

INITIAL_EPOCH = 0
NO_SESSION = 0
MAX_EPOCH = (1 << 31) - 1
SESSION_ERRORS = frozenset(
    {
        errors.code_of("FETCH_SESSION_ID_NOT_FOUND"),
        errors.code_of("INVALID_FETCH_SESSION_EPOCH"),
    }
)

Key = tuple[str, int]  # (topic, partition)


class SessionRequest(NamedTuple):
    """The session part of one Fetch request."""

    session_id: int
    session_epoch: int
    topics: list[m.FetchTopic]  # the partitions to list
    forgotten: list[m.ForgottenTopic]

    @property
    def full(self) -> bool:
        return self.session_epoch == INITIAL_EPOCH

    @property
    def listed(self) -> int:
        return sum(len(t.partitions) for t in self.topics)


class FetchSessionBuilder:
    """The client half of the fetch session with one broker."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH  # what the next request carries
        self._sent: dict[Key, m.FetchPartition] = {}  # the session, as the broker holds it
        # Asked, not answered yet: the whole session (``build``, a full fetch) or the
        # changes to it (``build_changes``).
        self._pending: dict[Key, m.FetchPartition] | _Updates | None = None
        self.full_fetches = 0  # statistics (tests, benchmarks)
        self.incremental_fetches = 0

    def build(self, wanted: dict[Key, m.FetchPartition]) -> SessionRequest:
        """The next request for ``wanted`` ((topic, partition) -> its row), which the
        builder keeps: do not change it afterwards."""
        return self.build_changes(wanted, None)

    def build_changes(
        self, wanted: Mapping[Key, m.FetchPartition], changed: Iterable[Key] | None
    ) -> SessionRequest:
        """``build(wanted)`` for a caller that knows which rows may differ from the last
        request it had answered: ``changed`` names every key added, removed or whose row
        changed since (None: compare them all). An incremental request then costs what
        changed, not the session's size. ``wanted`` is copied for a full fetch, and the
        caller may change it afterwards. A caller uses either this or ``build``, not both
        (this one updates the builder's copy of the session in place)."""
        if self.epoch == INITIAL_EPOCH:
            full = dict(wanted) if changed is not None or not isinstance(wanted, dict) else wanted
            self._pending = full
            self.full_fetches += 1
            # Naming the session we gave up on closes it at the broker.
            closing = self.session_id
            return SessionRequest(closing, INITIAL_EPOCH, _by_topic(full.items()), [])
        sent = self._sent
        if changed is None:
            self._pending = dict(wanted) if not isinstance(wanted, dict) else wanted
            rows = [(k, p) for k, p in wanted.items() if sent.get(k) != p]
            gone: Iterable[Key] = sent.keys() - wanted.keys()
        else:
            updates: dict[Key, m.FetchPartition | None] = {}
            for k in changed:
                p = wanted.get(k)
                if p is None:
                    if k in sent:
                        updates[k] = None
                elif sent.get(k) != p:
                    updates[k] = p
            self._pending = _Updates(updates)
            rows = [(k, p) for k, p in updates.items() if p is not None]
            gone = [k for k, p in updates.items() if p is None]
        forgotten: dict[str, list[int]] = {}
        for topic, partition in gone:
            forgotten.setdefault(topic, []).append(partition)
        self.incremental_fetches += 1
        return SessionRequest(
            self.session_id,
            self.epoch,
            _by_topic(rows),
            [m.ForgottenTopic(t, ps) for t, ps in forgotten.items()],
        )

    def on_response(self, response: m.FetchResponse) -> bool:
        """Take the answer to the last ``build``. False: the broker refused the session
        (the answer carries no partitions); the next fetch is full."""
        pending, self._pending = self._pending, None
        if response.error_code in SESSION_ERRORS or pending is None:
            self.reset()
            if response.error_code in SESSION_ERRORS:
                self.session_id = NO_SESSION  # the broker does not have it
            return False
        if self.epoch == INITIAL_EPOCH:
            self.session_id = response.session_id  # 0: no session, fetch in full again
        if self.session_id == NO_SESSION:
            self._sent = {}
            return True
        self.epoch = 1 if self.epoch >= MAX_EPOCH else self.epoch + 1
        # A partition answered with an error left the broker's session: list it again
        # in full next time, if it is still wanted. (``pending`` is the caller's dict.)
        errored = [
            (t.topic, r.partition)
            for t in response.topics
            for r in t.partitions
            if r.error_code != errors.NONE
        ]
        if isinstance(pending, _Updates):  # build_changes: apply the changes in place
            sent = self._sent
            for key, row in pending.items():
                if row is None:
                    sent.pop(key, None)
                else:
                    sent[key] = row
            for key in errored:
                sent.pop(key, None)
            return True
        if errored:
            pending = dict(pending)
            for key in errored:
                pending.pop(key, None)
        self._sent = pending
        return True

    def reset(self) -> None:
        """Start over: the next fetch is full, closes the old session (if the broker
        still has it) and opens a new one."""
        self.epoch = INITIAL_EPOCH
        self._sent = {}
        self._pending = None


class _Updates(dict[Key, "m.FetchPartition | None"]):
    """An incremental request's changes to the session (None: forgotten), pending."""


def _by_topic(rows: Iterable[tuple[Key, m.FetchPartition]]) -> list[m.FetchTopic]:
    by_topic: dict[str, list[m.FetchPartition]] = {}
    for (topic, _), p in rows:
        group = by_topic.get(topic)
        if group is None:
            group = by_topic[topic] = []
        group.append(p)
    return [m.FetchTopic(t, ps) for t, ps in by_topic.items()]
