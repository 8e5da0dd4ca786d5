"""Record spans as Zipkin JSON v2, made from templates, posted with the SDK Zipkin exporter's session.

`ZipkinBatches` writes the list the SDK's Zipkin exporter would send (same
fields and tags), each `SpanShape`'s part encoded once, and posts it with that
exporter's session, endpoint and timeout. The per-span work runs in C where
built (``_spanwire.pyx``); the pure-Python encoder is the fallback and the reference.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import requests
from opentelemetry.exporter.zipkin.encoder import DEFAULT_MAX_TAG_VALUE_LENGTH
from opentelemetry.exporter.zipkin.json import ZipkinExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

from ferryman.tracing._lean import ERROR, OK, UNSET, RecordSpan, SpanShape

_log = logging.getLogger(__name__)

#: The compiled per-span work (_spanwire.pyx), or None when it was not built (no C compiler at install).
try:
    from ferryman.tracing import _spanwire
except ImportError:
    _spanwire = None  # type: ignore[assignment]
spanwire = _spanwire  # the public name (tests swap it for None to run the pure-Python encoder)

#: Which encoder this process runs (the pure-Python one costs ~4-5x the CPU per span).
ENCODER = "compiled" if spanwire is not None else "pure Python (_spanwire not built)"

_ZIPKIN_KIND = {SpanKind.SERVER: "SERVER", SpanKind.CLIENT: "CLIENT", SpanKind.PRODUCER: "PRODUCER"}
_ZIPKIN_KIND[SpanKind.CONSUMER] = "CONSUMER"
#: The status tags of an unset and an OK status (ERROR has a description).
_STATUS_TAGS = {UNSET: "", OK: ',"otel.status_code":"OK"'}
#: HTTP statuses Zipkin answers a stored batch with (as the SDK's exporter checks).
_ZIPKIN_OK = (200, 202)


def _tag(value: object) -> str:
    """A JSON tag value: a string, cut at the SDK encoder's default length."""
    return json.dumps(str(value)[:DEFAULT_MAX_TAG_VALUE_LENGTH])


class ZipkinBatches:
    """Zipkin JSON v2 made from templates, posted with the SDK Zipkin exporter's session and settings."""

    def __init__(self, exporter: ZipkinExporter, resource: Resource, scope: InstrumentationScope) -> None:
        """Keep the exporter; the resource's attributes become tags of every span, as the SDK's encoder does."""
        self.exporter = exporter
        node = exporter.local_node
        service_name = str(resource.attributes.get(SERVICE_NAME, ""))
        node.service_name = service_name
        endpoint: dict[str, Any] = {"serviceName": service_name}
        endpoint.update((k, str(v)) for k, v in (("ipv4", node.ipv4), ("ipv6", node.ipv6)) if v is not None)
        if node.port is not None:
            endpoint["port"] = node.port
        self._endpoint = json.dumps(endpoint, separators=(",", ":"))
        self._common_tags = {
            **resource.attributes,
            "otel.library.name": scope.name,
            "otel.scope.name": scope.name,  # versions are null: left out
        }
        self._heads: dict[SpanShape, str] = {}

    def _head(self, shape: SpanShape) -> str:
        """The JSON from ``"name"`` to the open tags object, with the shape's tags (encoded once per shape)."""
        kind = _ZIPKIN_KIND.get(shape.kind)
        tags = {**shape.attributes, **self._common_tags}
        head = self._heads[shape] = (
            f'"name":{json.dumps(shape.name)},"localEndpoint":{self._endpoint},'
            + (f'"kind":"{kind}",' if kind else "")
            + '"tags":{'
            + ",".join(f"{json.dumps(k)}:{_tag(v)}" for k, v in tags.items())
        )
        return head

    def encode_bytes(self, spans: Sequence[RecordSpan]) -> bytes:
        """The JSON v2 list of spans as posted: compiled where built, else `encode_py`."""
        if spanwire is not None:
            encoded = spanwire.zipkin_spans(self, spans, _STATUS_TAGS, _tag)
            if encoded is not None:
                return encoded
        return self.encode_py(spans).encode()

    def encode(self, spans: Sequence[RecordSpan]) -> str:
        """`encode_bytes` as a str."""
        return self.encode_bytes(spans).decode()

    def encode_py(self, spans: Sequence[RecordSpan]) -> str:
        """The JSON v2 list of spans, in Python: the reference.

        The per-span attribute keys are Ferryman's constants, written without JSON escaping.
        """
        out = []
        heads, status_tags = self._heads, _STATUS_TAGS
        for s in spans:
            head = heads.get(s.shape) or self._head(s.shape)
            tags = (
                "".join([f',"{k}":"{v}"' if type(v) is int else f',"{k}":{_tag(v)}' for k, v in s.attributes])
                if s.attributes
                else ""
            )
            if s.status == ERROR:
                tags += f',"otel.status_code":"ERROR","error":{_tag(s.message)}'
            else:
                tags += status_tags[s.status]
            start = s.start_ns
            out.append(
                f'{{"traceId":"{s.trace_id}","id":"{s.span_id}",'
                + (f'"parentId":"{s.parent_id}",' if s.parent_id else "")
                + f'"timestamp":{(start + 500) // 1000},"duration":{(s.end_ns - start + 500) // 1000},'
                f'{head}{tags}}},"debug":true}}'
            )
        return "[" + ",".join(out) + "]"

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Encode and post; False (logged) when Zipkin is unreachable or refuses the batch."""
        exporter = self.exporter
        try:
            answer = exporter.session.post(
                url=exporter.endpoint, data=self.encode_bytes(spans), timeout=exporter.timeout
            )
        except requests.RequestException as exc:
            _log.warning("tracing: %d record spans not sent to %s: %s", len(spans), exporter.endpoint, exc)
            return False
        if answer.status_code not in _ZIPKIN_OK:
            _log.warning("tracing: Zipkin refused %d record spans: %s %s", len(spans), answer.status_code, answer.text)
            return False
        return True

    def shutdown(self) -> None:
        """Close the session."""
        self.exporter.shutdown()
