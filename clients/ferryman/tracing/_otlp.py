"""Record spans as OTLP protobuf, written by hand, sent through the SDK's OTLP exporters (gRPC or HTTP).

`OtlpBatches` writes the ``ExportTraceServiceRequest`` bytes (fields in
``trace.proto`` numbering; the resource, scope and each `SpanShape` encoded
once). `GrpcSpanExporter` and `HttpSpanExporter` stay whole SDK exporters (the
gRPC-call spans of the SDK provider use them as usual) that can also send such
bytes with ``export_encoded``, keeping their endpoint, headers, credentials,
compression and retries. That reaches into their private transport
(``_export`` / ``_client``), which the OpenTelemetry versions pinned in
pyproject.toml have. The per-span work runs in C where built (``_spanwire.pyx``);
the pure-Python encoder is the fallback and the reference.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as _GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as _HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

from ferryman._protowire import len_field, varint
from ferryman.tracing._lean import AttributeValue, RecordSpan, SpanShape

_log = logging.getLogger(__name__)

#: The compiled per-span work (_spanwire.pyx), or None when it was not built (no C compiler at install).
try:
    from ferryman.tracing import _spanwire
except ImportError:
    _spanwire = None  # type: ignore[assignment]
spanwire = _spanwire  # the public name (tests swap it for None to run the pure-Python encoder)

#: Which encoder this process runs (the pure-Python one costs ~10x the CPU per span).
ENCODER = "compiled" if spanwire is not None else "pure Python (_spanwire not built)"


@dataclass(frozen=True)
class _Encoded:
    """An encoded request and the spans it holds, passed through the gRPC exporter's retry loop."""

    data: bytes
    count: int


class GrpcSpanExporter(_GrpcExporter):
    """OTLP over gRPC; ``export_encoded`` sends ready bytes through the exporter's retries."""

    def _translate_data(self, data: Sequence[ReadableSpan] | _Encoded) -> ExportTraceServiceRequest:
        if isinstance(data, _Encoded):
            return ExportTraceServiceRequest.FromString(data.data)
        return super()._translate_data(data)

    def _count_data(self, data: Sequence[ReadableSpan] | _Encoded) -> int:
        return data.count if isinstance(data, _Encoded) else len(data)

    def export_encoded(self, data: bytes, count: int) -> bool:
        """Send an encoded request of count spans; False when it failed (the exporter logged why)."""
        exported: Any = self._export(_Encoded(data, count))  # type: ignore[arg-type]  # handled by the overrides
        return exported is SpanExportResult.SUCCESS


class HttpSpanExporter(_HttpExporter):
    """OTLP over HTTP (protobuf); ``export_encoded`` sends ready bytes with the exporter's client and retries."""

    def export_encoded(self, data: bytes, count: int) -> bool:
        """Send an encoded request of count spans; False when it failed."""
        if self._shutdown:
            return False
        return bool(self._client.export(data).success)


#: ``KeyValue.key`` fields of the attribute keys met so far (a handful of constants).
_KEYS: dict[str, bytes] = {}


def _key_value(key: str, value: AttributeValue) -> bytes:
    """A ``KeyValue`` attribute field (``Span.attributes`` is field 9): string or int64 ``AnyValue``."""
    key_field = _KEYS.get(key)
    if key_field is None:
        key_field = _KEYS[key] = len_field(1, key.encode())
    if type(value) is int:
        any_value = b"\x18" + varint(value)  # AnyValue.int_value = 3
    else:
        raw = str(value).encode()
        any_value = b"\x0a" + varint(len(raw)) + raw  # AnyValue.string_value = 1
    body = key_field + b"\x12" + varint(len(any_value)) + any_value  # KeyValue.value = 2
    return b"\x4a" + varint(len(body)) + body


