"""The deduper's side of the control link: a hub between gRPC streams and the loop.

gRPC handler threads never touch Kafka clients. Inbound messages (topic specs,
progress, resent envelopes) are queued for the deduper loop; outbound messages
(watermarks, backpressure, resend requests) are queued per connected wrapper
and written by that wrapper's stream handler.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from confluent_kafka import KafkaException
from ferryman import protocol
from ferryman.config import DeduperConfig
from ferryman.errors import FerrymanError, PreconditionError
from ferryman.kafka_errors import is_transient
from ferryman.rpc import IncompatiblePeerError, call_deadline
from ferryman.state import PartitionKey
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2

from ferryman_deduper._datapath import PartitionCounters
from ferryman_deduper._decide import PartitionState
from ferryman_deduper._gaps import GapTracker
from ferryman_deduper._translate import MAX_BUDGET_S, OffsetTranslator
from ferryman_deduper._translate_group import GroupTranslator

_log = logging.getLogger(__name__)

#: How long a stream handler waits for an outbound message before checking
#: whether the client is still there; bounds how long a dead stream lingers.
_OUTBOUND_POLL_S = 0.5


@dataclass
class _Session:
    wrapper_id: str
    outbound: queue.Queue[control_pb2.ConnectResponse] = field(default_factory=queue.Queue)


#: Resend requests remembered for their answers; beyond this many, unanswered ones are forgotten.
_MAX_PENDING_REQUESTS = 10_000


@dataclass(frozen=True)
class ResentEnvelopes:
    """Envelopes received in answer to a resend request."""

    request_id: int
    envelopes: list[envelope_pb2.Envelope]
    done: bool
    error: str
    deleted_before: int = 0
    """See ``ResendData.deleted_before``."""


class ControlHub:
    """Thread-safe state shared by the control servicer and the deduper loop."""

    def __init__(self, deduper_id: str, flow: str) -> None:
        self.deduper_id = deduper_id
        self.flow = flow
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._request_ids = itertools.count(1)
        self.specs: queue.Queue[state_pb2.TopicSpec] = queue.Queue()
        self.resent: queue.Queue[ResentEnvelopes] = queue.Queue()
        self._log_end: dict[PartitionKey, int] = {}
        #: Which wrapper last reported progress for a partition: it reads that partition now.
        self._owner: dict[PartitionKey, str] = {}
        self._paused: tuple[bool, str] = (False, "")
        self._ended = threading.Event()
        #: Takes the wrappers' group checkpoints (set by the deduper; None: they are dropped).
        self.on_group_checkpoints: Callable[[control_pb2.GroupCheckpoints], None] | None = None

    # ---------------------------------------------------------- sessions
    def end_streams(self) -> None:
        """End every control stream and refuse new ones, for good (the drain).

        Each wrapper sees its stream end and dials again, here or elsewhere,
        instead of holding the server for the whole gRPC grace.
        """
        self._ended.set()

    @property
    def streams_ended(self) -> bool:
        """True once `end_streams` was called."""
        return self._ended.is_set()

    def open(self, wrapper_id: str) -> _Session:
        """Register a connected wrapper and tell it the current backpressure state."""
        session = _Session(wrapper_id)
        with self._lock:
            self._sessions[wrapper_id] = session
            paused, reason = self._paused
        if paused:
            session.outbound.put(
                control_pb2.ConnectResponse(backpressure=control_pb2.Backpressure(paused=True, reason=reason))
            )
        _log.info("wrapper %s connected over the control link", wrapper_id)
        return session

    def close(self, session: _Session) -> None:
        """Forget a wrapper whose stream ended."""
        with self._lock:
            if self._sessions.get(session.wrapper_id) is session:
                del self._sessions[session.wrapper_id]
        _log.info("wrapper %s disconnected from the control link", session.wrapper_id)

    def connected_wrappers(self) -> list[str]:
        """Ids of the wrappers connected now."""
        with self._lock:
            return sorted(self._sessions)

    # ---------------------------------------------------------- outbound
    def broadcast(self, message: control_pb2.ConnectResponse) -> None:
        """Queue message for every connected wrapper."""
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            s.outbound.put(message)

    def set_backpressure(self, paused: bool, reason: str) -> bool:
        """Change the pause state; broadcast and return True if it changed."""
        with self._lock:
            if self._paused[0] == paused:
                return False
            self._paused = (paused, reason)
        self.broadcast(control_pb2.ConnectResponse(backpressure=control_pb2.Backpressure(paused=paused, reason=reason)))
        _log.warning("backpressure: %s wrappers (%s)", "pausing" if paused else "resuming", reason)
        return True

    def request_resend(
        self, source: envelope_pb2.SourcePartition, from_offset: int, to_offset: int, attempt: int = 0
    ) -> int | None:
        """Ask one connected wrapper for source records again; None if none is connected.

        The first request for a gap (attempt 0) goes to the wrapper that reads
        the partition now (the last to report progress for it), if connected;
        each repeated request for the same gap goes to the next connected wrapper, so a
        wrapper that cannot answer does not hold a gap open for ever. Any
        wrapper of the flow can serve a resend: it reads the range with a
        consumer of its own, outside the group.
        """
        key = PartitionKey(source.topic, source.partition)
        with self._lock:
            owner = self._owner.get(key)
            ids = sorted(self._sessions)
            if not ids:
                return None
            if owner in ids:
                ids.remove(owner)
                ids.insert(0, owner)
            session = self._sessions[ids[attempt % len(ids)]]
        request_id = next(self._request_ids)
        session.outbound.put(
            control_pb2.ConnectResponse(
                resend_request=control_pb2.ResendRequest(
                    request_id=request_id, source=source, from_offset=from_offset, to_offset=to_offset
                )
            )
        )
        return request_id

    # ---------------------------------------------------------- inbound
    def on_progress(self, progress: control_pb2.Progress, wrapper_id: str = "") -> None:
        """Record source log-end offsets reported by a wrapper (and that it reads those partitions)."""
        with self._lock:
            for p in progress.partitions:
                key = PartitionKey(p.topic, p.partition)
                self._log_end[key] = p.log_end_offset
                if wrapper_id:
                    self._owner[key] = wrapper_id

    def log_end_offset(self, key: PartitionKey) -> int | None:
        """Last reported source log-end offset of key."""
        with self._lock:
            return self._log_end.get(key)


class ControlServicer(control_pb2_grpc.ControlServiceServicer):
    """``ferryman.v1.ControlService``: one Connect stream per wrapper instance."""

    def __init__(self, hub: ControlHub) -> None:
        self._hub = hub

    def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: Iterator[control_pb2.ConnectRequest], context: grpc.ServicerContext
    ) -> Iterator[control_pb2.ConnectResponse]:
        """Handshake, then pump messages both ways until the stream ends."""
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of a control stream must be a Hello")
            return
        hello = first.hello
        if not protocol.compatible(hello.version):
            raise IncompatiblePeerError(
                f"wrapper {hello.wrapper_id} speaks control protocol {protocol.describe(hello.version)}, this "
                f"deduper speaks {protocol.describe(protocol.current_version())}: majors must match"
            )
        if hello.flow != self._hub.flow:
            raise IncompatiblePeerError(
                f"wrapper {hello.wrapper_id} runs flow {hello.flow!r} but this deduper serves {self._hub.flow!r}"
            )
        if self._hub.streams_ended:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"deduper {self._hub.deduper_id} is shutting down")
            return
        session = self._hub.open(hello.wrapper_id)
        reader = threading.Thread(
            target=self._read, args=(request_iterator, session), name=f"control-read-{hello.wrapper_id}", daemon=True
        )
        reader.start()
        try:
            yield control_pb2.ConnectResponse(
                welcome=control_pb2.Welcome(
                    version=protocol.current_version(), deduper_id=self._hub.deduper_id, flows=[self._hub.flow]
                )
            )
            while context.is_active() and reader.is_alive() and not self._hub.streams_ended:
                try:
                    yield session.outbound.get(timeout=_OUTBOUND_POLL_S)
                except queue.Empty:
                    continue
        finally:
            self._hub.close(session)

    def _read(self, request_iterator: Iterator[control_pb2.ConnectRequest], session: _Session) -> None:
        try:
            for req in request_iterator:
                kind = req.WhichOneof("kind")
                if kind == "topic_specs":
                    for spec in req.topic_specs.specs:
                        self._hub.specs.put(spec)
                elif kind == "progress":
                    self._hub.on_progress(req.progress, session.wrapper_id)
                elif kind == "group_checkpoints":
                    if self._hub.on_group_checkpoints is not None:
                        self._hub.on_group_checkpoints(req.group_checkpoints)
                elif kind == "resend_data":
                    d = req.resend_data
                    self._hub.resent.put(
                        ResentEnvelopes(d.request_id, list(d.envelopes), d.done, d.error, d.deleted_before)
                    )
        except grpc.RpcError:
            pass  # the stream ended (client gone); the writer side notices too
        except Exception:
            _log.exception("control stream of %s failed", session.wrapper_id)


class DeduperStatusServicer(control_pb2_grpc.DeduperServiceServicer):
    """``ferryman.v1.DeduperService``: status and offset translation for operators and tools."""

    def __init__(
        self,
        status: Callable[[], control_pb2.GetDeduperStatusResponse],
        translator: OffsetTranslator | None = None,
        groups: GroupTranslator | None = None,
    ) -> None:
        self._status = status
        self._translator = translator
        self._groups = groups

    def GetDeduperStatus(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.GetDeduperStatusRequest, context: grpc.ServicerContext
    ) -> control_pb2.GetDeduperStatusResponse:
        """Snapshot of counters, watermarks and connected wrappers."""
        return self._status()

    def TranslateOffsets(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.TranslateOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.TranslateOffsetsResponse:
        """The destination offset of a source position, from the offset map (`OffsetTranslator`)."""
        if self._translator is None:
            raise PreconditionError("this deduper has not reached its destination cluster yet")
        return self._translator.translate(request, call_deadline(context).cap(MAX_BUDGET_S))

    def TranslateGroupOffsets(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.TranslateGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.TranslateGroupOffsetsResponse:
        """Where a consumer group resumes at the destination (`GroupTranslator`)."""
        return self._group_translator().translate(request, call_deadline(context).cap(MAX_BUDGET_S))

    def CommitGroupOffsets(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.CommitGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.CommitGroupOffsetsResponse:
        """Translate a consumer group's offsets and commit them at the destination (`GroupTranslator`)."""
        return self._group_translator().commit(request, call_deadline(context).cap(MAX_BUDGET_S))

    def _group_translator(self) -> GroupTranslator:
        if self._groups is None:
            raise PreconditionError("this deduper has not reached its destination cluster yet")
        return self._groups


