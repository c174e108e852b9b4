"""The broker side of the controller protocol: channel, lifecycle, metadata follower.

- `ControllerChannel(voters)`: a connection to the active controller. Follows
  NOT_CONTROLLER redirects (the response names the leader), tries the other voters when
  one is unreachable, and retries retriable errors with backoff until a deadline. Which
  voter to ask next is decided by `ControllerTargets` and `RequestRetry`, without I/O,
  so the deterministic simulator runs the same policy.
- `BrokerLifecycle`: registers with a fresh incarnation id, heartbeats every
  ``broker.heartbeat.interval.ms`` with the broker's metadata offset, exposes
  fenced / caught-up / should-shut-down, and runs a controlled shutdown.
- `MetadataFollower`: long-polls FetchMetadata, applies records (or a snapshot) to a
  `MetadataImage` through `MetadataDelta`, and calls ``listener(delta, image)`` per batch.
- `ControllerChannel.call(message)`: a typed request to the active controller (what a
  broker uses to forward CreateTopics, DeleteTopics, AlterPartition...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from rillet.client.runtime.tasks import FatalHandler, fatal_fault, on_death_fatal
from rillet.client.wire import messages as m
from rillet.client.wire import schemas
from rillet.client.wire.connection import Connection, R, RequestMessage
from rillet.client.wire.errors import (
    NetworkError,
    NotControllerError,
    RequestTimedOutError,
    RilletError,
    code_of,
    error_for,
    is_retriable,
)
from rillet.controller.config import parse_voters
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    MetadataDelta,
    MetadataImage,
    decode_records,
    image_to_records,
    snapshot_records,
)

log = logging.getLogger(__name__)
SHUTDOWN_HEARTBEAT_S = 0.05  # heartbeat interval while a controlled shutdown waits

NOT_CONTROLLER = NotControllerError.code
STALE_BROKER_EPOCH = code_of("STALE_BROKER_EPOCH")
BROKER_ID_NOT_REGISTERED = code_of("BROKER_ID_NOT_REGISTERED")
BACKOFF_MIN_MS = 20
BACKOFF_MAX_MS = 500
DEFAULT_DEADLINE_MS = 30_000


class MetadataApplyError(Exception):
    """The listener failed on a batch the image already holds: the broker's state and its
    image now disagree, which only a restart (replaying from disk and metadata) repairs."""


@dataclass(slots=True)
class RequestRetry:
    """One request's retry state: redirects followed since its last backoff, next backoff."""

    redirects: int = 0
    backoff_ms: int = BACKOFF_MIN_MS

    def next_backoff_ms(self) -> int:
        """The pause before the next try; it doubles up to BACKOFF_MAX_MS."""
        wait_ms = self.backoff_ms
        self.redirects = 0
        self.backoff_ms = min(BACKOFF_MAX_MS, wait_ms * 2)
        return wait_ms


class ControllerTargets:
    """Which voter a request goes to next, from what the voters answered before."""

    def __init__(self, voters: Sequence[int], rng: random.Random | None = None) -> None:
        self.voters = list(voters)
        self.leader_id: int | None = None  # the voter we believe active
        self.rotation = list(voters)
        # Spread brokers' first guesses over the voters.
        (rng.shuffle if rng is not None else random.shuffle)(self.rotation)

    def target(self) -> int:
        return self.leader_id if self.leader_id is not None else self.rotation[0]

    def on_answer(self, target: int) -> None:
        """``target`` answered without NOT_CONTROLLER: it is the active controller."""
        self.leader_id = target

    def on_unreachable(self, target: int | None) -> None:
        """No answer (network error or timeout): forget the leader, rotate to the next."""
        self.leader_id = None
        failed = target if target is not None else self.rotation[0]
        if self.rotation[0] == failed:
            self.rotation.append(self.rotation.pop(0))

    def on_not_controller(self, target: int, leader: int, retry: RequestRetry) -> bool:
        """NOT_CONTROLLER from ``target`` naming ``leader`` (-1: none known). True: ask the
        named leader at once; False: back off first."""
        if leader in self.voters and leader != target:
            self.leader_id = leader
            retry.redirects += 1
            # Voters that keep naming each other (stale views during an election): back
            # off like any retriable error.
            return retry.redirects <= len(self.voters)
        if leader == target:
            self.leader_id = target  # leading but not active yet: wait for it
        else:
            self.on_unreachable(target)  # no leader known: ask the next voter
        return False


