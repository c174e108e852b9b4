"""A controller quorum among other actors of one simulation, and the brokers' link to it.

`ControllerActor` is a `RaftActor` (raft_cluster.py: the production `RaftDriver` around a
real `RaftNode` applying to a real `ControllerStateMachine`, over a simulated durable
store, with crashes that lose whatever was not persisted) that also answers brokers as
a `ControllerServer` does:

- BrokerRegistration, BrokerHeartbeat and AlterPartition run the production handler
  coroutines of controller/handlers.py, wrapped as the server wraps them: a node that is
  not the active controller answers NOT_CONTROLLER naming the Raft leader it knows, and
  an answer goes out only once the operation's records commit (or NOT_CONTROLLER when the
  leadership is lost first). The coroutines await a `Commit` that the state machine
  settles, so no event loop is needed;
- FetchMetadata answers from the committed Raft log with the production payload
  (`metadata_entries`), or the snapshot when the broker asks below the log start, and is
  parked until something new commits, as the server's long poll is.

`ControllerLink` is what broker/link does for one broker process: the channel picks the
voter with the production `ControllerTargets` and `RequestRetry` (follow a
NOT_CONTROLLER's leader hint, rotate when a voter does not answer, back off), the
lifecycle registers, heartbeats, and registers again with a fresh incarnation when the
controller says its epoch is stale or its registration gone, and the follower
long-polls FetchMetadata, applies each answer with the production `apply_fetched` and
hands the broker nothing before it first catches up (the production `CatchUpGate`);
AlterPartition proposals queue in the production `AlterPartitionQueue` and go out as the
broker's AlterPartitionManager sends them (one request in flight, every queued partition
in it, backoff after a failure or a refusal).

Every node reads its own clock (clocks.py): Raft timers, broker sessions and request
timeouts all run on drifting clocks.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from rillet.broker.link.alter_partition_manager import (
    AlterItem,
    AlterPartitionQueue,
    alter_partition_answers,
    alter_partition_request,
)
from rillet.broker.link.controller_client import (
    BROKER_ID_NOT_REGISTERED,
    NOT_CONTROLLER,
    STALE_BROKER_EPOCH,
    CatchUpGate,
    ControllerTargets,
    RequestRetry,
    apply_fetched,
)
from rillet.broker.replication.types import AlterPartitionResponse, ProposeAlterPartition
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors, schemas
from rillet.client.wire import messages as m
from rillet.client.wire.errors import NotControllerError
from rillet.controller import handlers
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    MetadataDelta,
    MetadataImage,
    TopicPartition,
)
from rillet.controller.metadata.quorum import ControllerConfig, PendingImages, QuorumController
from rillet.controller.raft.core import Ready
from rillet.controller.server import ControllerServer

from .network import SimNetwork
from .raft_cluster import RaftActor, RaftInvariants, SimOptions
from .scheduler import Scheduler, SimClock
from .trace import Trace

CONTROLLER_IDS = (100, 101, 102)
REQUEST_TIMEOUT_MS = 300  # one attempt at one voter
HEARTBEAT_INTERVAL_MS = 100
HEARTBEAT_DEADLINE_MS = 4 * HEARTBEAT_INTERVAL_MS  # as BrokerLifecycle.heartbeat
REGISTER_DEADLINE_MS = 3000
REGISTER_RETRY_MS = 500  # QuorumLink.REGISTER_RETRY_S, scaled like the rest
CALL_DEADLINE_MS = 1500  # AlterPartition, FetchMetadata
FETCH_MAX_WAIT_MS = 200
FETCH_RETRY_MS = 100  # MetadataFollower after a failed fetch
METADATA_MAX_BYTES = 4096  # small, so a lagging broker catches up in several answers
CONTROLLER_TICK_MS = 50
REQUEST_TIMED_OUT = errors.code_of("REQUEST_TIMED_OUT")

ADMIN_TIMEOUT_MS = 1000  # an admin's request that gets no answer fails after this
# The operations this simulation asks of the controllers, as build_handlers maps them.
OPS: dict[type, handlers.ActiveHandler] = {
    m.BrokerRegistrationRequest: handlers.broker_registration,
    m.BrokerHeartbeatRequest: handlers.broker_heartbeat,
    m.AlterPartitionRequest: handlers.alter_partition,
    m.CreateTopicsRequest: handlers.create_topics,
    m.DeleteTopicsRequest: handlers.delete_topics,
}


# ---------------------------------------------------------------------------
# messages between a broker's link and a controller


@dataclass(frozen=True, slots=True)
class ControllerRequest:
    link_id: int
    request_id: int
    message: Any  # a typed request of client/wire/messages.py


@dataclass(frozen=True, slots=True)
class ControllerAnswer:
    link_id: int
    request_id: int
    message: Any  # a typed response, or a NOT_CONTROLLER header map
    payload: bytes


# ---------------------------------------------------------------------------
# running a handler coroutine without an event loop


class Commit:
    """What a handler awaits here in place of the server's asyncio futures: settled with
    None once the records commit, or with the error that ends the wait."""

    __slots__ = ("done", "error", "resume")

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None
        self.resume: Callable[[], None] | None = None

    def settle(self, error: Exception | None) -> None:
        if self.done:
            return
        self.done, self.error = True, error
        if self.resume is not None:
            self.resume()

    def __await__(self) -> Generator[Commit, None, None]:
        if not self.done:
            yield self
        if self.error is not None:
            raise self.error


def drive(
    coro: Coroutine[Any, Any, Response],
    reply: Callable[[Response], None],
    defer: Callable[[Callable[[], None]], None],
) -> None:
    """Runs ``coro`` until it awaits a `Commit`; resumes it (``defer``red, as a future's
    callback runs later) once that settles; ``reply`` gets what it returns."""

    def step() -> None:
        try:
            waited = coro.send(None)
        except StopIteration as stop:
            reply(stop.value)
            return
        assert isinstance(waited, Commit), waited
        waited.resume = lambda: defer(step)

    step()


# ---------------------------------------------------------------------------
# one controller


class ControllerActor(RaftActor):
    """A `RaftActor` that is also the `ControllerServer` surface the handlers read."""

    def __init__(self, quorum: ControllerQuorum, node_id: int, clock: Callable[[], int]) -> None:
        super().__init__(quorum, node_id, CONTROLLER_IDS, clock)
        self.quorum = quorum
        self.voters = {v: ("sim", v) for v in CONTROLLER_IDS}  # for not_controller()
        self.reads: list[tuple[int, int, Commit]] = []  # (offset, term, wait): commit([])
        self.fetches: list[tuple[int, ControllerRequest, int]] = []  # (src, request, until)
        self.paused_until = 0  # SIGSTOP: inputs queue up until then
        self.inbox: list[tuple[int, object]] = []
        self.next_controller_tick = 0
        self.serving: str | None = None  # the request whose records are being proposed

    # -- the server surface of controller/handlers.py ----------------------------------

    @property
    def node_id(self) -> int:
        return self.actor_id

    @property
    def images(self) -> PendingImages:
        assert self.machine is not None
        return self.machine.images

    @property
    def ctl(self) -> QuorumController | None:
        return self.machine.ctl if self.machine is not None else None

    @property
    def active(self) -> bool:
        return self.machine is not None and self.machine.active

    @property
    def cluster_id(self) -> str | None:
        return self.machine.cluster_id if self.machine is not None else None

    def not_controller(self) -> Response:
        return ControllerServer.not_controller(self)  # type: ignore[arg-type]

    async def commit(self, ctl: QuorumController, plan: Callable[[Any], Any]) -> Any:
        """ControllerServer.commit: run ``plan`` on the pending image, propose its records
        (every entry in one step here, so no other operation plans or proposes in
        between, as `ControllerServer.write` guarantees) and wait for the commit; with no
        records, until what the plan read has committed. Returns the plan's answer."""
        if not self.active or self.ctl is not ctl:
            raise NotControllerError("leadership changed while waiting to write")
        records, answer = plan(self.images.pending)
        await self._commit(records)
        return answer

    def _commit(self, records: list) -> Commit:
        machine, node = self.machine, self.node
        assert machine is not None and node is not None
        wait = Commit()
        if records:
            machine.propose(records, wait.settle)  # NotControllerError: NOT_CONTROLLER
            self.run_ready()
        else:
            self.reads.append((machine.images.pending.offset, node.term, wait))
            self.settle_reads()
        return wait

    async def commit_within(
        self, ctl: QuorumController, plan: Callable[[Any], Any], timeout_ms: int
    ) -> tuple[Any, bool]:
        """ControllerServer.commit_within; the simulation has no request timeouts."""
        return await self.commit(ctl, plan), True

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """ControllerServer.off_loop: the simulation plans in place (deterministic)."""
        return fn(*args)

    def settle_reads(self) -> None:
        machine, node = self.machine, self.node
        waiting = []
        for offset, term, wait in self.reads:
            if machine is None or node is None:
                continue
            if machine.image.offset >= offset:
                wait.settle(None)
            elif not machine.active or node.term != term:
                wait.settle(NotControllerError("leadership lost while waiting for a commit"))
            else:
                waiting.append((offset, term, wait))
        self.reads = waiting

    # -- lifecycle and time -------------------------------------------------------------

    def crash(self, why: str) -> None:
        super().crash(why)
        # Open connections die with the process: handlers waiting on commits never answer.
        self.reads, self.fetches, self.inbox, self.paused_until = [], [], [], 0

    def pause(self, duration_ms: int) -> None:
        now_ms = self.cluster.clock.now_ms
        self.paused_until = now_ms + duration_ms
        self.cluster.trace.add(now_ms, f"controller {self.actor_id} paused for {duration_ms} ms")
        incarnation = self.incarnation
        self.cluster.scheduler.at(
            self.paused_until, lambda: self.resume(incarnation), f"resume {self.actor_id}"
        )

    @property
    def paused(self) -> bool:
        return self.cluster.clock.now_ms < self.paused_until

    def resume(self, incarnation: int) -> None:
        """SIGCONT: what arrived meanwhile is handled in arrival order, late."""
        if incarnation != self.incarnation or self.paused:
            return
        inbox, self.inbox = self.inbox, []
        for src, payload in inbox:
            self.deliver(src, payload)

    def on_tick(self, incarnation: int) -> None:
        if self.driver is None or incarnation != self.incarnation:
            return
        if self.paused:
            self.schedule_tick()
            return
        super().on_tick(incarnation)
        now_ms = self.cluster.clock.now_ms
        if self.machine is not None and now_ms >= self.next_controller_tick:
            # The server's ticker: session expiry and leader rebalance, when active.
            self.next_controller_tick = now_ms + CONTROLLER_TICK_MS
            with contextlib.suppress(NotControllerError):
                self.machine.tick(self.clock())
            self.run_ready()
        self.answer_fetches()

    def on_applied(self) -> None:
        self.settle_reads()
        self.answer_fetches()

    # -- requests -----------------------------------------------------------------------

    def deliver(self, src: int, payload: object) -> None:
        if self.driver is None:
            return
        if self.paused or self.inbox:
            self.inbox.append((src, payload))
            return
        if isinstance(payload, bytes):
            super().deliver(src, payload)
        elif isinstance(payload, ControllerRequest):
            self.serve(src, payload)

    def serve(self, src: int, request: ControllerRequest) -> None:
        message = request.message
        if isinstance(message, m.FetchMetadataRequest):
            self.fetches.append((src, request, self.cluster.clock.now_ms + message.max_wait_ms))
            self.answer_fetches()
            return
        incarnation = self.incarnation

        def reply(response: Response) -> None:
            if self.driver is not None and incarnation == self.incarnation:
                self.answer(src, request, response)

        self.handle(message, f"broker-{src}", reply)

    def handle(self, message: Any, client: str, reply: Callable[[Response], None]) -> None:
        """Runs the production handler of ``message`` as the server wraps it; ``reply``
        gets its answer, unless this node dies first."""
        wrapped = Request(
            schemas.api_of(message), 0, 0, client, {}, memoryview(b""), client, message
        )
        scheduler, incarnation = self.cluster.scheduler, self.incarnation

        def defer(step: Callable[[], None]) -> None:
            def resume() -> None:
                if self.driver is not None and incarnation == self.incarnation:
                    step()  # a process that died runs none of its handlers again

            scheduler.after(0, resume, f"handler {self.actor_id}")

        self.serving = type(message).__name__  # until the handler first waits
        try:
            drive(
                handlers._active(self, OPS[type(message)])(wrapped),  # type: ignore[arg-type]
                reply,
                defer,
            )
        finally:
            self.serving = None

    def answer(self, src: int, request: ControllerRequest, response: Response) -> None:
        payload = b"".join(bytes(p) for p in response.payload)
        answer = ControllerAnswer(request.link_id, request.request_id, response.message, payload)
        if self.paused:  # a handler resumed by a commit just before SIGSTOP: sent after it
            incarnation = self.incarnation

            def send_late() -> None:
                if self.driver is not None and incarnation == self.incarnation:
                    self.cluster.network.send(self.actor_id, src, answer)

            self.cluster.scheduler.at(self.paused_until, send_late, "late answer")
            return
        self.cluster.network.send(self.actor_id, src, answer)

    def answer_fetches(self) -> None:
        """The long poll of handlers.fetch_metadata: answered once there is something from
        the fetch offset on, at the deadline (empty), or NOT_CONTROLLER when not active."""
        if not self.fetches or self.driver is None or self.paused:
            return
        now_ms = self.cluster.clock.now_ms
        waiting = []
        for src, request, until in self.fetches:
            response = self.fetch_answer(request.message, now_ms >= until)
            if response is None:
                waiting.append((src, request, until))
            else:
                self.answer(src, request, response)
        self.fetches = waiting

    def fetch_answer(self, f: m.FetchMetadataRequest, expired: bool) -> Response | None:
        node = self.node
        if not self.active or node is None:
            return self.not_controller()
        offset = max(f.fetch_offset, 1)  # Raft indexes start at 1
        if offset <= node.log.snapshot_index and node.snapshot is not None:
            snapshot = node.snapshot
            snapshot_id = m.SnapshotId(snapshot.index, snapshot.term)
            return handlers._fetch_response(self, snapshot_id, [snapshot.data])  # type: ignore[arg-type]
        committed = self.images.committed.offset
        if offset > committed and not expired:
            return None
        payload = handlers.metadata_entries(node, offset, committed, max(f.max_bytes, 1))
        return handlers._fetch_response(self, None, [payload] if payload else [])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# the quorum


