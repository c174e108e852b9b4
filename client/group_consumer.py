"""The asyncio driver of a group consumer's membership: runs ``GroupMembership``
(client/group_membership.py) for a ``Consumer`` with a ``group_id``.

- Heartbeats go to the coordinator through ``CoordinatorClient`` (which follows it when
  it moves), one at a time, when the machine says so.
- Revocations and assignments run one after the other in a worker task, so listener
  calls never overlap: a revocation stops handing the partitions' records to the
  application, commits their positions (when auto-committing), calls
  ``on_partitions_revoked``, then drops them; an assignment fetches the group's
  committed offsets (else resets by ``auto_offset_reset``), calls
  ``on_partitions_assigned`` and starts fetching. Lost partitions are dropped at once
  (no commit: another member may own them already), then ``on_partitions_lost`` runs.
- Commits carry the member id and epoch and go one at a time, so a retried older
  commit never lands after a newer one. STALE_MEMBER_EPOCH is retried after the next
  heartbeat answer, with the new epoch, while the partitions have not been lost since;
  FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID loses every partition and rejoins.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from rillet.client.group_coordinator import MOVED, CoordinatorClient
from rillet.client.group_membership import (
    Assign,
    Effect,
    Fatal,
    GroupMembership,
    HeartbeatRequest,
    HeartbeatResult,
    Lose,
    MembershipConfig,
    Revoke,
    SendHeartbeat,
    State,
)
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.client.wire.errors import RilletError, error_for

if TYPE_CHECKING:
    from rillet.client.consumer import Consumer, TopicPartition

log = logging.getLogger(__name__)

STALE_MEMBER_EPOCH = errors.code_of("STALE_MEMBER_EPOCH")
FENCED = frozenset({errors.code_of("FENCED_MEMBER_EPOCH"), errors.code_of("UNKNOWN_MEMBER_ID")})
LOADING = errors.code_of("COORDINATOR_LOAD_IN_PROGRESS")
UNKNOWN_TOPIC = errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")


class CommitFailedError(RilletError):
    """A commit that cannot succeed: the partition is not this member's (any more), or
    the member was fenced (its partitions were lost; it rejoins)."""


class NoOffsetForPartitionError(errors.OffsetOutOfRangeError):
    """A newly assigned partition has no committed offset and auto_offset_reset='none'."""


class RebalanceListener(Protocol):
    """Kafka's ConsumerRebalanceListener; each method may be sync or async, and any may
    be left out."""

    def on_partitions_revoked(self, partitions: set[TopicPartition]) -> Any: ...
    def on_partitions_assigned(self, partitions: set[TopicPartition]) -> Any: ...
    def on_partitions_lost(self, partitions: set[TopicPartition]) -> Any: ...


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def heartbeat_message(group_id: str, req: HeartbeatRequest) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id=req.member_id,
        member_epoch=req.member_epoch,
        instance_id=req.instance_id,
        rack_id=req.rack,
        rebalance_timeout_ms=-1 if req.rebalance_timeout_ms is None else req.rebalance_timeout_ms,
        subscribed_topic_names=None
        if req.subscribed_topics is None
        else list(req.subscribed_topics),
        server_assignor=req.server_assignor,
        topic_partitions=None
        if req.owned is None
        else [m.GroupTopicPartitions(t, sorted(ps)) for t, ps in sorted(req.owned.items())],
    )


def heartbeat_result(response: m.ConsumerGroupHeartbeatResponse) -> HeartbeatResult:
    assignment = None
    if response.assignment is not None:
        assignment = {a.topic_id: frozenset(a.partitions) for a in response.assignment}
    return HeartbeatResult(
        response.error_code,
        response.member_epoch,
        response.heartbeat_interval_ms,
        assignment,
        response.error_message,
    )


class GroupDriver:
    """Runs one consumer's group membership; the Consumer owns fetching and positions."""

    def __init__(
        self,
        consumer: Consumer,
        group_id: str,
        *,
        instance_id: str | None,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        server_assignor: str | None,
        enable_auto_commit: bool,
        auto_commit_interval_ms: int,
        listener: RebalanceListener | None,
    ) -> None:
        self.consumer = consumer
        self.group_id = group_id
        self.meta = consumer._meta
        self.coordinator = CoordinatorClient(
            self.meta, group_id, retry_backoff_ms=int(consumer.retry_backoff_s * 1000)
        )
        self.machine = GroupMembership(
            MembershipConfig(
                group_id,
                str(uuid.uuid4()),
                instance_id=instance_id,
                rack=consumer.client_rack or None,
                server_assignor=server_assignor,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                retry_backoff_ms=int(consumer.retry_backoff_s * 1000),
            )
        )
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.listener = listener
        self.revoking: set[TopicPartition] = set()
        """Partitions whose records are no longer handed out: their positions are final."""
        self._work: asyncio.Queue[Effect] = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._answered = asyncio.Event()  # a heartbeat was answered (epochs may have moved)
        self._left = asyncio.Event()
        self._leaving = False
        self._commit_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []
        self._heartbeat_task: asyncio.Task | None = None

    # --- lifecycle -----------------------------------------------------------------

    def start(self, topics: Iterable[str]) -> None:
        self.on_metadata()
        self.apply(self.machine.subscribe(topics, _now_ms()))
        self._tasks = [
            asyncio.ensure_future(self._timer_loop()),
            asyncio.ensure_future(self._worker()),
        ]
        if self.enable_auto_commit:
            self._tasks.append(asyncio.ensure_future(self._auto_commit_loop()))

    async def close(self, timeout_s: float) -> None:
        """Revoke everything (committing when auto-committing), leave the group, stop."""
        self._leaving = True
        self.apply(self.machine.leave(_now_ms()))
        try:
            async with asyncio.timeout(timeout_s):
                await self._left.wait()
        except TimeoutError:
            log.warning(
                "group %s: leaving took over %.0f s; closing anyway", self.group_id, timeout_s
            )
        tasks = [t for t in (*self._tasks, self._heartbeat_task) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def subscribe(self, topics: Iterable[str]) -> None:
        self.apply(self.machine.subscribe(topics, _now_ms()))

    def on_metadata(self) -> None:
        snap = self.meta.snapshot
        names = {tid: name for name, tid in snap.topic_ids.items()}
        self.apply(self.machine.on_metadata(names, _now_ms()))

    def check_lease(self) -> None:
        """Before handing out records: past the lease, partitions are lost at once."""
        self.apply(self.machine.poll(_now_ms()))

    # --- effects -------------------------------------------------------------------------

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, SendHeartbeat):
                self._heartbeat_task = asyncio.ensure_future(self._heartbeat(effect.request))
            elif isinstance(effect, Lose):
                lost = {self._tp(tp) for tp in effect.partitions}
                log.info("group %s: partitions lost: %s", self.group_id, sorted(lost))
                self.revoking -= lost
                self.consumer._drop_partitions(lost)
                self._work.put_nowait(effect)
            elif isinstance(effect, Fatal):
                log.error("group %s: %r", self.group_id, effect.error)
                self.consumer._fail(effect.error)
                self._left.set()
            else:
                self._work.put_nowait(effect)
        if self._leaving and self.machine.state in (State.UNSUBSCRIBED, State.FATAL):
            self._left.set()
        if self.machine.unresolved_topics:
            self.consumer._refresh_later()
        self._wakeup.set()

    def _tp(self, tp: tuple[str, int]) -> TopicPartition:
        from rillet.client.consumer import TopicPartition

        return TopicPartition(*tp)

    async def _timer_loop(self) -> None:
        while True:
            self._wakeup.clear()
            now = _now_ms()
            self.apply_quiet(self.machine.poll(now))
            wake = self.machine.next_wakeup_ms()
            timeout = None if wake is None else max(0, wake - _now_ms()) / 1000
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def apply_quiet(self, effects: list[Effect]) -> None:
        """apply() without waking the timer loop (it is the caller)."""
        self.apply(effects)
        self._wakeup.clear()

    async def _heartbeat(self, req: HeartbeatRequest) -> None:
        message = heartbeat_message(self.group_id, req)
        timeout_ms = self.consumer.request_timeout_ms
        try:
            response = await self.coordinator.call(
                message,
                lambda r: r.error_code,
                timeout_ms=timeout_ms,
                request_timeout_ms=timeout_ms,
            )
            result = heartbeat_result(response)
        except RilletError as e:
            if e.retriable or e.code in MOVED or e.code == LOADING:
                log.info("group %s: heartbeat failed: %r", self.group_id, e)
                self.apply(self.machine.on_heartbeat_failed(_now_ms()))
                return
            result = HeartbeatResult(e.code, error_message=e.message or None)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug or a malformed answer: heartbeats must go on
            log.exception("group %s: heartbeat failed", self.group_id)
            self.apply(self.machine.on_heartbeat_failed(_now_ms()))
            return
        if result.error_code:
            log.info(
                "group %s: heartbeat answered %s",
                self.group_id,
                errors.error_name(result.error_code),
            )
        self.apply(self.machine.on_heartbeat_response(result, _now_ms()))
        if result.error_code == 0:
            self._answered.set()
            self._answered = asyncio.Event()

    # --- revocations and assignments, one at a time ------------------------------------------

    async def _worker(self) -> None:
        while True:
            effect = await self._work.get()
            try:
                if isinstance(effect, Revoke):
                    await self._revoke(effect)
                elif isinstance(effect, Assign):
                    await self._assign(effect)
                elif isinstance(effect, Lose):
                    await self._call_listener(
                        "on_partitions_lost", {self._tp(tp) for tp in effect.partitions}
                    )
            except asyncio.CancelledError:
                raise
            except RilletError as e:
                log.error("group %s: %s failed: %s", self.group_id, type(effect).__name__, e)
                self.consumer._fail(e)
            except Exception as e:  # a bug or a listener's error: surface it, never hang
                log.exception("group %s: %s failed", self.group_id, type(effect).__name__)
                self.consumer._fail(e)

    async def _revoke(self, action: Revoke) -> None:
        tps = {self._tp(tp) for tp in action.partitions}
        self.revoking |= tps
        log.info("group %s: revoking %s", self.group_id, sorted(tps))
        if self.enable_auto_commit:
            offsets = {
                tp: self.consumer._positions[tp] for tp in tps if tp in self.consumer._positions
            }
            try:
                await self._commit(offsets)
            except RilletError as e:
                log.warning("group %s: commit before revoking failed: %r", self.group_id, e)
        await self._call_listener("on_partitions_revoked", tps)
        if not self.machine.is_current(action.seq):
            return  # lost meanwhile: already dropped
        self.revoking -= tps
        self.consumer._drop_partitions(tps)
        self.apply(self.machine.revoke_done(action.seq, _now_ms()))

    async def _assign(self, action: Assign) -> None:
        tps = {self._tp(tp) for tp in action.partitions}
        log.info("group %s: assigned %s", self.group_id, sorted(tps))
        while True:
            try:
                committed = await self.committed(tps)
                break
            except RilletError as e:
                if not e.retriable or not self.machine.is_current(action.seq):
                    raise
                await asyncio.sleep(self.consumer.retry_backoff_s)
        if not self.machine.is_current(action.seq):
            return
        missing = [tp for tp in tps if committed.get(tp) is None]
        if self.consumer.auto_offset_reset != "none":
            await self.consumer._reset_positions(missing)
            if not self.machine.is_current(action.seq):
                return
        for tp in tps:
            offset = committed.get(tp)
            if offset is not None:
                self.consumer._set_position(tp, offset)
        self.consumer._add_partitions(tps)
        await self._call_listener("on_partitions_assigned", tps)
        self.apply(self.machine.assign_done(action.seq, _now_ms()))
        # With 'none' a partition without a position is owned but not fetched until the
        # application seeks it (in the listener, or after getmany raised this).
        unset = sorted(tp for tp in missing if tp not in self.consumer._positions)
        if unset:
            raise NoOffsetForPartitionError(
                f"group {self.group_id!r} has no committed offset for {unset} and "
                "auto_offset_reset is 'none': seek them"
            )

    async def _call_listener(self, name: str, tps: set[TopicPartition]) -> None:
        fn = getattr(self.listener, name, None)
        if fn is None:
            return
        result = fn(set(tps))
        if inspect.isawaitable(result):
            await result

    # --- commits ---------------------------------------------------------------------------

    def owned(self) -> set[TopicPartition]:
        return {self._tp(tp) for tp in self.machine.owned_names()}

    def consumed_offsets(self) -> dict[TopicPartition, int]:
        """Positions of records already returned to the application, for owned
        partitions (what ``commit()`` and auto-commit send)."""
        return {
            tp: pos
            for tp, pos in self.consumer._positions.items()
            if tp in self.consumer._assigned and self.machine.owns(tp)
        }

    async def commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        if offsets is None:
            offsets = self.consumed_offsets()
        else:
            foreign = sorted(tp for tp in offsets if not self.machine.owns(tp))
            if foreign:
                raise CommitFailedError(
                    f"group {self.group_id!r}: {foreign} not assigned to this member; "
                    "nothing was committed"
                )
        await self._commit(dict(offsets))

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not offsets:
            return
        generation = self.machine.generation
        async with self._commit_lock:
            while True:
                if self.machine.generation != generation:
                    raise CommitFailedError(
                        f"group {self.group_id!r}: partitions were lost before the commit"
                    )
                if not self.machine.in_group:
                    await self._next_answer("not in the group yet")
                    continue
                codes = await self._send_commit(offsets)
                bad = {tp: c for tp, c in codes.items() if c}
                if not bad:
                    return
                if set(bad.values()) & FENCED:
                    self.apply(self.machine.on_fenced(_now_ms()))
                    raise CommitFailedError(
                        f"group {self.group_id!r}: member fenced "
                        f"({errors.error_name(next(iter(bad.values())))}); partitions lost"
                    )
                if STALE_MEMBER_EPOCH in bad.values():
                    # Our epoch moved on at the coordinator: retry with the one the next
                    # heartbeat answer brings.
                    await self._next_answer("its member epoch stayed stale")
                    continue
                tp, code = sorted(bad.items())[0]
                if code == UNKNOWN_TOPIC:
                    raise CommitFailedError(
                        f"group {self.group_id!r}: topic {tp.topic!r} does not exist (deleted?)"
                    )
                raise error_for(code, f"commit of {tp.topic}-{tp.partition}")

    async def _next_answer(self, why: str) -> None:
        """Wait for the next answered heartbeat (a new epoch), at most a request
        timeout."""
        answered = self._answered
        try:
            async with asyncio.timeout(self.consumer.request_timeout_ms / 1000):
                await answered.wait()
        except TimeoutError:
            raise CommitFailedError(f"group {self.group_id!r}: {why}; nothing committed") from None

    async def _send_commit(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[m.OffsetCommitPartition]] = {}
        for tp, offset in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(m.OffsetCommitPartition(tp.partition, offset))
        request = m.OffsetCommitRequest(
            group_id=self.group_id,
            topics=[m.OffsetCommitTopic(t, ps) for t, ps in by_topic.items()],
            generation_id_or_member_epoch=self.machine.member_epoch,
            member_id=self.machine.member_id,
            group_instance_id=self.machine.config.instance_id,
        )

        def first_code(r: m.OffsetCommitResponse) -> int:
            for t in r.topics:
                for p in t.partitions:
                    if p.error_code in MOVED or p.error_code == LOADING:
                        return p.error_code
            return 0

        response = await self.coordinator.call(
            request, first_code, timeout_ms=self.consumer.request_timeout_ms
        )
        return {
            self._tp((t.name, p.partition)): p.error_code
            for t in response.topics
            for p in t.partitions
        }

    async def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where it committed none)."""
        wanted: dict[str, list[int]] = {}
        for tp in sorted(set(tps)):
            wanted.setdefault(tp.topic, []).append(tp.partition)
        request = m.OffsetFetchRequest(
            [
                m.OffsetFetchGroup(
                    self.group_id, None, -1, [m.OffsetFetchTopic(t, ps) for t, ps in wanted.items()]
                )
            ]
        )
        response = await self.coordinator.call(
            request,
            lambda r: r.groups[0].error_code if r.groups else 0,
            timeout_ms=self.consumer.request_timeout_ms,
        )
        out: dict[TopicPartition, int | None] = {}
        for g in response.groups:
            if g.error_code:
                raise error_for(g.error_code, f"offsets of group {self.group_id!r}")
            for t in g.topics:
                for p in t.partitions:
                    if p.error_code and p.error_code != UNKNOWN_TOPIC:
                        raise error_for(p.error_code, f"offset of {t.name}-{p.partition}")
                    offset = p.committed_offset
                    out[self._tp((t.name, p.partition))] = None if offset < 0 else offset
        return out

    async def _auto_commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_s)
            try:
                await self._commit(self.consumed_offsets())
            except RilletError as e:
                log.info("group %s: auto-commit failed: %r", self.group_id, e)


__all__ = [
    "CommitFailedError",
    "GroupDriver",
    "NoOffsetForPartitionError",
    "RebalanceListener",
]
