"""The wrapper's record spans: one ``<source topic> process`` CONSUMER span per traced source record.

A record is traced when the `RecordSampler` chooses it (its ``traceparent``
header is sampled, or the ratio starts a trace); only those records go through
span creation. Each span's context travels to the deduper in the envelope's
``record_traces`` (appended to the envelope the codec built, see
``envelope.record_traces_suffix``); the span ends once the envelopes holding
its records are handed to the producer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message
from ferryman import envelope
from ferryman.tracing import (
    RecordSampler,
    RecordSpan,
    SpanShape,
    Tracing,
    kafka_attributes,
    new_span_id,
    new_trace_id,
)
from ferryman.tracing._lean import tracepath
from ferryman.tracing._spans import CONSUMER_GROUP, OFFSET, OFFSET_NEW, SOURCE_TIMESTAMP
from opentelemetry.trace import SpanKind

_headers: Any = Message.headers
_offset: Any = Message.offset
_timestamp: Any = Message.timestamp


@dataclass
class RunTraces:
    """The traced records of one run: (source offset, span), by offset."""

    spans: list[tuple[int, RecordSpan]]
    _tracing: Tracing

    def suffix(self, after: int, upto: int) -> bytes:
        """The record_traces of an envelope holding the run's records after ``after`` up to ``upto``."""
        if tracepath is not None:
            compiled = tracepath.record_traces_suffix(self.spans, after, upto)
            if compiled is not None:
                return compiled
        return envelope.record_traces_suffix(
            (offset, span.traceparent, span.tracestate) for offset, span in self.spans if after < offset <= upto
        )

    def end(self) -> None:
        """End every span (the run's envelopes are produced)."""
        self._tracing.records.end_many([span for _, span in self.spans], time.time_ns())


def _with_headers(run: Sequence[Message]) -> list[tuple[int, Any]]:
    """(index, headers) of the run's records that have headers: found in C, by the compiled codec if built."""
    codec = envelope.batchcodec
    if codec is not None and isinstance(run, list):
        return [(i, _headers(run[i])) for i in codec.header_indexes(run)]
    return [(i, h) for i, h in enumerate(map(_headers, run)) if h]


class WrapperTraces:
    """Starts the record spans of runs of consumed source records."""

    def __init__(self, tracing: Tracing, *, consumer_group: str, sampler: RecordSampler | None = None) -> None:
        """Create the helper.

        Args:
            tracing: the process's tracing.
            consumer_group: the source consumer group (an attribute of every span).
            sampler: the decision for another thread (the resend worker); default the process's.
        """
        self._tracing = tracing
        self._sampler = sampler or tracing.sampler
        self._group = consumer_group
        self._shapes: dict[tuple[str, int], SpanShape] = {}

    def _shape(self, topic: str, partition: int) -> SpanShape:
        """The process span shape of a source partition (made once)."""
        attributes = kafka_attributes("process", topic, partition)
        attributes[CONSUMER_GROUP] = self._group
        shape = self._shapes[topic, partition] = SpanShape(f"{topic} process", SpanKind.CONSUMER, attributes)
        return shape

    def start(self, topic: str, partition: int, run: Sequence[Message], *, headers: bool = True) -> RunTraces | None:
        """Spans for the traced records of run (one source partition, offset order); None when none is traced.

        headers False: no record of the run has headers (`batch_flags` saw none), so none is looked at.
        """
        decided = self._sampler.decide(len(run), _with_headers(run) if headers else ())
        if not decided:
            return None
        shape = self._shapes.get((topic, partition)) or self._shape(topic, partition)
        now = time.time_ns()
        if tracepath is not None:  # the same spans, made in C
            made = tracepath.start_spans(decided, run, shape, now, OFFSET, OFFSET_NEW, SOURCE_TIMESTAMP)
            return RunTraces(made, self._tracing)
        spans: list[tuple[int, RecordSpan]] = []
        for i, parent in decided:
            offset = _offset(run[i])
            kind, timestamp = _timestamp(run[i])
            attributes: tuple[tuple[str, int], ...] = ((OFFSET, offset), (OFFSET_NEW, offset))
            if kind:  # not TIMESTAMP_NOT_AVAILABLE: when the source stamped it, for the wait before the wrapper
                attributes += ((SOURCE_TIMESTAMP, timestamp),)
            if parent is None:  # a record without trace context starts a trace
                span = RecordSpan(shape, new_trace_id(), new_span_id(), "", now, False, "", attributes)
            else:
                tp = parent.traceparent
                span = RecordSpan(shape, tp[3:35], new_span_id(), tp[36:52], now, True, parent.tracestate, attributes)
            spans.append((offset, span))
        return RunTraces(spans, self._tracing)