class ControllerQuorum:
    """Three controller actors on a shared simulation; the `RaftHost` they run on."""

    def __init__(
        self,
        seed: int,
        rng: random.Random,
        clock: SimClock,
        scheduler: Scheduler,
        network: SimNetwork,
        trace: Trace,
        fail: Callable[[str], NoReturn],
        clocks: dict[int, Callable[[], int]],
        controller_config: ControllerConfig,
    ) -> None:
        self.rng, self.clock, self.scheduler = rng, clock, scheduler
        self.network, self.trace, self._fail = network, trace, fail
        self.options = SimOptions(
            seed=seed,
            election_timeout_ms=500,
            heartbeat_interval_ms=50,
            # Rates differ by up to 4 %: a lease ends early enough for 4 % of 500 ms.
            max_clock_drift_ms=50,
            max_entries_per_append=rng.choice([1, 8, 64]),
            snapshot_every_records=rng.choice([10, 50, 1000]),
            controller_config=controller_config,
            refusals=False,  # see SimOptions.refusals
        )
        self.invariants = RaftInvariants(fail)
        self.actors = {i: ControllerActor(self, i, clocks[i]) for i in CONTROLLER_IDS}
        for actor in self.actors.values():
            network.register(actor)
        self.chaos = True

    def fail(self, text: str) -> NoReturn:
        self._fail(text)

    def start(self) -> None:
        for actor in self.actors.values():
            actor.start()

    def check(self) -> None:
        for actor in self.actors.values():
            actor.check()

    def active(self) -> ControllerActor | None:
        return next((a for a in self.actors.values() if a.active), None)

    def newest_image(self) -> MetadataImage:
        """The newest image any controller committed (they agree: state-machine safety)."""
        seen = self.invariants.image_at
        return seen[max(seen)] if seen else EMPTY_IMAGE

    # -- faults -------------------------------------------------------------------------

    def crash(self, actor: ControllerActor, why: str, down_ms: int) -> None:
        if actor.node is None:
            return
        actor.crash(why)
        self.scheduler.after(down_ms, lambda: self.restart(actor), f"restart {actor.actor_id}")

    def restart(self, actor: ControllerActor) -> None:
        if actor.node is None:
            actor.start()

    def maybe_crash_after_persist(self, actor: RaftActor, ready: Ready) -> bool:
        """Sometimes a node dies right after a write, before sending anything: often the
        active controller that just wrote a broker's registration or AlterPartition
        (between the Raft append and its commit, with the broker waiting for the
        answer), now and then the active one after writing any entries, rarely anyone."""
        if not self.chaos:
            return False
        assert isinstance(actor, ControllerActor)
        if actor.serving is not None and ready.entries:
            rate, why = 0.05, f"while proposing for {actor.serving}"
        elif actor.active and ready.entries:
            rate, why = 0.01, "between append and commit"
        else:
            rate, why = 0.0005, "between persist and send"
        if self.rng.random() < rate:
            self.crash(actor, why, self.rng.randint(50, 1500))
            return True
        return False

    # -- what an admin asks of the active controller --------------------------------------

    def create_topic(self, topic: m.CreatableTopic, on_done: Callable[[int], None]) -> None:
        """CreateTopics through the production handler on the active controller:
        ``on_done(error code)`` once its records commit (NONE; the topic, with its id, is
        then in `newest_image`), at once with NOT_CONTROLLER when no controller is active,
        and with REQUEST_TIMED_OUT when no answer came in time (the controller died)."""
        request = m.CreateTopicsRequest([topic], timeout_ms=ADMIN_TIMEOUT_MS)
        self.admin(request, lambda r: r.topics[0].error_code, on_done)

    def delete_topic(self, name: str, on_done: Callable[[int], None]) -> None:
        """DeleteTopics through the production handler on the active controller (the
        outcomes as for `create_topic`)."""
        request = m.DeleteTopicsRequest([name], timeout_ms=ADMIN_TIMEOUT_MS)
        self.admin(request, lambda r: r.responses[0].error_code, on_done)

    def admin(
        self, request: Any, error_of: Callable[[Any], int], on_done: Callable[[int], None]
    ) -> None:
        actor = self.active()
        if actor is None:
            on_done(NOT_CONTROLLER)
            return
        answered = False

        def reply(response: Response) -> None:
            nonlocal answered
            if not answered:
                answered = True
                message = response.message
                on_done(NOT_CONTROLLER if isinstance(message, dict) else error_of(message))

        def time_out() -> None:
            nonlocal answered
            if not answered:
                answered = True
                on_done(REQUEST_TIMED_OUT)

        self.scheduler.after(ADMIN_TIMEOUT_MS, time_out, "admin timeout")
        actor.handle(request, "admin", reply)


