"""Record spans without the SDK's per-span machinery: a few fields on the data path, encoding in batches.

An OpenTelemetry SDK span costs tens of microseconds of CPU from creation to
export (context objects, bounded attribute dicts, span processors, the
exporters' per-span encoding); a traced record makes four of them across the
two services. Record spans here are one small object each: ids, times, a
shared `SpanShape` (name, kind and the attributes that are the same for every
span of a topic partition) and the few attributes that vary (offsets). The
data path thread only fills them in and appends them to a queue; a thread of
`RecordSpans` hands them in batches to a `BatchExporter`
(``ferryman.tracing._export``), which encodes the batch straight into the wire
format of the configured exporter, encoding each shape once.

The export thread's CPU counts against the data path's (one process), so the
point is less work per span, not work elsewhere.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from opentelemetry.trace import SpanKind

_log = logging.getLogger(__name__)

#: Attribute values of record spans (what the messaging conventions use).
AttributeValue = str | int

#: Status codes, as OTLP numbers them.
UNSET, OK, ERROR = 0, 1, 2


@dataclass(frozen=True, eq=False)
class SpanShape:
    """What the spans of one kind on one topic partition share; encoders cache its encoding by identity."""

    name: str
    kind: SpanKind
    attributes: Mapping[str, AttributeValue]


@dataclass(slots=True, eq=False)
class RecordSpanPy:
    """One span: its ids, times (ns since the epoch) and the attributes its shape does not have.

    Ids are lowercase hex, as ``traceparent`` headers and Zipkin carry them (a
    record's ids come from and go to headers: no conversion on the data path).
    `RecordSpan` is the compiled twin of this class where it is built (the same
    fields; the data paths make it without a Python ``__init__``), else this.
    """

    shape: SpanShape
    trace_id: str
    """32 hex digits, not all zero."""
    span_id: str
    """16 hex digits, not all zero."""
    parent_id: str
    """The parent's span id; empty for a root span."""
    start_ns: int
    # The fields in the order the data paths pass them (positional arguments are the cheaper call).
    remote_parent: bool = False
    """The parent is another process's span (a ``traceparent``)."""
    tracestate: str = ""
    """The W3C ``tracestate`` of the trace (empty when none)."""
    attributes: tuple[tuple[str, AttributeValue], ...] = ()
    links: Sequence[RecordSpanPy] = ()
    end_ns: int = 0
    status: int = UNSET
    message: str = ""
    """The status description (ERROR only)."""

    @property
    def traceparent(self) -> str:
        """The ``traceparent`` naming this span as the parent (always sampled: only sampled spans exist)."""
        return "00-" + self.trace_id + "-" + self.span_id + "-01"


#: The compiled per-record work (_tracepath.pyx), or None when it was not built (no C compiler at install).
try:
    from ferryman.tracing import _tracepath
except ImportError:  # pragma: no cover - the install builds it
    _tracepath = None  # type: ignore[assignment]
tracepath = _tracepath  # the public name (tests swap it for None to run the pure-Python paths)

_randbytes = random.randbytes
_ZERO_SPAN = "0" * 16
_ZERO_TRACE = "0" * 32


def new_span_id_py() -> str:
    """A random non-zero 64-bit span id, in hex (the pure-Python reference)."""
    span_id = _randbytes(8).hex()
    return span_id if span_id != _ZERO_SPAN else new_span_id_py()


def new_trace_id_py() -> str:
    """A random non-zero 128-bit trace id, in hex (the pure-Python reference)."""
    trace_id = _randbytes(16).hex()
    return trace_id if trace_id != _ZERO_TRACE else new_trace_id_py()


if TYPE_CHECKING:
    RecordSpan = RecordSpanPy
else:
    RecordSpan = tracepath.RecordSpan if tracepath is not None else RecordSpanPy

#: A random non-zero 64-bit span id, in hex (compiled: ~30 ns against ~170).
new_span_id: Callable[[], str] = tracepath.span_id if tracepath is not None else new_span_id_py
#: A random non-zero 128-bit trace id, in hex.
new_trace_id: Callable[[], str] = tracepath.trace_id if tracepath is not None else new_trace_id_py


class BatchExporter(Protocol):
    """Sends a batch of ended record spans in one request (called from one thread at a time)."""

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Encode and send; False when the batch is lost (logged by the exporter)."""

    def shutdown(self) -> None:
        """Release the connection."""


def _env_int(name: str, default: int) -> int:
    """A positive integer from the SDK's batch processor variables (``OTEL_BSP_*``), else the default."""
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        _log.warning("tracing: %s is not an integer; using %d", name, default)
        return default
    return value if value > 0 else default


@dataclass
class _Settings:
    """Batching: the ``OTEL_BSP_*`` variables when set, as for the SDK's batch processor; larger defaults.

    Defaults 4x the SDK's (queue 8192, batch 2048): at a 1 % ratio of 300 k records/s
    a service makes ~6-9 k record spans per second, and each export request costs
    milliseconds of CPU of its own (HTTP or gRPC), so fewer, larger requests.
    A batch of 2048 spans is ~0.6-1 MB of Zipkin JSON, under collectors' usual 4 MB limits.
    """

    schedule_delay_s: float = field(default_factory=lambda: _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000)
    max_queue: int = field(default_factory=lambda: _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 8192))
    max_batch: int = field(default_factory=lambda: _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 2048))