#: Span.flags (field 16, fixed32): the SDK's ``SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`` (| ``IS_REMOTE``).
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)
#: Link.flags (field 6, fixed32): links name local spans.
_LINK_FLAGS = b"\x35" + struct.pack("<I", 0x100)
_OTLP_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}


class OtlpBatches:
    """``ExportTraceServiceRequest`` bytes written by hand, sent through an SDK OTLP exporter (gRPC or HTTP)."""

    def __init__(
        self, exporter: GrpcSpanExporter | HttpSpanExporter, resource: Resource, scope: InstrumentationScope
    ) -> None:
        """Keep the exporter; encode the resource and scope once (with the SDK's encoder)."""
        self.exporter = exporter
        template = ReadableSpan(
            name="x", context=SpanContext(1, 1, is_remote=False), resource=resource, instrumentation_scope=scope
        )
        resource_spans = encode_spans([template]).resource_spans[0]
        self._resource = len_field(1, resource_spans.resource.SerializeToString())
        self._scope = len_field(1, resource_spans.scope_spans[0].scope.SerializeToString())
        self._shapes: dict[SpanShape, bytes] = {}

    def _shape(self, shape: SpanShape) -> bytes:
        """Name, kind and the shape's attributes as Span fields (encoded once per shape)."""
        encoded = self._shapes[shape] = (
            len_field(5, shape.name.encode())
            + b"\x30"
            + varint(_OTLP_KIND[shape.kind])
            + b"".join(_key_value(k, v) for k, v in shape.attributes.items())
        )
        return encoded

    def encode(self, spans: Sequence[RecordSpan]) -> bytes:
        """The request's bytes: one resource, one scope, the spans; compiled where built, else `encode_py`."""
        if spanwire is not None:
            encoded = spanwire.otlp_request(self, spans, _key_value, _FLAGS_LOCAL, _FLAGS_REMOTE, _LINK_FLAGS)
            if encoded is not None:
                return encoded
        return self.encode_py(spans)

    def encode_py(self, spans: Sequence[RecordSpan]) -> bytes:
        """The request's bytes, in Python: the reference."""
        pack, shapes, fromhex = struct.pack, self._shapes, bytes.fromhex
        encoded = []
        for s in spans:
            fields = [b"\x0a\x10", fromhex(s.trace_id), b"\x12\x08", fromhex(s.span_id)]
            if s.tracestate:
                fields.append(len_field(3, s.tracestate.encode()))
            if s.parent_id:
                fields += (b"\x22\x08", fromhex(s.parent_id))
            shape = shapes.get(s.shape) or self._shape(s.shape)
            fields += (shape, b"\x39", pack("<Q", s.start_ns), b"\x41", pack("<Q", s.end_ns))
            if s.attributes:
                fields.extend([_key_value(k, v) for k, v in s.attributes])
            for link in s.links:
                body = b"\x0a\x10" + fromhex(link.trace_id) + b"\x12\x08" + fromhex(link.span_id)
                fields.append(len_field(13, body + _LINK_FLAGS))
            # Status (field 15) always, as the SDK encodes it: message = 2, code = 3.
            status = (len_field(2, s.message.encode()) if s.message else b"") + (
                b"\x18" + bytes((s.status,)) if s.status else b""
            )
            fields.append(len_field(15, status))
            fields.append(_FLAGS_REMOTE if s.remote_parent else _FLAGS_LOCAL)
            encoded.append(len_field(2, b"".join(fields)))  # ScopeSpans.spans = 2
        scope_spans = len_field(2, self._scope + b"".join(encoded))  # ResourceSpans.scope_spans = 2
        return len_field(1, self._resource + scope_spans)  # ExportTraceServiceRequest.resource_spans = 1

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Encode and send with the exporter's transport."""
        if self.exporter.export_encoded(self.encode(spans), len(spans)):
            return True
        _log.warning("tracing: %d record spans not exported over OTLP", len(spans))
        return False

    def shutdown(self) -> None:
        """Shut the exporter down."""
        self.exporter.shutdown()
