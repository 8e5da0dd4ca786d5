"""Record spans after the OpenTelemetry messaging semantic conventions for Kafka.

Span names are ``<destination> <operation>`` (``orders process``,
``orders publish``); kinds CONSUMER for process, PRODUCER for publish;
attributes ``messaging.system=kafka``, ``messaging.operation.type``,
``messaging.operation.name``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.kafka.message.offset``
(and its newer name ``messaging.kafka.offset``), ``messaging.consumer.group.name``.
Ferryman's own coordinates go under ``ferryman.*``.
"""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags, TraceState, set_span_in_context

from ferryman.tracing._sampling import ParentContext, format_traceparent

SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
OFFSET = "messaging.kafka.message.offset"
OFFSET_NEW = "messaging.kafka.offset"
CONSUMER_GROUP = "messaging.consumer.group.name"
BATCH_COUNT = "messaging.batch.message_count"
SOURCE_TOPIC = "ferryman.source.topic"
SOURCE_PARTITION = "ferryman.source.partition"
SOURCE_OFFSET = "ferryman.source.offset"
#: The source record's Kafka timestamp (ms since the epoch, CreateTime or LogAppendTime as its topic keeps it), on
#: the wrapper's span: with the span's start, how long the record waited before the wrapper took it.
SOURCE_TIMESTAMP = "ferryman.source.timestamp"


def kafka_attributes(operation: str, topic: str, partition: int, offset: int | None = None) -> dict[str, str | int]:
    """The messaging attributes of one Kafka record span (offset when known)."""
    attrs: dict[str, str | int] = {
        SYSTEM: "kafka",
        OPERATION_TYPE: operation,
        OPERATION_NAME: operation,
        DESTINATION: topic,
        PARTITION: str(partition),
    }
    if offset is not None:
        attrs[OFFSET] = offset
        attrs[OFFSET_NEW] = offset
    return attrs


def parent_context(parent: ParentContext) -> Context:
    """A context whose current span is the remote parent a traceparent names (no propagator call per record)."""
    tp = parent.traceparent
    span_context = SpanContext(
        trace_id=int(tp[3:35], 16),
        span_id=int(tp[36:52], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(tp[53:55], 16) & 0xFF),
        trace_state=TraceState.from_header([parent.tracestate]) if parent.tracestate else None,
    )
    return set_span_in_context(NonRecordingSpan(span_context))


def traceparent_of(span: Span) -> str:
    """The ``traceparent`` naming span as the parent."""
    ctx = span.get_span_context()
    return format_traceparent(ctx.trace_id, ctx.span_id, sampled=ctx.trace_flags.sampled)


def tracestate_of(span: Span) -> str:
    """The span's ``tracestate`` header value (empty when it has none)."""
    state = span.get_span_context().trace_state
    return state.to_header() if state else ""
