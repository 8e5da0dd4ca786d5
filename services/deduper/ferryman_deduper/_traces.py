"""The deduper's record spans, and the ``traceparent`` it writes on traced destination records.

For each traced record it writes (the envelope's ``record_traces`` name it;
records dropped as duplicates get nothing): a ``<staging topic> process``
CONSUMER span, child of the wrapper's span, and under it a ``<destination
topic> publish`` PRODUCER span whose context the destination record carries in
its ``traceparent`` header (an existing ``traceparent`` header is replaced in
place, otherwise one is appended; nothing else changes). Publish spans stay
open until their transaction ends: committed, they end OK and one
``ferryman commit`` span links them; aborted (or dropped at a crash, where they
are never exported), they end with an error status, so a trace never shows a
write that is not in the destination as a success.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

from ferryman import envelope
from ferryman.envelope import Headers
from ferryman.tracing import (
    ERROR,
    OK,
    TRACEPARENT,
    RecordSpan,
    SpanShape,
    Tracing,
    kafka_attributes,
    new_span_id,
    new_trace_id,
    parse_traceparent,
)
from ferryman.tracing._lean import tracepath
from ferryman.tracing._spans import CONSUMER_GROUP, OFFSET, OFFSET_NEW, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC
from opentelemetry.trace import SpanKind

#: The ``ferryman commit`` span's shape (no topic: a transaction spans partitions).
COMMIT = SpanShape("ferryman commit", SpanKind.INTERNAL, {})


def with_traceparent(headers: Headers | None, traceparent: str) -> Headers:
    """A record's headers with ``traceparent`` set: the first such header replaced in place, else appended."""
    value = traceparent.encode()
    if not headers:
        return [(TRACEPARENT, value)]
    out = list(headers)
    for i, (key, _) in enumerate(out):
        if key == TRACEPARENT:
            out[i] = (TRACEPARENT, value)
            return out
    out.append((TRACEPARENT, value))
    return out


def _index_of(offsets: Sequence[int]) -> Callable[[int], int]:
    """Where an offset is in a run's offsets (ascending), -1 when it is not there: arithmetic for a range."""
    if isinstance(offsets, range) and offsets.step == 1:
        first, n = offsets.start, len(offsets)
        return lambda offset: offset - first if 0 <= offset - first < n else -1

    def search(offset: int) -> int:
        i = bisect.bisect_left(offsets, offset)
        return i if i < len(offsets) and offsets[i] == offset else -1

    return search


class DeduperTraces:
    """Record spans of the open transaction (data-path thread only)."""

    def __init__(self, tracing: Tracing, *, staging_topic: str, consumer_group: str) -> None:
        self._spans = tracing.records
        self._staging = staging_topic
        self._group = consumer_group
        self._open: list[RecordSpan] = []
        self._process: dict[tuple[int, str, int], SpanShape] = {}
        self._publish: dict[tuple[str, int], SpanShape] = {}

    def _shapes(
        self, staging_partition: int, source_topic: str, partition: int, destination: str
    ) -> tuple[SpanShape, SpanShape]:
        """The process and publish span shapes of a staging partition's records from a source partition."""
        process = self._process.get((staging_partition, source_topic, partition))
        if process is None:
            attributes = kafka_attributes("process", self._staging, staging_partition)
            attributes.update({CONSUMER_GROUP: self._group, SOURCE_TOPIC: source_topic, SOURCE_PARTITION: partition})
            process = SpanShape(f"{self._staging} process", SpanKind.CONSUMER, attributes)
            self._process[staging_partition, source_topic, partition] = process
        publish = self._publish.get((destination, partition))
        if publish is None:
            publish = SpanShape(
                f"{destination} publish", SpanKind.PRODUCER, kafka_attributes("publish", destination, partition)
            )
            self._publish[destination, partition] = publish
        return process, publish

    def written(
        self,
        env: envelope.DecodedEnvelope,
        start: int,
        *,
        destination: str,
        staging_partition: int,
        staging_offset: int | None,
        headers: Sequence[Headers | None] | None,
    ) -> list[Headers | None] | None:
        """Spans for the traced records of env.run[start:] (about to be written); their header column.

        Returns:
            headers with a ``traceparent`` on each traced record (a new column when headers is
            None), or headers unchanged (None included) when no written record is traced.
        """
        src = env.source
        process_shape, publish_shape = self._shapes(staging_partition, src.topic, src.partition, destination)
        staging = () if staging_offset is None else ((OFFSET, staging_offset), (OFFSET_NEW, staging_offset))
        if tracepath is not None:  # the same spans and column, made in C
            column, processed = tracepath.continue_traces(
                env.record_traces,
                env.run.offsets,
                start,
                headers,
                process_shape,
                publish_shape,
                staging,
                SOURCE_OFFSET,
                time.time_ns(),
                self._open,
                parse_traceparent,
                with_traceparent,
                TRACEPARENT,
            )
            if processed:
                self._spans.end_many(processed, time.time_ns())
            return column
        return self._written_py(env, start, headers, (process_shape, publish_shape), staging)

    def _written_py(
        self,
        env: envelope.DecodedEnvelope,
        start: int,
        headers: Sequence[Headers | None] | None,
        shapes: tuple[SpanShape, SpanShape],
        staging: tuple[tuple[str, int], ...],
    ) -> list[Headers | None] | None:
        """`written` in Python (the reference the compiled path is held to); shapes: (process, publish)."""
        process_shape, publish_shape = shapes
        run = env.run
        offsets = run.offsets
        first = offsets[start]
        traced = sorted((o, t) for o, t in env.record_traces.items() if o >= first)
        if not traced:
            return None if headers is None else list(headers)
        column: list[Headers | None] = list(headers) if headers is not None else [None] * len(offsets)
        opened, processed = self._open, []
        now = time.time_ns()
        index = _index_of(offsets)
        for offset, (sent, tracestate) in traced:
            i = index(offset)
            traceparent = parse_traceparent(sent)
            if i < 0 or traceparent is None:
                continue  # not one of the envelope's records, or no valid context: nothing to continue
            trace_id, process_id = traceparent[3:35], new_span_id()
            attributes = (*staging, (SOURCE_OFFSET, offset))
            processed.append(
                RecordSpan(process_shape, trace_id, process_id, traceparent[36:52], now, True, tracestate, attributes)
            )
            publish = RecordSpan(publish_shape, trace_id, new_span_id(), process_id, now, False, tracestate)
            opened.append(publish)
            column[i] = with_traceparent(column[i], publish.traceparent)
        self._spans.end_many(processed, time.time_ns())
        return column

    def committed(self, records: int, started_ns: int) -> None:
        """The open transaction committed: a ``ferryman commit`` span linked to its traced records; end them OK.

        Args:
            records: records the transaction wrote.
            started_ns: when the commit started (``time.time_ns()``), the commit span's start.
        """
        if not self._open:
            return
        spans = self._spans
        commit = RecordSpan(
            COMMIT,
            new_trace_id(),
            new_span_id(),
            "",
            started_ns,
            attributes=(("ferryman.transaction.records", records), ("ferryman.traced_records", len(self._open))),
            links=spans.links(self._open),
        )
        for span in self._open:
            span.status = OK
        self._open.append(commit)
        spans.end_many(self._open, time.time_ns())
        self._open = []

    def aborted(self, why: str) -> None:
        """The open transaction was aborted or dropped: its traced writes end with an error status."""
        message = f"transaction not committed: {why}"
        for span in self._open:
            span.status, span.message = ERROR, message
        self._spans.end_many(self._open, time.time_ns())
        self._open = []