class RecordSpans:
    """The record spans of a process: `end` on any thread queues a span, a daemon thread exports batches.

    Like the SDK's batch processor: at most ``OTEL_BSP_MAX_QUEUE_SIZE`` spans wait
    (more are dropped and counted), a batch goes when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``
    are waiting or every ``OTEL_BSP_SCHEDULE_DELAY`` ms (defaults in `_Settings`).
    """

    def __init__(self, exporter: BatchExporter, *, max_links: int = 64, max_queue: int | None = None) -> None:
        """Start the export thread.

        Args:
            exporter: encodes and sends batches.
            max_links: most links a span gets (`links` caps them).
            max_queue: spans that may wait (default ``OTEL_BSP_MAX_QUEUE_SIZE``, else 8192).
        """
        self.max_links = max_links
        self.dropped = 0
        self._exporter = exporter
        self._settings = _Settings()
        if max_queue is not None:
            self._settings.max_queue = max_queue
        self._queue: deque[RecordSpan] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._exporting = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="ferryman-record-spans", daemon=True)
        self._thread.start()

    def end(self, span: RecordSpan, end_ns: int | None = None) -> None:
        """End span now (or at end_ns) and queue it for export."""
        span.end_ns = end_ns or time.time_ns()
        queue = self._queue
        if len(queue) >= self._settings.max_queue:
            self.dropped += 1
            return
        queue.append(span)  # deque.append is atomic: no lock on the data path
        if len(queue) >= self._settings.max_batch:
            self._wake.set()

    def end_many(self, spans: Sequence[RecordSpan], end_ns: int) -> None:
        """End spans at end_ns and queue them for export (as `end` each, in one call)."""
        for span in spans:
            span.end_ns = end_ns
        queue = self._queue
        room = self._settings.max_queue - len(queue)
        if room < len(spans):
            self.dropped += len(spans) - max(room, 0)
            spans = spans[: max(room, 0)]
        queue.extend(spans)  # deque.extend of a list holds the GIL throughout: no lock on the data path
        if len(queue) >= self._settings.max_batch:
            self._wake.set()

    def links(self, spans: Sequence[RecordSpan]) -> Sequence[RecordSpan]:
        """The spans a span links to: the first ``max_links``."""
        return spans[: self.max_links]

    def _loop(self) -> None:
        while not self._stopped:
            self._wake.wait(self._settings.schedule_delay_s)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        """Export every queued span, a batch at a time (the export thread, or a flush when it is stopped)."""
        with self._idle:
            self._exporting = True
        try:
            queue, size = self._queue, self._settings.max_batch
            while queue:
                batch = [queue.popleft() for _ in range(min(size, len(queue)))]
                try:
                    self._exporter.export(batch)
                except Exception:  # an exporter bug must not stop tracing for good
                    _log.exception("tracing: exporting %d record spans failed", len(batch))
        finally:
            with self._idle:
                self._exporting = False
                self._idle.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export what is queued now; False when that took longer than timeout_s."""
        deadline = time.monotonic() + timeout_s
        if self._stopped:
            self._drain()
            return True
        with self._idle:
            self._wake.set()
            while self._queue or self._exporting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # Woken when a drain ends; re-arm the export thread if spans came in during it.
                self._idle.wait(min(left, 0.05))
                if self._queue:
                    self._wake.set()
        return True

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """Flush (within timeout_s), stop the thread and the exporter; idempotent."""
        if self._stopped:
            return True
        flushed = self.flush(timeout_s)
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._exporter.shutdown()
        if self.dropped:
            _log.warning("tracing: %d record spans dropped (queue full)", self.dropped)
        return flushed
