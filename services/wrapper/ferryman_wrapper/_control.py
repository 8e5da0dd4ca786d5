"""The wrapper's side of the control link, and its resend worker.

``ControlLink`` keeps one Connect stream open to a deduper, reconnecting with
capped exponential backoff. It never blocks the data path: the wrapper loop
only reads flags it sets (pause) and enqueues messages for it (progress,
specs); if the link is down those are dropped, and a pause is lifted (the
data path fails open, exactly-once does not depend on this link).

``ResendWorker`` answers resend requests with envelopes read again from the
source, on its own consumer and thread.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from confluent_kafka import Consumer, KafkaError, TopicPartition
from ferryman.config import RpcConfig
from ferryman.rpc import open_channel, rpc_error_from
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2

from ferryman_wrapper._envelopes import build_envelopes

_log = logging.getLogger(__name__)

#: gRPC's default 4 MiB message cap would refuse a resend batch holding a
#: record near Kafka's size limit; resend answers are chunked to stay below this.
RESEND_CHUNK_BYTES = 3 * 1024 * 1024
#: How long the request generator waits on its queue before re-checking that
#: the stream is still wanted.
_OUTBOUND_POLL_S = 0.5
#: First reconnect delay; doubles up to RpcConfig.connect_backoff_max_s.
_BACKOFF_INITIAL_S = 0.2


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
    ) -> None:
        self.address = address
        self._rpc = rpc
        self._hello = hello
        self._specs = specs
        self._on_backpressure = on_backpressure
        self._on_resend = on_resend
        self._on_watermarks = on_watermarks
        self._stop = threading.Event()
        self._outbound: queue.Queue[control_pb2.ConnectRequest] = queue.Queue(maxsize=1000)
        self._thread = threading.Thread(target=self._run, name=f"control-{address}", daemon=True)
        self._call: Any = None
        self.connected = False
        self.connects = 0

    def start(self) -> None:
        """Start connecting in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Close the stream and stop reconnecting (idempotent)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=5)

    def send(self, request: control_pb2.ConnectRequest) -> bool:
        """Queue a message; False (dropped) while the link is down or saturated."""
        if not self.connected:
            return False
        try:
            self._outbound.put_nowait(request)
        except queue.Full:
            return False
        return True

    def _requests(self, generation: int) -> Iterator[control_pb2.ConnectRequest]:
        yield control_pb2.ConnectRequest(hello=self._hello())
        specs = self._specs()
        if specs:
            yield control_pb2.ConnectRequest(topic_specs=control_pb2.TopicSpecs(specs=specs))
        while not self._stop.is_set() and generation == self.connects:
            try:
                yield self._outbound.get(timeout=_OUTBOUND_POLL_S)
            except queue.Empty:
                continue

    def _run(self) -> None:
        backoff = _BACKOFF_INITIAL_S
        while not self._stop.is_set():
            try:
                channel = open_channel(self.address, self._rpc)
            except Exception:
                _log.exception("cannot open a channel to %s", self.address)
                self._stop.wait(backoff)
                continue
            try:
                self.connects += 1
                stub = control_pb2_grpc.ControlServiceStub(channel)
                self._call = stub.Connect(self._requests(self.connects))
                for response in self._call:
                    backoff = _BACKOFF_INITIAL_S
                    self._dispatch(response)
            except grpc.RpcError as exc:
                err = rpc_error_from(exc)
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    _log.error("deduper at %s refused the control link: %s", self.address, err)
                    backoff = self._rpc.connect_backoff_max_s
                elif not self._stop.is_set():
                    _log.warning("control link to %s down: %s", self.address, err)
            finally:
                self._disconnected()
                channel.close()
            if self._stop.wait(backoff * random.uniform(0.8, 1.2)):  # jitter: no reconnect storms
                break
            backoff = min(backoff * 2, self._rpc.connect_backoff_max_s)

    def _disconnected(self) -> None:
        if self.connected:
            _log.warning("control link to %s lost; the data path goes on without it", self.address)
        self.connected = False
        self._call = None
        # Fail open: a pause asked for over a link that is gone is lifted.
        self._on_backpressure(False, "control link lost")
        while True:
            try:
                self._outbound.get_nowait()
            except queue.Empty:
                break

    def _dispatch(self, response: control_pb2.ConnectResponse) -> None:
        kind = response.WhichOneof("kind")
        if kind == "welcome":
            self.connected = True
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
        timeout_s: float,
        topic_id: Callable[[str], bytes | None],
    ) -> None:
        self._consumer_config = consumer_config
        self._topic_id = topic_id
        self._wrapper_id = wrapper_id
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._queue: queue.Queue[tuple[control_pb2.ResendRequest, ControlLink] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="resend", daemon=True)
        self.served = 0

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current request."""
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
        messages = self._read(src, request.from_offset, request.to_offset)
        chunk: list[envelope_pb2.Envelope] = []
        size = 0
        # The consumer started at from_offset, so no record lies between
        # from_offset - 1 and the first one read: that is the chain link.
        for built in build_envelopes(
            messages,
            src,
            request.from_offset - 1,
            wrapper_id=self._wrapper_id,
            wrapper_epoch=0,
            max_records=self._max_records,
            max_bytes=min(self._max_bytes, RESEND_CHUNK_BYTES // 2),
        ):
            if chunk and size + len(built.value) > RESEND_CHUNK_BYTES:
                self._send(link, request.request_id, chunk, done=False)
                chunk, size = [], 0
            chunk.append(envelope_pb2.Envelope.FromString(built.value))
            size += len(built.value)
        self._send(link, request.request_id, chunk, done=True)

    def _send(self, link: ControlLink, request_id: int, envelopes: list[envelope_pb2.Envelope], *, done: bool) -> None:
        sent = link.send(
            control_pb2.ConnectRequest(
                resend_data=control_pb2.ResendData(request_id=request_id, envelopes=envelopes, done=done)
            )
        )
        if not sent:
            raise ConnectionError("control link down while answering a resend request; the deduper will ask again")

    def _read(self, src: envelope_pb2.SourcePartition, from_offset: int, to_offset: int) -> list[Any]:
        conf = dict(self._consumer_config)
        conf.update(
            {
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "error",
            }
        )
        consumer = Consumer(conf)
        out: list[Any] = []
        try:
            consumer.assign([TopicPartition(src.topic, src.partition, from_offset)])
            done = False
            while not done:
                batch = consumer.consume(num_messages=1000, timeout=self._timeout_s)
                if not batch:
                    raise TimeoutError(f"no data from {src.topic}-{src.partition} within {self._timeout_s:.0f}s")
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done = True
                            break
                        raise RuntimeError(
                            f"reading {src.topic}-{src.partition} from {from_offset}: {err.str()} (records may no "
                            "longer be in the source log)"
                        )
                    offset = msg.offset()
                    if offset is not None and offset > to_offset:
                        done = True
                        break
                    out.append(msg)
        finally:
            consumer.close()
        return out
