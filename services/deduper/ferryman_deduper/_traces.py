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
from collections.abc import Sequence

from ferryman import envelope
from ferryman.envelope import Headers
from ferryman.tracing import (
    TRACEPARENT,
    ParentContext,
    Tracing,
    capped_links,
    kafka_attributes,
    parent_context,
    traceparent_of,
)
from ferryman.tracing._spans import CONSUMER_GROUP, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context


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


class DeduperTraces:
    """Record spans of the open transaction (data-path thread only)."""

    def __init__(self, tracing: Tracing, *, staging_topic: str, consumer_group: str) -> None:
        self._tracer = tracing.records
        self._max_links = tracing.config.max_links
        self._staging = staging_topic
        self._group = consumer_group
        self._open: list[Span] = []

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
        run = env.run
        offsets = run.offsets
        first = offsets[start]
        traced = sorted((o, t) for o, t in env.record_traces.items() if o >= first)
        if not traced:
            return None if headers is None else list(headers)
        column: list[Headers | None] = list(headers) if headers is not None else [None] * len(offsets)
        src = env.source
        for offset, (traceparent, tracestate) in traced:
            i = bisect.bisect_left(offsets, offset)
            if i >= len(offsets) or offsets[i] != offset:
                continue  # not one of the envelope's records: nothing to continue
            attributes = kafka_attributes("process", self._staging, staging_partition, staging_offset)
            attributes.update(
                {
                    CONSUMER_GROUP: self._group,
                    SOURCE_TOPIC: src.topic,
                    SOURCE_PARTITION: src.partition,
                    SOURCE_OFFSET: offset,
                }
            )
            process = self._tracer.start_span(
                f"{self._staging} process",
                context=parent_context(ParentContext(traceparent, tracestate)),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
            )
            publish = self._tracer.start_span(
                f"{destination} publish",
                context=set_span_in_context(process),
                kind=SpanKind.PRODUCER,
                attributes=kafka_attributes("publish", destination, src.partition),
            )
            process.end()
            self._open.append(publish)
            column[i] = with_traceparent(column[i], traceparent_of(publish))
        return column

    def committed(self, records: int, started_ns: int) -> None:
        """The open transaction committed: a ``ferryman commit`` span linked to its traced records; end them OK.

        Args:
            records: records the transaction wrote.
            started_ns: when the commit started (``time.time_ns()``), the commit span's start.
        """
        if not self._open:
            return
        commit = self._tracer.start_span(
            "ferryman commit",
            context=Context(),
            start_time=started_ns,
            kind=SpanKind.INTERNAL,
            links=capped_links(self._open, self._max_links),
            attributes={"ferryman.transaction.records": records, "ferryman.traced_records": len(self._open)},
        )
        for span in self._open:
            span.set_status(Status(StatusCode.OK))
            span.end()
        commit.end()
        self._open.clear()

    def aborted(self, why: str) -> None:
        """The open transaction was aborted or dropped: its traced writes end with an error status."""
        for span in self._open:
            span.set_status(Status(StatusCode.ERROR, f"transaction not committed: {why}"))
            span.end()
        self._open.clear()
