"""OpenTelemetry tracing of records and gRPC calls (the ``tracing`` configuration section).

`start_tracing` gives a service its `Tracing` (or None when off); `RecordSampler`
decides which records are traced before any span exists; record spans are
`RecordSpan` objects sent in batches by `RecordSpans` (not SDK spans: see
``_lean``); the span helpers follow the messaging semantic conventions for Kafka. See the README's Tracing section
for the headers Ferryman adds at the destination.
"""

from ferryman.tracing._export import SdkBatches
from ferryman.tracing._lean import (
    ERROR,
    OK,
    BatchExporter,
    RecordSpan,
    RecordSpans,
    SpanShape,
    new_span_id,
    new_trace_id,
)
from ferryman.tracing._sampling import (
    TRACEPARENT,
    TRACESTATE,
    ParentContext,
    RecordSampler,
    context_of,
    format_traceparent,
    parse_traceparent,
)
from ferryman.tracing._setup import Tracing, otel_sampler, start_tracing
from ferryman.tracing._spans import kafka_attributes, parent_context, traceparent_of, tracestate_of

__all__ = [
    "ERROR",
    "OK",
    "TRACEPARENT",
    "TRACESTATE",
    "BatchExporter",
    "ParentContext",
    "RecordSampler",
    "RecordSpan",
    "RecordSpans",
    "SdkBatches",
    "SpanShape",
    "Tracing",
    "context_of",
    "format_traceparent",
    "kafka_attributes",
    "new_span_id",
    "new_trace_id",
    "otel_sampler",
    "parent_context",
    "parse_traceparent",
    "start_tracing",
    "traceparent_of",
    "tracestate_of",
]
