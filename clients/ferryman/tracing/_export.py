"""Record spans as SDK ``ReadableSpan`` objects, for exporters without an encoder of ours (console, file, tests).

The Zipkin and OTLP exporters get their wire formats directly (``_zipkin``,
``_otlp``); unit tests check those against the SDK's own encoding of the spans
`readable_span` builds.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags, TraceState

from ferryman.tracing._lean import ERROR, OK, AttributeValue, RecordSpan

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_STATUS = {0: StatusCode.UNSET, OK: StatusCode.OK, ERROR: StatusCode.ERROR}


def readable_span(span: RecordSpan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The SDK span a record span stands for."""
    state = TraceState.from_header([span.tracestate]) if span.tracestate else None
    trace_id = int(span.trace_id, 16)
    context = SpanContext(trace_id, int(span.span_id, 16), is_remote=False, trace_flags=_SAMPLED, trace_state=state)
    parent = (
        SpanContext(trace_id, int(span.parent_id, 16), is_remote=span.remote_parent, trace_flags=_SAMPLED)
        if span.parent_id
        else None
    )
    shape = span.shape
    attributes: dict[str, AttributeValue] = dict(shape.attributes)
    attributes.update(span.attributes)
    links = [
        Link(SpanContext(int(link.trace_id, 16), int(link.span_id, 16), is_remote=False, trace_flags=_SAMPLED))
        for link in span.links
    ]
    return ReadableSpan(
        name=shape.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=attributes,
        links=links,
        kind=shape.kind,
        status=Status(_STATUS[span.status], span.message or None),
        start_time=span.start_ns,
        end_time=span.end_ns,
        instrumentation_scope=scope,
    )


class SdkBatches:
    """Any SDK exporter, given ``ReadableSpan`` objects built on the export thread."""

    def __init__(self, exporter: SpanExporter, resource: Resource, scope: InstrumentationScope) -> None:
        self.exporter = exporter
        self._resource = resource
        self._scope = scope

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Convert and export."""
        batch = [readable_span(s, self._resource, self._scope) for s in spans]
        return self.exporter.export(batch) is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Shut the exporter down."""
        self.exporter.shutdown()
