"""The wrapper's side of the control link, and its resend worker.

``ControlLink`` keeps one Connect stream open to a deduper, reconnecting with
capped exponential backoff. It never blocks the data path: the wrapper loop
only reads flags it sets (pause) and enqueues messages for it (progress,
specs); if the link is down those are dropped, and a pause is lifted (the
data path fails open, exactly-once does not depend on this link).

Topic specs are sent "on connect and whenever they change" (control.proto):
``send()`` refuses until the deduper's Welcome is back, so right after the
Welcome the link sends the specs of that moment itself. A spec changed during
the handshake is then either in that snapshot or accepted by ``send()``.

``ResendWorker`` answers resend requests with envelopes read again from the
source, on its own consumer and thread.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from ferryman.config import RpcConfig
from ferryman.errors import FerrymanError
from ferryman.rpc import open_channel, rpc_error_from
from ferryman.tracing import RecordSampler, RecordSpan, SpanShape, Tracing, kafka_attributes, new_span_id, new_trace_id
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2
from opentelemetry.trace import SpanKind, TracerProvider

from ferryman_wrapper._envelopes import build_envelopes
from ferryman_wrapper._traces import RunTraces, WrapperTraces

_log = logging.getLogger(__name__)

#: gRPC's default 4 MiB message cap would refuse a resend batch holding a
#: record near Kafka's size limit; resend answers are chunked to stay below this.
RESEND_CHUNK_BYTES = 3 * 1024 * 1024
#: How long the request generator waits on its queue before re-checking that
#: the stream is still wanted.
_OUTBOUND_POLL_S = 0.5
#: First reconnect delay; doubles up to RpcConfig.connect_backoff_max_s.
_BACKOFF_INITIAL_S = 0.2
#: Messages queued for one stream at most; a link that cannot keep up drops
#: (progress and specs are re-sent, resend answers are asked for again).
_OUTBOUND_MAX = 1000
#: Budget for reading one requested range back from the source: consumer
#: start-up, a leader lookup and the fetches of a range of a few MB over a slow
#: link. What was read by then is sent; the deduper asks again for the rest.
RESEND_READ_BUDGET_S = 30.0
#: consume() returns early only when its batch is full, and a resend range is
#: usually smaller than a batch: each call blocks at most this long, so the
#: end of the range (or of the partition) is noticed within it.
_RESEND_POLL_S = 0.1


@dataclass
class _Stream:
    """The outbound side of one Connect stream (each stream has its own queue).

    A queue per stream means a request generator left over from a stream that
    just ended can never take a message meant for its successor.
    """

    outbound: queue.Queue[control_pb2.ConnectRequest] = field(
        default_factory=lambda: queue.Queue(maxsize=_OUTBOUND_MAX)
    )
    welcomed: bool = False
    """The deduper accepted the Hello: sends are taken."""
    ended: threading.Event = field(default_factory=threading.Event)


class ControlLink:
    """One reconnecting control stream from this wrapper to one deduper."""

    def __init__(
        self,
        *,
        address: str,
        rpc: RpcConfig,
        hello: Callable[[], control_pb2.Hello],
        specs: Callable[[], list[state_pb2.TopicSpec]],
        on_backpressure: Callable[[bool, str], None],
        on_resend: Callable[[control_pb2.ResendRequest, ControlLink], None],
        on_watermarks: Callable[[control_pb2.Watermarks], None],
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.address = address
        self._rpc = rpc
        #: CLIENT spans of the Connect streams (one per stream, the deduper's SERVER span under it).
        self._tracer_provider = tracer_provider
        self._hello = hello
        self._specs = specs
        self._on_backpressure = on_backpressure
        self._on_resend = on_resend
        self._on_watermarks = on_watermarks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"control-{address}", daemon=True)
        self._call: Any = None
        self._stream: _Stream | None = None
        self.connects = 0
        """Streams opened so far (each attempt counts)."""

    @property
    def connected(self) -> bool:
        """True while a stream is up and the deduper has welcomed this wrapper."""
        stream = self._stream
        return stream is not None and stream.welcomed and not stream.ended.is_set()

    @property
    def running(self) -> bool:
        """True from start() until stop() has ended the link's thread."""
        return self._thread.is_alive()

    def start(self) -> None:
        """Start connecting in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Close the stream and stop reconnecting (idempotent)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def send(self, request: control_pb2.ConnectRequest) -> bool:
        """Queue a message; False (dropped) while the link is down or saturated."""
        stream = self._stream  # read once: the link thread replaces it on reconnect
        if stream is None or not stream.welcomed or stream.ended.is_set():
            return False
        try:
            stream.outbound.put_nowait(request)
        except queue.Full:
            return False
        return True

    def _requests(self, stream: _Stream) -> Iterator[control_pb2.ConnectRequest]:
        yield control_pb2.ConnectRequest(hello=self._hello())
        while not self._stop.is_set() and not stream.ended.is_set():
            try:
                yield stream.outbound.get(timeout=_OUTBOUND_POLL_S)
            except queue.Empty:
                continue

    def _run(self) -> None:
        backoff = _BACKOFF_INITIAL_S
        # The last stream was ended by the deduper's drain, and none welcomed us since: failures to dial it
        # again ("shutting down", then no server) are what a drain looks like, not a fault.
        drained = False
        while not self._stop.is_set():
            try:
                channel = open_channel(self.address, self._rpc, tracer_provider=self._tracer_provider)
            except Exception:
                _log.exception("cannot open a channel to %s", self.address)
                self._stop.wait(backoff)
                continue
            stream = _Stream()
            closed_by_peer = False
            try:
                self.connects += 1
                self._stream = stream
                stub = control_pb2_grpc.ControlServiceStub(channel)
                self._call = stub.Connect(self._requests(stream))
                for response in self._call:
                    backoff = _BACKOFF_INITIAL_S
                    self._dispatch(response, stream)
                closed_by_peer = True  # the deduper ended the stream with OK: its drain (`end_streams`)
            except grpc.RpcError as exc:
                err = rpc_error_from(exc)
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    _log.error("deduper at %s refused the control link: %s", self.address, err)
                    backoff = self._rpc.connect_backoff_max_s
                elif drained and not stream.welcomed:
                    _log.debug("deduper at %s drained, not answering: %s", self.address, err)
                elif not self._stop.is_set():
                    _log.warning("control link to %s down: %s", self.address, err)
            finally:
                self._disconnected(stream, closed_by_peer=closed_by_peer)
                channel.close()
            drained = closed_by_peer or (drained and not stream.welcomed)
            if self._stop.wait(backoff * random.uniform(0.8, 1.2)):  # jitter: no reconnect storms
                break
            backoff = min(backoff * 2, self._rpc.connect_backoff_max_s)

    def _disconnected(self, stream: _Stream, *, closed_by_peer: bool) -> None:
        """A stream ended: say how (a fault is a warning; a drain on either side is not), fail open."""
        if stream.welcomed and not self._stop.is_set():  # never up, or this wrapper is stopping: nothing to say
            if closed_by_peer:
                _log.info(
                    "control link to %s closed by the deduper (it is shutting down); dialling again", self.address
                )
            else:
                _log.warning("control link to %s lost; the data path goes on without it", self.address)
        stream.ended.set()  # sends are refused and the request generator ends
        self._call = None
        # Fail open: a pause asked for over a link that is gone is lifted.
        self._on_backpressure(False, "control link lost")

    def _dispatch(self, response: control_pb2.ConnectResponse, stream: _Stream) -> None:
        kind = response.WhichOneof("kind")
        if kind == "welcome":
            # Accept sends first, then take the snapshot: a spec that changes in
            # between is in the snapshot or in a send, never in neither.
            stream.welcomed = True
            specs = self._specs()
            if specs:
                try:
                    stream.outbound.put_nowait(
                        control_pb2.ConnectRequest(topic_specs=control_pb2.TopicSpecs(specs=specs))
                    )
                except queue.Full:
                    _log.warning("control link to %s saturated: topic specs not sent on connect", self.address)
            w = response.welcome
            _log.info(
                "control link to deduper %s at %s up (protocol %d.%d, flows %s)",
                w.deduper_id,
                self.address,
                w.version.major,
                w.version.minor,
                list(w.flows),
            )
        elif kind == "watermarks":
            self._on_watermarks(response.watermarks)
        elif kind == "backpressure":
            self._on_backpressure(response.backpressure.paused, response.backpressure.reason)
        elif kind == "resend_request":
            self._on_resend(response.resend_request, self)


class ResendWorker:
    """Reads requested source ranges again and answers with envelopes."""

    def __init__(
        self,
        *,
        consumer_config: dict[str, Any],
        wrapper_id: str,
        max_records: int,
        max_bytes: int,
        read_budget_s: float,
        topic_id: Callable[[str], bytes | None],
        tracing: Tracing | None = None,
        consumer_group: str = "",
    ) -> None:
        """Create the worker (not started).

        Args:
            consumer_config: source consumer settings (bootstrap, security, group id).
            wrapper_id: identity written into the envelopes.
            max_records: records per envelope at most.
            max_bytes: bytes per envelope at most.
            read_budget_s: budget for reading one requested range back from the source.
            topic_id: the current topic id of a source topic, None if unknown.
            tracing: the process's tracing (None: off); resent traced records get spans of their own,
                and each answer a ``ferryman resend`` span linked to them.
            consumer_group: the wrapper group, an attribute of the record spans.
        """
        self._tracing = tracing
        self._traces = (
            WrapperTraces(tracing, consumer_group=consumer_group, sampler=RecordSampler.of(tracing.config))
            if tracing is not None
            else None
        )
        self._consumer_config = consumer_config
        self._topic_id = topic_id
        self._wrapper_id = wrapper_id
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._read_budget_s = read_budget_s
        self._queue: queue.Queue[tuple[control_pb2.ResendRequest, ControlLink] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="resend", daemon=True)
        self._stopping = threading.Event()
        self.served = 0

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop; a request being read is abandoned (the deduper asks again)."""
        self._stopping.set()
        self._queue.put(None)
        self._thread.join(timeout=10)

    def submit(self, request: control_pb2.ResendRequest, link: ControlLink) -> None:
        """Queue a request (called from a control link thread)."""
        self._queue.put((request, link))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, link = item
            try:
                self._serve(request, link)
                self.served += 1
            except Exception as exc:
                if self._stopping.is_set():
                    return  # shutting down: the deduper asks again once a wrapper is back
                _log.exception("resend request %d failed", request.request_id)
                link.send(
                    control_pb2.ConnectRequest(
                        resend_data=control_pb2.ResendData(request_id=request.request_id, done=True, error=str(exc))
                    )
                )

    def _serve(self, request: control_pb2.ResendRequest, link: ControlLink) -> None:
        src = request.source
        _log.warning(
            "deduper asked for %s-%d offsets %d..%d again (request %d)",
            src.topic,
            src.partition,
            request.from_offset,
            request.to_offset,
            request.request_id,
        )
        current = self._topic_id(src.topic)
        if src.topic_id and current is not None and current != src.topic_id:
            raise RuntimeError(f"source topic {src.topic} was re-created since; the requested records are gone")
        try:
            messages = self._read(src, request.from_offset, request.to_offset)
        except SourceRangeDeletedError as exc:
            _log.warning("resend request %d: %s", request.request_id, exc)  # the deduper reports the loss
            self._send(link, request.request_id, [], done=True, deleted_before=exc.log_start, error=str(exc))
            return
        traced = self._traces.start(src.topic, src.partition, messages) if self._traces and messages else None
        resend_span = self._resend_span(request, traced) if traced is not None else None
        chunk: list[envelope_pb2.Envelope] = []
        size = 0
        # The consumer started at from_offset, so no record lies between
        # from_offset - 1 and the first one read: that is the chain link.
        for built in build_envelopes(
            messages,
            src,
            request.from_offset - 1,
            wrapper_id=self._wrapper_id,
            wrapper_epoch=0,  # the envelope contract's mark of a resent envelope
            max_records=self._max_records,
            max_bytes=min(self._max_bytes, RESEND_CHUNK_BYTES // 2),
            record_traces=traced.suffix if traced is not None else None,
        ):
            if chunk and size + len(built.value) > RESEND_CHUNK_BYTES:
                self._send(link, request.request_id, chunk, done=False)
                chunk, size = [], 0
            chunk.append(envelope_pb2.Envelope.FromString(built.value))
            size += len(built.value)
        self._send(link, request.request_id, chunk, done=True)
        if traced is not None:
            traced.end()
        if resend_span is not None and self._tracing is not None:
            self._tracing.records.end(resend_span)

    def _resend_span(self, request: control_pb2.ResendRequest, traced: RunTraces) -> RecordSpan:
        """A ``ferryman resend`` span for one answer, linked to (at most max_links of) its traced records."""
        assert self._tracing is not None
        src = request.source
        spans = [span for _, span in traced.spans]
        attributes = kafka_attributes("publish", src.topic, src.partition)
        attributes.update(
            {
                "ferryman.resend.request_id": request.request_id,
                "ferryman.resend.from_offset": request.from_offset,
                "ferryman.resend.to_offset": request.to_offset,
                "ferryman.traced_records": len(spans),
            }
        )
        shape = SpanShape("ferryman resend", SpanKind.PRODUCER, attributes)  # one per answer: a rare span
        return RecordSpan(
            shape, new_trace_id(), new_span_id(), "", time.time_ns(), links=self._tracing.records.links(spans)
        )

    def _send(
        self,
        link: ControlLink,
        request_id: int,
        envelopes: list[envelope_pb2.Envelope],
        *,
        done: bool,
        deleted_before: int = 0,
        error: str = "",
    ) -> None:
        sent = link.send(
            control_pb2.ConnectRequest(
                resend_data=control_pb2.ResendData(
                    request_id=request_id,
                    envelopes=envelopes,
                    done=done,
                    deleted_before=deleted_before,
                    error=error,
                )
            )
        )
        if not sent:
            raise ConnectionError("control link down while answering a resend request; the deduper will ask again")

    def _read(self, src: envelope_pb2.SourcePartition, from_offset: int, to_offset: int) -> list[Message]:
        conf = dict(self._consumer_config)
        conf.update(
            {
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "error",
                # The end of the partition is only seen through a fetch answer;
                # do not let the broker hold one for 500 ms (librdkafka default).
                "fetch.wait.max.ms": 20,
            }
        )
        consumer = Consumer(conf)
        try:
            low, _high = consumer.get_watermark_offsets(
                TopicPartition(src.topic, src.partition), timeout=self._read_budget_s
            )
            if low > from_offset:
                raise SourceRangeDeletedError(f"{src.topic}-{src.partition}", from_offset, low)
            consumer.assign([TopicPartition(src.topic, src.partition, from_offset)])
            return read_range(
                lambda timeout_s: consumer.consume(num_messages=1000, timeout=timeout_s),
                f"{src.topic}-{src.partition}",
                from_offset,
                to_offset,
                deadline=time.monotonic() + self._read_budget_s,
                stopping=self._stopping,
            )
        finally:
            consumer.close()


class SourceRangeDeletedError(FerrymanError):
    """Records asked for again are no longer in the source log (retention deleted them)."""

    def __init__(self, partition: str, from_offset: int, log_start: int) -> None:
        super().__init__(
            f"source partition {partition} no longer holds offsets {from_offset}..{log_start - 1} "
            f"(its log starts at {log_start}): deleted before they were replicated"
        )
        self.log_start = log_start


def read_range(
    consume: Callable[[float], Sequence[Message]],
    what: str,
    from_offset: int,
    to_offset: int,
    *,
    deadline: float,
    stopping: threading.Event | None = None,
) -> list[Message]:
    """Records from_offset..to_offset of one partition, from a consumer positioned at from_offset.

    Returns as soon as the record at to_offset (or any later offset) is read, or
    the end of the partition is reached (a ``_PARTITION_EOF`` event): never waits
    for a full batch. A read that runs out of time returns what it has, if anything.

    Args:
        consume: ``consume(timeout_s)`` of the positioned consumer.
        what: the partition, for messages.
        from_offset: first offset wanted.
        to_offset: last offset wanted (inclusive).
        deadline: ``time.monotonic()`` by which to give up.
        stopping: set when the answer is no longer wanted.

    Raises:
        TimeoutError: nothing was read by the deadline.
        RuntimeError: the consumer failed (e.g. the range left the source log), or stopping was set.
    """
    out: list[Message] = []
    while True:
        if stopping is not None and stopping.is_set():
            raise RuntimeError(f"stopping: resend of {what} abandoned")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if out:
                _log.warning("read %s only up to offset %s within the budget", what, out[-1].offset())
                return out
            raise TimeoutError(f"no data from {what} from offset {from_offset} within the budget")
        for msg in consume(min(_RESEND_POLL_S, remaining)):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                raise RuntimeError(
                    f"reading {what} from {from_offset}: {err.str()} (records may no longer be in the source log)"
                )
            offset = msg.offset()
            if offset is None:
                continue
            if offset > to_offset:
                return out
            out.append(msg)
            if offset == to_offset:
                return out
