"""Record spans: their Zipkin and OTLP encodings equal the SDK's encodings of the same spans; the export queue."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from ferryman import envelope
from ferryman.config import TracingConfig
from ferryman.tracing import (
    ERROR,
    OK,
    RecordSpan,
    RecordSpans,
    SpanShape,
    _file,
    _zipkin,
    new_span_id,
    new_trace_id,
    start_tracing,
)
from ferryman.tracing._export import readable_span
from ferryman.tracing._file import FileBatches
from ferryman.tracing._otlp import HttpSpanExporter, OtlpBatches
from ferryman.tracing._zipkin import ZipkinBatches
from ferryman.v1 import envelope_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.zipkin.encoder import Protocol
from opentelemetry.exporter.zipkin.json import ZipkinExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

RESOURCE = Resource.create({"service.name": "svc"})
SCOPE = InstrumentationScope("ferryman")
TRACE = "0af7651916cd43dd8448eb211c80319c"


def _spans() -> list[RecordSpan]:
    """One of each: remote parent with tracestate and offsets, local parent, root with links, OK and ERROR."""
    process = SpanShape(
        "orders process",
        SpanKind.CONSUMER,
        {"messaging.system": "kafka", "messaging.destination.partition.id": "3", "ferryman.source.partition": 3},
    )
    publish = SpanShape("dst publish", SpanKind.PRODUCER, {"messaging.destination.name": "dst"})
    commit = SpanShape("ferryman commit", SpanKind.INTERNAL, {})
    a = RecordSpan(
        process,
        TRACE,
        new_span_id(),
        "b7ad6b7169203331",
        1_800_000_000_123_456_789,
        end_ns=1_800_000_000_123_999_000,
        remote_parent=True,
        tracestate="k=v,x=y",
        attributes=(("messaging.kafka.message.offset", 7), ("ferryman.source.offset", -1)),
    )
    b = RecordSpan(publish, TRACE, new_span_id(), a.span_id, a.start_ns, end_ns=a.end_ns + 10, status=OK)
    c = RecordSpan(publish, TRACE, new_span_id(), a.span_id, a.start_ns, end_ns=a.end_ns, status=ERROR)
    c.message = 'transaction not committed: "rewound"'
    d = RecordSpan(
        commit,
        new_trace_id(),
        new_span_id(),
        "",
        a.start_ns,
        end_ns=a.end_ns + 2_000_000,
        attributes=(("ferryman.transaction.records", 2),),
        links=(b, c),
    )
    return [a, b, c, d]


def test_zipkin_json_equals_the_sdk_exporters_json() -> None:
    spans = _spans()
    ours = json.loads(ZipkinBatches(ZipkinExporter(), RESOURCE, SCOPE).encode(spans))
    exporter = ZipkinExporter(version=Protocol.V2)
    exporter.local_node.service_name = "svc"
    readable: Any = [readable_span(s, RESOURCE, SCOPE) for s in spans]  # the encoder's hint says Span
    sdk = json.loads(exporter.encoder.serialize(readable, exporter.local_node))
    for span in sdk:  # the SDK writes nulls ("kind" of INTERNAL, scope versions); we leave them out
        if span.get("kind") is None:
            del span["kind"]
        span["tags"] = {k: v for k, v in span["tags"].items() if v is not None}
    assert ours == sdk
    assert ours[2]["tags"]["error"] == 'transaction not committed: "rewound"'


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure Python"])
def test_zipkin_posts_the_json_as_bytes(monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    if not compiled:
        monkeypatch.setattr(_zipkin, "spanwire", None)
    spans = _spans()
    batches = ZipkinBatches(ZipkinExporter(), RESOURCE, SCOPE)
    assert batches.encode_bytes(spans) == batches.encode_py(spans).encode()


def test_otlp_request_equals_the_sdk_encoding() -> None:
    spans = _spans()
    ours = ExportTraceServiceRequest.FromString(OtlpBatches(HttpSpanExporter(), RESOURCE, SCOPE).encode(spans))
    assert ours == encode_spans([readable_span(s, RESOURCE, SCOPE) for s in spans])
    assert ours.resource_spans[0].scope_spans[0].spans[3].links[1].span_id.hex() == spans[2].span_id


def test_file_lines_equal_the_sdk_spans_json(tmp_path: Path) -> None:
    spans = _spans()
    exporter = ConsoleSpanExporter(out=io.StringIO())
    ours = [json.loads(line) for line in FileBatches(exporter, RESOURCE).encode(spans).splitlines()]
    assert ours == [json.loads(readable_span(s, RESOURCE, SCOPE).to_json(indent=None)) for s in spans]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure Python"])
def test_file_export_appends_the_lines_beside_the_sdk_exporters_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    if not compiled:
        monkeypatch.setattr(_file, "spanwire", None)
    elif _file.spanwire is None:
        pytest.fail("the compiled encoder is not built (python setup.py build_ext --inplace)")
    spans = _spans()
    with (tmp_path / "spans.jsonl").open("a", encoding="utf-8") as out:
        sdk_exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        batches = FileBatches(sdk_exporter, RESOURCE)
        sdk_spans: Any = [readable_span(spans[0], RESOURCE, SCOPE)]
        out.write('{"pending": "an SDK line still in the text layer"}\n')
        assert batches.export(spans)
        sdk_exporter.export(sdk_spans)
        assert batches.export(spans[:1])
    lines = (tmp_path / "spans.jsonl").read_text(encoding="utf-8").splitlines()
    expected = FileBatches(ConsoleSpanExporter(out=io.StringIO()), RESOURCE).encode_py(spans).splitlines()
    assert sorted(lines) == sorted(
        [*expected, expected[0], expected[0], '{"pending": "an SDK line still in the text layer"}']
    )
    assert [json.loads(line) for line in lines]  # every line whole


def test_record_traces_suffix_is_the_protobuf_serialisation() -> None:
    traces = [(0, "00-" + TRACE + "-b7ad6b7169203331-01", ""), (2**40, "00-" + TRACE + "-00f067aa0ba902b7-01", "k=v")]
    env = envelope_pb2.Envelope()
    for offset, traceparent, tracestate in traces:
        env.record_traces.add(offset=offset, traceparent=traceparent, tracestate=tracestate)
    assert envelope.record_traces_suffix(traces) == env.SerializeToString()


class _Collect:
    """A batch exporter that keeps batches (and can hold the export thread)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.closed = False

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        self.gate.wait(5)
        self.batches.append([s.span_id for s in spans])
        return True

    def shutdown(self) -> None:
        self.closed = True