def lag_seconds(lag: int, written_timestamp_ms: int, now_ms: float) -> float:
    """A partition's lag in seconds: 0 without lag; else the age of the last record written, -1 when unknown.

    Records are appended after the last one written, so its age bounds the age of the oldest record not
    yet replicated from above (source timestamps are the producers' clocks: a skewed one skews this).
    """
    if lag == 0:
        return 0.0
    if lag < 0 or written_timestamp_ms < 0:
        return -1.0
    return round(max(0.0, (now_ms - written_timestamp_ms) / 1000), 3)


class ControlTicker:
    """The deduper's side of the control link, served from its loop thread (the only one touching Kafka).

    Each tick: new topic specs to the destination topics, resent envelopes to
    the data path, resend requests for open gaps, and every
    ``watermark_interval_s`` the committed watermarks and the backpressure
    state to every connected wrapper.
    """

    def __init__(
        self,
        *,
        hub: ControlHub,
        dc: DeduperConfig,
        committed: dict[PartitionKey, PartitionState],
        gaps: GapTracker,
        staging_lag: Callable[[], int],
        destination_trouble: Callable[[], str],
        process_resent: Callable[[envelope_pb2.Envelope], None],
        add_specs: Callable[[Sequence[state_pb2.TopicSpec]], None],
        partition_counters: Mapping[PartitionKey, PartitionCounters],
    ) -> None:
        self._hub = hub
        self._counters = partition_counters
        self._dc = dc
        self._committed = committed
        self._gaps = gaps
        self._staging_lag = staging_lag
        self._destination_trouble = destination_trouble
        self._process_resent = process_resent
        self._add_specs = add_specs
        self._next_watermarks = 0.0
        #: Resend requests awaiting their answer: the partition and first offset asked for.
        self._requests: dict[int, tuple[PartitionKey, int]] = {}

    def tick(self, now: float) -> None:
        """Serve what the link brought and what is due."""
        hub = self._hub
        self._take_specs()
        while True:
            try:
                answer = hub.resent.get_nowait()
            except queue.Empty:
                break
            asked = self._requests.pop(answer.request_id, None) if answer.done else None
            if answer.deleted_before > 0 and asked is not None:
                self._source_deleted(asked, answer.deleted_before)
            elif answer.error:
                _log.error("resend request %d could not be served: %s", answer.request_id, answer.error)
            for env_msg in answer.envelopes:
                self._process_resent(env_msg)
        for key, gap in self._gaps.due(now, self._dc.resend_retry_s):
            request_id = hub.request_resend(gap.source, gap.missing_from, gap.missing_to, gap.attempts)
            if request_id is not None:
                gap.mark_requested(now)
                if len(self._requests) > _MAX_PENDING_REQUESTS:
                    self._requests.clear()  # answers that never came (wrappers gone): the gaps ask again
                self._requests[request_id] = (key, gap.missing_from)
                _log.warning(
                    "asked for source records %s-%d %d..%d again (request %d)",
                    gap.source.topic,
                    gap.source.partition,
                    gap.missing_from,
                    gap.missing_to,
                    request_id,
                )
        if now >= self._next_watermarks:
            self._next_watermarks = now + self._dc.watermark_interval_s
            hub.broadcast(control_pb2.ConnectResponse(watermarks=control_pb2.Watermarks(partitions=self.watermarks())))
            self._update_backpressure()

    def _take_specs(self) -> None:
        """Hand every spec the link brought since the last tick to the destination topics, in one batch.

        One call for all of them: a wrapper sends the specs of all its topics at once, and the
        destination topics are made with a few requests for the whole batch, not a few per topic.
        """
        specs: list[state_pb2.TopicSpec] = []
        while True:
            try:
                specs.append(self._hub.specs.get_nowait())
            except queue.Empty:
                break
        if not specs:
            return
        try:
            self._add_specs(specs)
        except (KafkaException, FerrymanError) as exc:
            if not is_transient(exc):
                raise
            # Kept in the specs: the periodic sync (or the first record's resolve) makes them later.
            _log.warning(
                "destination topics of %d new topic specs not all ready yet (%s); trying again later", len(specs), exc
            )

    def _source_deleted(self, asked: tuple[PartitionKey, int], deleted_before: int) -> None:
        """A wrapper answered that the source no longer holds the start of a gap: it is lost, loudly."""
        key, from_offset = asked
        gap = self._gaps.lost(key, from_offset, deleted_before)
        if gap is None or gap.attempts > 1:
            return  # a stale answer, or already said for this gap (each repeat asks another wrapper)
        _log.error(
            "DATA LOST upstream: source partition %s no longer holds records %d..%d (its log now starts at %d; "
            "retention deleted them before they were replicated). The partition is held at offset %d. Way out: "
            "if a copy exists, produce it back to the source; or accept the loss with flows[].acknowledged_losses "
            "(topic %s, partition %d, through_offset %d) and restart the deduper",
            key,
            gap.missing_from,
            gap.lost_to,
            deleted_before,
            gap.missing_from - 1,
            key.topic,
            key.partition,
            gap.lost_to,
        )

    def gaps(self) -> list[control_pb2.DataGap]:
        """Open gaps, for status."""
        return [
            control_pb2.DataGap(
                topic=key.topic,
                partition=key.partition,
                missing_from=gap.missing_from,
                missing_to=gap.missing_to,
                resend_requests=gap.attempts,
                opened_at_ms=gap.opened_at_ms,
                lost_to=gap.lost_to if gap.lost_to >= gap.missing_from else -1,
            )
            for key, gap in self._gaps.items()
        ]

    def watermarks(self) -> list[control_pb2.PartitionWatermark]:
        """Committed watermarks and lag of the owned source partitions."""
        out = []
        now_ms = time.time() * 1000
        for key, st in sorted(dict(self._committed).items()):
            log_end = self._hub.log_end_offset(key)
            lag = max(0, log_end - (st.watermark + 1)) if log_end is not None else -1
            counters = self._counters.get(key) or PartitionCounters()
            written = counters.written_timestamp_ms
            out.append(
                control_pb2.PartitionWatermark(
                    topic=key.topic,
                    partition=key.partition,
                    watermark=st.watermark,
                    lag=lag,
                    log_end_offset=log_end if log_end is not None else -1,
                    duplicates_dropped=counters.duplicates_dropped,
                    written_timestamp_ms=written,
                    lag_seconds=lag_seconds(lag, written, now_ms),
                )
            )
        return out

    def _update_backpressure(self) -> None:
        trouble = self._destination_trouble()
        if trouble:
            self._hub.set_backpressure(True, trouble)
            return
        lag = self._staging_lag()
        limit = self._dc.backpressure_max_staging_lag
        if lag > limit:
            self._hub.set_backpressure(True, f"staging is {lag} envelopes ahead of the deduper (limit {limit})")
        elif lag <= limit // 2:
            self._hub.set_backpressure(False, "caught up")