class ControllerChannel:
    """Requests to whichever voter is the active controller right now."""

    def __init__(
        self,
        voters: str | Mapping[int, tuple[str, int]],
        *,
        client_id: str = "broker",
        request_timeout_ms: int = 5000,
    ) -> None:
        self.voters = parse_voters(voters) if isinstance(voters, str) else dict(voters)
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.targets = ControllerTargets(list(self.voters))
        self._conn: Connection | None = None
        self._conn_id: int | None = None
        self._lock = asyncio.Lock()

    @property
    def leader_id(self) -> int | None:
        """The voter we believe active."""
        return self.targets.leader_id

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _connection(self) -> Connection:
        """The connection to the believed leader (or the next voter to try)."""
        target = self.targets.target()
        if self._conn is not None and not self._conn.closed and self._conn_id == target:
            return self._conn
        async with self._lock:
            if self._conn is not None and not self._conn.closed and self._conn_id == target:
                return self._conn
            if self._conn is not None:
                self._conn.close()
            host, port = self.voters[target]
            self._conn = None
            self._conn = await Connection.open(
                host,
                port,
                client_id=self.client_id,
                connect_timeout_ms=self.request_timeout_ms,
                request_timeout_ms=self.request_timeout_ms,
            )
            self._conn_id = target
            return self._conn

    async def request(
        self,
        api: schemas.Api | int | str,
        fields: dict[str, Any],
        *,
        deadline_ms: int = DEFAULT_DEADLINE_MS,
        timeout_ms: int | None = None,
    ) -> tuple[dict[str, Any], memoryview]:
        """Send to the active controller; redirect and retry until ``deadline_ms``.

        Returns the response (header, payload). A top-level non-retriable error is raised
        as its exception; a retriable one is retried until the deadline, then raised.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_ms / 1000
        retry = RequestRetry()
        while True:
            target: int | None = None
            try:
                conn = await self._connection()
                target = self._conn_id
                assert target is not None
                header, payload = await conn.request(
                    api, dict(fields), raise_errors=False, timeout_ms=timeout_ms
                )
                answer = m.ErrorResponse.from_header(header)
                code = answer.error_code
                if code == NOT_CONTROLLER:
                    error: RilletError = error_for(code, answer.error_message or "")
                    if self.targets.on_not_controller(target, answer.leader_id, retry):
                        if loop.time() >= deadline:
                            raise error
                        continue
                elif code and is_retriable(code):
                    error = error_for(code, answer.error_message or "")
                elif code:
                    raise error_for(code, answer.error_message or "")
                else:
                    self.targets.on_answer(target)
                    return header, payload
            except (NetworkError, RequestTimedOutError) as e:
                error = e
                if self._conn is not None:
                    self._conn.close()
                self.targets.on_unreachable(target)
            if loop.time() + retry.backoff_ms / 1000 >= deadline:
                raise error
            await asyncio.sleep(retry.next_backoff_ms() / 1000)

    async def call(
        self,
        message: RequestMessage[R],
        *,
        deadline_ms: int = DEFAULT_DEADLINE_MS,
        timeout_ms: int | None = None,
    ) -> tuple[R, memoryview]:
        """``request`` for a typed message: its typed response (per-item errors inside)
        and payload."""
        api = schemas.api_of(message)
        header, payload = await self.request(
            api, message.to_header(), deadline_ms=deadline_ms, timeout_ms=timeout_ms
        )
        return schemas.decode_response(api, api.max_version, header), payload


# -- broker lifecycle ---------------------------------------------------------------------


@dataclass(slots=True)
class LifecycleState:
    broker_epoch: int = -1
    registered: bool = False
    fenced: bool = True
    caught_up: bool = False
    should_shut_down: bool = False


class BrokerLifecycle:
    """Registration and heartbeats of one broker.

    ``metadata_offset()`` returns the offset of the newest metadata record the broker has
    applied (``MetadataFollower.image.offset``); the controller unfences the broker once
    it reaches its registration. ``on_change(state)`` is called when fenced/shut-down flags
    change.
    """

    def __init__(
        self,
        channel: ControllerChannel,
        broker_id: int,
        listeners: Sequence[tuple[str, str, int]],
        metadata_offset: Callable[[], int],
        *,
        cluster_id: str = "",
        rack: str | None = None,
        heartbeat_interval_ms: int = 500,
        on_change: Callable[[LifecycleState], None] | None = None,
    ) -> None:
        self.channel = channel
        self.broker_id = broker_id
        self.listeners = [m.Listener(*listener) for listener in listeners]
        self.metadata_offset = metadata_offset
        self.cluster_id = cluster_id
        self.rack = rack
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.on_change = on_change
        self.incarnation_id = uuid.uuid4().hex
        self.state = LifecycleState()
        self._task: asyncio.Task[None] | None = None
        self._want_shutdown = False
        self._beat_now = asyncio.Event()  # the next heartbeat goes now, not at the interval
        self._changed = asyncio.Event()

    async def register(self) -> int:
        """Register (fenced) and return the broker epoch; retries until it succeeds."""
        response, _ = await self.channel.call(
            m.BrokerRegistrationRequest(
                broker_id=self.broker_id,
                cluster_id=self.cluster_id,
                incarnation_id=self.incarnation_id,
                listeners=self.listeners,
                rack=self.rack,
            )
        )
        self.state.broker_epoch = response.broker_epoch
        self.state.registered = True
        log.info("broker %d: registered with epoch %d", self.broker_id, self.state.broker_epoch)
        return self.state.broker_epoch

    async def start(self) -> None:
        """Register, then heartbeat in the background."""
        await self.register()
        self._start_heartbeats()

    def _start_heartbeats(self) -> None:
        # Policy fatal: a broker whose heartbeats stopped is fenced while it keeps serving.
        task = asyncio.get_running_loop().create_task(self._heartbeat_loop(), name="heartbeat")
        self._task = on_death_fatal(task, f"broker {self.broker_id}: heartbeat loop")

    async def stop(self) -> None:
        """Stop heartbeating without telling the controller (it fences us on timeout)."""
        if self._task is not None:
            self._task.cancel()
            # An exception that ended the loop already went to the fatal handler.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def heartbeat(self) -> LifecycleState:
        response, _ = await self.channel.call(
            m.BrokerHeartbeatRequest(
                broker_id=self.broker_id,
                broker_epoch=self.state.broker_epoch,
                current_metadata_offset=self.metadata_offset(),
                want_fence=False,
                want_shut_down=self._want_shutdown,
            ),
            deadline_ms=max(self.heartbeat_interval_ms * 4, 2000),
        )
        s = self.state
        before = (s.fenced, s.should_shut_down)
        s.fenced, s.caught_up = response.is_fenced, response.is_caught_up
        s.should_shut_down = response.should_shut_down
        if (s.fenced, s.should_shut_down) != before:
            log.info(
                "broker %d: fenced=%s should_shut_down=%s",
                self.broker_id,
                s.fenced,
                s.should_shut_down,
            )
            if self.on_change is not None:
                self.on_change(s)
        self._changed.set()
        return s

    async def _heartbeat_loop(self) -> None:
        while not self.state.should_shut_down:
            try:
                await self.heartbeat()
            except RilletError as e:
                log.warning("broker %d: heartbeat failed: %s", self.broker_id, e)
                if e.code in (STALE_BROKER_EPOCH, BROKER_ID_NOT_REGISTERED):
                    await self._reregister()
            interval_s = self.heartbeat_interval_ms / 1000
            if self._want_shutdown:
                # The controller lets us go once our metadata shows the leaderships moved
                # away: a prompt next heartbeat reports that offset (a stop waited a whole
                # interval for it).
                interval_s = min(interval_s, SHUTDOWN_HEARTBEAT_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._beat_now.wait()
            self._beat_now.clear()

    async def _reregister(self) -> None:
        """Our registration is gone or replaced (e.g. fenced and expired): start afresh."""
        self.incarnation_id = uuid.uuid4().hex
        with contextlib.suppress(RilletError):
            await self.register()

    async def wait_for(self, predicate: Callable[[LifecycleState], bool]) -> None:
        while not predicate(self.state):
            self._changed.clear()
            await self._changed.wait()

    async def controlled_shutdown(self, deadline_ms: int = 30_000) -> bool:
        """Ask the controller to move leaderships away; True when it says we may go. The
        asking heartbeat goes at once (as Kafka's broker does), not at the next interval:
        every stop of a broker waited up to ``broker.heartbeat.interval.ms`` for it."""
        self._want_shutdown = True
        self._beat_now.set()
        if self._task is None:
            self._start_heartbeats()
        try:
            async with asyncio.timeout(deadline_ms / 1000):
                await self.wait_for(lambda s: s.should_shut_down)
            return True
        except TimeoutError:
            log.warning(
                "broker %d: controlled shutdown not confirmed within %d ms",
                self.broker_id,
                deadline_ms,
            )
            return False
        finally:
            await self.stop()


# -- metadata follower --------------------------------------------------------------------

Listener = Callable[[MetadataDelta, MetadataImage], Awaitable[None] | None]


def delta_from_empty(image: MetadataImage) -> MetadataDelta:
    """``image`` as a delta over the empty image: everything in it appears created."""
    delta = MetadataDelta(EMPTY_IMAGE)
    delta.replay_all(image_to_records(image), -1, -1)
    delta.offset, delta.epoch = image.offset, image.epoch
    return delta


def snapshot_delta(data: bytes) -> MetadataDelta:
    """A snapshot as a delta over the empty image, in one pass over its records (as
    `delta_from_empty(decode_snapshot(data))`, which built the image twice)."""
    offset, epoch, records = snapshot_records(data)
    delta = MetadataDelta(EMPTY_IMAGE)
    delta.replay_all(records, -1, -1)
    delta.offset, delta.epoch = offset, epoch
    return delta


class CatchUpGate:
    """What of the fetched metadata a starting broker may act on.

    Until the follower's image first reaches the high watermark the controller reported,
    nothing: an image behind it may name this broker leader of an epoch long over, with
    an ISR of itself, and a restarted broker acting on it would advance its high
    watermark over records the real leader has since truncated (Kafka's metadata loader
    also publishes nothing before it has caught up). The first image handed over then
    comes as one delta over the empty image; after that every batch passes.
    """

    def __init__(self) -> None:
        self.caught_up = False

    def admit(
        self, delta: MetadataDelta, image: MetadataImage, high_watermark: int
    ) -> MetadataDelta | None:
        """The delta to publish with ``image``, or None to hold it back."""
        if self.caught_up:
            return delta
        if image.offset < high_watermark:
            return None
        self.caught_up = True
        return delta if delta.image.offset < 0 else delta_from_empty(image)

    def wants_whole_image(
        self, delta: MetadataDelta, image: MetadataImage, high_watermark: int
    ) -> bool:
        """Whether `admit` would now build ``image`` as a delta over the empty image (the
        first catch-up): a caller may build it off the loop first (`delta_from_empty`)."""
        return not self.caught_up and image.offset >= high_watermark and delta.image.offset >= 0


def apply_fetched(
    image: MetadataImage, is_snapshot: bool, payload: bytes | memoryview
) -> tuple[MetadataDelta, MetadataImage, int] | None:
    """A FetchMetadata answer over ``image``: (delta, new image, entries applied), or None
    when it brought nothing. A snapshot yields a delta over the empty image."""
    if is_snapshot:
        delta = snapshot_delta(bytes(payload))
        return delta, delta.apply(), 1
    if not payload:
        return None
    entries = msgpack.unpackb(payload, raw=False)
    delta = MetadataDelta(image)
    for entry in entries:
        replay_fetched_entry(delta, image, entry)
    return delta, delta.apply(), len(entries)


async def apply_fetched_yielding(
    image: MetadataImage, is_snapshot: bool, payload: bytes | memoryview
) -> tuple[MetadataDelta, MetadataImage, int] | None:
    """`apply_fetched` with a loop turn between entries: one answer holds up to
    ``max_bytes`` of entries (1 MiB, some 24,000 partition records), which took 250-400
    ms to decode and replay in one go on a loaded broker. A snapshot (the whole image:
    50,000 partitions held the loop for about 4 s) is decoded and replayed on a worker
    thread; nothing there touches what the loop uses (images are immutable)."""
    if is_snapshot:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, apply_fetched, image, True, bytes(payload))
    if not payload:
        return None
    entries = msgpack.unpackb(payload, raw=False)
    delta = MetadataDelta(image)
    for n, entry in enumerate(entries):
        if n:
            await asyncio.sleep(0)
        replay_fetched_entry(delta, image, entry)
    return delta, delta.apply(), len(entries)


def replay_fetched_entry(delta: MetadataDelta, image: MetadataImage, entry: list[Any]) -> None:
    """One ``[offset, epoch, data]`` entry of a FetchMetadata answer onto ``delta``."""
    offset, epoch, data = entry
    if offset <= image.offset:
        return  # a duplicate after a retry
    delta.replay_all(decode_records(data) if data else [], offset, epoch)
    delta.offset, delta.epoch = offset, epoch


class MetadataFollower:
    """Follows the committed metadata log from the active controller.

    ``listener(delta, image)`` is called for each applied batch, in log order, from the
    first time the image reaches the controller's high watermark on (`CatchUpGate`).
    That first call, and any after a snapshot load, has a delta over the EMPTY image
    (everything appears created; ``delta.image.offset == -1``): a broker reconciles its
    local state with the image.
    """

    def __init__(
        self,
        channel: ControllerChannel,
        broker_id: int = -1,
        *,
        listener: Listener | None = None,
        max_wait_ms: int = 500,
        max_bytes: int = 1024 * 1024,
        broker_epoch: Callable[[], int] = lambda: -1,
        on_fatal: FatalHandler | None = None,
    ) -> None:
        """``on_fatal(what, error)``: called when applying a batch fails (the follower then
        stops); default: the process's fatal fault handler (client/runtime/tasks.py)."""
        self.channel = channel
        self.broker_id = broker_id
        self.listener = listener
        self.on_fatal = on_fatal
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.broker_epoch = broker_epoch
        self.image: MetadataImage = EMPTY_IMAGE
        self.high_watermark = -1
        # Loop time a fetch was sent whose answer's high watermark the image then reached:
        # the image holds everything committed before it (the remote bucket sweep's bound).
        self.caught_up_at: float | None = None
        self.snapshots_loaded = 0
        self._gate = CatchUpGate()
        self._task: asyncio.Task[None] | None = None
        self._applied = asyncio.Event()

    def start(self) -> None:
        task = asyncio.get_running_loop().create_task(self._run(), name="metadata-follower")
        self._task = on_death_fatal(task, "metadata follower")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_for_offset(self, offset: int) -> None:
        while self.image.offset < offset:
            self._applied.clear()
            await self._applied.wait()

    async def fetch_once(self) -> int:
        """One FetchMetadata round trip; returns how many entries (or 1 snapshot) applied."""
        sent = asyncio.get_running_loop().time()
        response, payload = await self.channel.call(
            m.FetchMetadataRequest(
                broker_id=self.broker_id,
                broker_epoch=self.broker_epoch(),
                fetch_offset=self.image.offset + 1,
                last_fetched_epoch=self.image.epoch,
                max_wait_ms=self.max_wait_ms,
                max_bytes=self.max_bytes,
            ),
            timeout_ms=self.max_wait_ms + 5000,
        )
        self.high_watermark = response.high_watermark
        fetched = await apply_fetched_yielding(
            self.image, response.snapshot_id is not None, payload
        )
        if fetched is None:
            if self.image.offset >= response.high_watermark:
                self.caught_up_at = sent
            return 0
        delta, image, count = fetched
        if response.snapshot_id is not None:
            self.snapshots_loaded += 1
        if self._gate.wants_whole_image(delta, image, response.high_watermark):
            # A starting broker's first image, as one delta: a pass over every partition.
            loop = asyncio.get_running_loop()
            delta = await loop.run_in_executor(None, delta_from_empty, image)
        admitted = self._gate.admit(delta, image, response.high_watermark)
        if admitted is None:  # still catching up after the start: the listener waits
            self.image = image
            self._applied.set()
            return count
        await self._publish(admitted, image)
        if image.offset >= response.high_watermark:
            self.caught_up_at = sent
        return count

    async def _publish(self, delta: MetadataDelta, image: MetadataImage) -> None:
        self.image = image
        if self.listener is not None:
            try:
                result = self.listener(delta, image)
                if asyncio.iscoroutine(result):
                    await result
            except Exception as e:
                # Even a RilletError: the image has moved past this batch, so retrying the
                # fetch would never hand it to the listener again.
                raise MetadataApplyError(
                    f"applying metadata batch up to offset {image.offset} failed: {e!r}"
                ) from e
        self._applied.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.fetch_once()
            except RilletError as e:  # the fetch itself failed: nothing applied, retry
                log.warning("metadata follower: %s", e)
                await asyncio.sleep(0.1)
            except Exception as e:
                # A listener failure or a batch we cannot decode: the broker's state may
                # be half-updated (Kafka: a metadata publishing fault is fatal).
                self._fatal("metadata follower: applying a batch failed", e)
                return

    def _fatal(self, what: str, error: BaseException) -> None:
        (self.on_fatal or fatal_fault)(what, error)
