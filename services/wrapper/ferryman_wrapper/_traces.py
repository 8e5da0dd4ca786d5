"""The wrapper's record spans: one ``<source topic> process`` CONSUMER span per traced source record.

A record is traced when the `RecordSampler` chooses it (its ``traceparent``
header is sampled, or the ratio starts a trace); only those records go through
span creation. Each span's context travels to the deduper in the envelope's
``record_traces`` (appended to the envelope the codec built, see
``envelope.record_traces_suffix``); the span ends once the envelopes holding
its records are handed to the producer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message
from ferryman import envelope
from ferryman.tracing import RecordSampler, Tracing, kafka_attributes, parent_context, traceparent_of
from ferryman.tracing._spans import CONSUMER_GROUP
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind

_headers: Any = Message.headers
_offset: Any = Message.offset


@dataclass
class RunTraces:
    """The traced records of one run: (source offset, span, tracestate), by offset."""

    spans: list[tuple[int, Span, str]]

    def suffix(self, after: int, upto: int) -> bytes:
        """The record_traces of an envelope holding the run's records after ``after`` up to ``upto``."""
        return envelope.record_traces_suffix(
            (offset, traceparent_of(span), state) for offset, span, state in self.spans if after < offset <= upto
        )

    def end(self) -> None:
        """End every span (the run's envelopes are produced)."""
        for _, span, _ in self.spans:
            span.end()


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
        self._tracer = tracing.records
        self._sampler = sampler or tracing.sampler
        self._group = consumer_group

    def start(self, topic: str, partition: int, run: Sequence[Message]) -> RunTraces | None:
        """Spans for the traced records of run (one source partition, offset order); None when none is traced."""
        decided = self._sampler.decide(len(run), _with_headers(run))
        if not decided:
            return None
        spans: list[tuple[int, Span, str]] = []
        for i, parent in decided:
            offset = _offset(run[i])
            attributes = kafka_attributes("process", topic, partition, offset)
            attributes[CONSUMER_GROUP] = self._group
            span = self._tracer.start_span(
                f"{topic} process",
                # An empty context, not the current one: a record without trace context starts a trace.
                context=parent_context(parent) if parent is not None else Context(),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
            )
            spans.append((offset, span, parent.tracestate if parent is not None else ""))
        return RunTraces(spans)
