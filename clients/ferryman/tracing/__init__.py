"""OpenTelemetry tracing of records and gRPC calls (the ``tracing`` configuration section).

`start_tracing` gives a service its `Tracing` (or None when off); `RecordSampler`
decides which records are traced before any span exists; the span helpers follow
the messaging semantic conventions for Kafka. See the README's Tracing section
for the headers Ferryman adds at the destination.
"""

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
from ferryman.tracing._spans import capped_links, kafka_attributes, parent_context, traceparent_of, tracestate_of

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "ParentContext",
    "RecordSampler",
    "Tracing",
    "capped_links",
    "context_of",
    "format_traceparent",
    "kafka_attributes",
    "otel_sampler",
    "parent_context",
    "parse_traceparent",
    "start_tracing",
    "traceparent_of",
    "tracestate_of",
]