# ---------------------------------------------------------------------------
# a broker's link to the quorum


@dataclass(slots=True)
class Call:
    """One request of the channel, through its retries."""

    message: Any
    on_done: Callable[[Any, bytes, int], None]  # (response or None, payload, error code)
    deadline_ms: int
    timeout_ms: int
    retry: RequestRetry = field(default_factory=RequestRetry)
    target: int = -1
    sent_ms: int = 0
    resend_ms: int | None = None  # backing off until then; None while in flight
    error: int = REQUEST_TIMED_OUT


class ControllerLink:
    """broker/link for one broker process: channel, lifecycle and metadata follower."""

    def __init__(
        self,
        link_id: int,
        broker_id: int,
        send: Callable[[int, object], None],
        clock: Callable[[], int],
        rng: random.Random,
        on_metadata: Callable[[MetadataDelta, MetadataImage], None],
        on_shut_down: Callable[[], None],
        trace: Callable[[str], None],
    ) -> None:
        self.link_id = link_id
        self.broker_id = broker_id
        self.send = send
        self.clock = clock
        self.targets = ControllerTargets(CONTROLLER_IDS, rng)
        self.on_metadata = on_metadata
        self.on_shut_down = on_shut_down
        self.trace = trace
        self.calls: dict[int, Call] = {}  # request id of the attempt in flight -> call
        self.backing_off: list[Call] = []
        self.request_ids = 0
        self.registrations = 0
        self.incarnation_id = ""
        self.broker_epoch = -1
        self.registered = False
        self.want_shut_down = False
        self.image: MetadataImage = EMPTY_IMAGE  # the follower's
        self.gate = CatchUpGate()
        self.heartbeat_due: int | None = None  # None: one in flight, or not registered yet
        self.heartbeats_sent = 0  # heartbeat calls started (retries of one call not counted)
        self.heartbeat_answered = 0  # the number of the last call the controller answered
        self.fetch_due: int | None = None
        self.register_due: int | None = None
        self.alter_queue = AlterPartitionQueue()

    def start(self) -> None:
        self.register()

    @property
    def leader_id(self) -> int | None:
        return self.targets.leader_id

    # -- the channel ----------------------------------------------------------------------

    def call(
        self,
        message: Any,
        on_done: Callable[[Any, bytes, int], None],
        deadline_ms: int,
        timeout_ms: int = REQUEST_TIMEOUT_MS,
    ) -> None:
        now_ms = self.clock()
        self.attempt(Call(message, on_done, now_ms + deadline_ms, timeout_ms))

    def attempt(self, call: Call) -> None:
        self.request_ids += 1
        call.target, call.sent_ms, call.resend_ms = self.targets.target(), self.clock(), None
        self.calls[self.request_ids] = call
        self.send(call.target, ControllerRequest(self.link_id, self.request_ids, call.message))

    def on_answer(self, answer: ControllerAnswer) -> None:
        call = self.calls.pop(answer.request_id, None)
        if call is None:
            return  # an attempt given up on, or a duplicate
        message = answer.message
        header = message if isinstance(message, dict) else message._asdict()
        error = m.ErrorResponse.from_header(header)
        code = error.error_code
        if code == NOT_CONTROLLER:
            call.error = code
            if self.targets.on_not_controller(call.target, error.leader_id, call.retry):
                if self.clock() >= call.deadline_ms:
                    call.on_done(None, b"", code)
                else:
                    self.attempt(call)
                return
            self.back_off(call)
        elif code and errors.is_retriable(code):
            call.error = code
            self.back_off(call)
        elif code:
            call.on_done(None, b"", code)
        else:
            self.targets.on_answer(call.target)
            call.on_done(message, answer.payload, errors.NONE)

    def back_off(self, call: Call) -> None:
        now_ms = self.clock()
        if now_ms + call.retry.backoff_ms >= call.deadline_ms:
            call.on_done(None, b"", call.error)
            return
        call.resend_ms = now_ms + call.retry.next_backoff_ms()
        self.backing_off.append(call)

    def tick(self) -> None:
        now_ms = self.clock()
        for request_id, call in list(self.calls.items()):
            if now_ms - call.sent_ms > call.timeout_ms:  # no answer: the voter is unreachable
                del self.calls[request_id]
                self.targets.on_unreachable(call.target)
                call.error = REQUEST_TIMED_OUT
                self.back_off(call)
        due = [c for c in self.backing_off if c.resend_ms is not None and c.resend_ms <= now_ms]
        if due:
            self.backing_off = [c for c in self.backing_off if c not in due]
            for call in due:
                self.attempt(call)
        if self.register_due is not None and now_ms >= self.register_due:
            self.register()
        if self.heartbeat_due is not None and now_ms >= self.heartbeat_due:
            self.heartbeat()
        if self.fetch_due is not None and now_ms >= self.fetch_due:
            self.fetch()
        for item, answer in self.alter_queue.take_answers_due():  # replaced, never sent
            item.on_answer(answer)
        alter_due = self.alter_queue.next_due_ms(now_ms)
        if alter_due is not None and now_ms >= alter_due:
            self.send_alters()

    # -- the lifecycle (BrokerLifecycle, QuorumLink._register_and_follow) -------------------

    def register(self) -> None:
        self.register_due = None
        self.registrations += 1
        self.incarnation_id = f"broker-{self.broker_id}-link-{self.link_id}-{self.registrations}"
        request = m.BrokerRegistrationRequest(
            broker_id=self.broker_id,
            cluster_id="",
            incarnation_id=self.incarnation_id,
            listeners=[m.Listener("BROKER", "sim", self.broker_id)],
            rack=None,
        )

        def done(response: Any, payload: bytes, code: int) -> None:
            if code == errors.NONE:
                self.broker_epoch = response.broker_epoch
                self.trace(f"registered with epoch {self.broker_epoch}")
                if not self.registered:
                    self.registered = True
                    self.fetch()  # the follower starts once registered
            if self.registered:
                self.heartbeat_due = self.clock() + HEARTBEAT_INTERVAL_MS
            else:
                self.register_due = self.clock() + REGISTER_RETRY_MS

        self.call(request, done, REGISTER_DEADLINE_MS)

    def heartbeat(self) -> None:
        self.heartbeat_due = None
        self.heartbeats_sent += 1
        number = self.heartbeats_sent
        request = m.BrokerHeartbeatRequest(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            current_metadata_offset=self.image.offset,
            want_fence=False,
            want_shut_down=self.want_shut_down,
        )

        def done(response: Any, payload: bytes, code: int) -> None:
            if code == errors.NONE:
                self.heartbeat_answered = max(self.heartbeat_answered, number)
            if code == errors.NONE and response.should_shut_down:
                self.on_shut_down()
                return
            if code in (STALE_BROKER_EPOCH, BROKER_ID_NOT_REGISTERED):
                self.trace(f"heartbeat: {errors.error_name(code)}, registering again")
                self.register()  # BrokerLifecycle._reregister, then heartbeats go on
                return
            self.heartbeat_due = self.clock() + HEARTBEAT_INTERVAL_MS

        self.call(request, done, HEARTBEAT_DEADLINE_MS)

    # -- the metadata follower --------------------------------------------------------------

    def fetch(self) -> None:
        self.fetch_due = None
        request = m.FetchMetadataRequest(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            fetch_offset=self.image.offset + 1,
            last_fetched_epoch=self.image.epoch,
            max_wait_ms=FETCH_MAX_WAIT_MS,
            max_bytes=METADATA_MAX_BYTES,
        )

        def done(response: Any, payload: bytes, code: int) -> None:
            if code != errors.NONE:
                self.fetch_due = self.clock() + FETCH_RETRY_MS
                return
            fetched = apply_fetched(self.image, response.snapshot_id is not None, payload)
            if fetched is not None:
                delta, self.image, _ = fetched
                admitted = self.gate.admit(delta, self.image, response.high_watermark)
                if admitted is not None:
                    self.on_metadata(admitted, self.image)
            self.fetch()

        self.call(request, done, CALL_DEADLINE_MS, REQUEST_TIMEOUT_MS + FETCH_MAX_WAIT_MS)

    # -- AlterPartition (the broker's AlterPartitionManager) -------------------------------

    def alter_partition(
        self,
        topic: str,
        partition: int,
        proposal: ProposeAlterPartition,
        on_answer: Callable[[AlterPartitionResponse], None],
    ) -> None:
        """Queued in the production `AlterPartitionQueue`, sent as the broker's
        AlterPartitionManager sends: one request at a time carrying every queued item,
        the next one after a failure only once its backoff has passed (``tick``)."""
        self.alter_queue.submit(AlterItem(TopicPartition(topic, partition), proposal, on_answer))
        self.send_alters()

    def send_alters(self) -> None:
        queue = self.alter_queue
        batch = queue.next_request(self.clock())
        if batch is None:
            return
        proposals = [(item.tp, item.proposal) for item in batch]
        request = alter_partition_request(self.broker_id, self.broker_epoch, proposals)

        def done(response: Any, payload: bytes, code: int) -> None:
            now_ms = self.clock()
            if response is not None:
                answers = queue.on_answers(alter_partition_answers(proposals, response), now_ms)
            else:
                answers = queue.on_failure(code, now_ms)
            for item, answer in answers:
                item.on_answer(answer)
            self.send_alters()

        self.call(request, done, CALL_DEADLINE_MS)