def _span(i: int) -> RecordSpan:
    return RecordSpan(SpanShape("s", SpanKind.INTERNAL, {}), TRACE, f"{i + 1:016x}", "", i)


def test_queue_exports_in_batches_drops_when_full_and_flushes_on_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "3")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only a full batch or a flush exports
    out = _Collect()
    spans = RecordSpans(out, max_queue=5, max_links=2)
    out.gate.clear()  # the export thread blocks on its first batch
    for i in range(3):
        spans.end(_span(i))  # the third fills a batch: the thread takes it and waits at the gate
    linked = [_span(i) for i in range(4)]
    assert spans.links(linked) == linked[:2]  # capped at max_links
    for i in range(3, 10):
        spans.end(_span(i))  # five wait at most: 3 + 5 = 8 kept (or fewer taken yet), the rest dropped
    out.gate.set()
    assert spans.shutdown(5)
    exported = [s for batch in out.batches for s in batch]
    assert exported == [f"{i + 1:016x}" for i in range(len(exported))]
    assert len(exported) + spans.dropped == 10 and spans.dropped >= 2
    assert all(len(batch) <= 3 for batch in out.batches) and out.closed
    assert spans.shutdown(1)  # idempotent


def test_spans_ended_together_share_their_end_and_what_does_not_fit_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only a flush exports
    out = _Collect()
    spans = RecordSpans(out, max_queue=5)
    ended = [_span(i) for i in range(3)]
    spans.end_many(ended, 77)
    assert all(s.end_ns == 77 for s in ended) and spans.dropped == 0
    spans.end_many([_span(i) for i in range(3, 7)], 78)  # room for two of four
    assert spans.dropped == 2
    assert spans.shutdown(5)
    assert [s for batch in out.batches for s in batch] == [f"{i + 1:016x}" for i in range(5)]


def test_file_exporter_writes_record_spans_as_sdk_span_json(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    config = TracingConfig(enabled=True, exporter="file", file_path=path, service_name="svc", sampler="always_on")
    tracing = start_tracing(config, "d")
    assert tracing is not None
    for span in _spans():
        tracing.records.end(span, span.end_ns)
    tracing.tracer.start_span("rpc").end()  # an SDK span: same file, one stream
    tracing.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [s["name"] for s in lines] == ["orders process", "dst publish", "dst publish", "ferryman commit", "rpc"]
    assert lines[0]["parent_id"] == "0xb7ad6b7169203331" and "key=x, value=y" in lines[0]["context"]["trace_state"]
    assert lines[2]["status"] == {"status_code": "ERROR", "description": 'transaction not committed: "rewound"'}
    assert len(lines[3]["links"]) == 2 and lines[0]["resource"]["attributes"]["service.name"] == "svc"
