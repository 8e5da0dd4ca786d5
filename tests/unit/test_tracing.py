"""Tracing: sampler decisions, W3C context parsing, the OTEL_* variables, record traces in envelopes, headers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from confluent_kafka import Message
from ferryman import envelope
from ferryman.config import TracingConfig, load_config
from ferryman.envelope import RecordRun
from ferryman.errors import ConfigError
from ferryman.tracing import (
    RecordSampler,
    RecordSpans,
    SdkBatches,
    Tracing,
    context_of,
    format_traceparent,
    parent_context,
    parse_traceparent,
)
from ferryman.v1 import envelope_pb2
from ferryman_deduper._traces import DeduperTraces, with_traceparent
from ferryman_wrapper._traces import _with_headers
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import StatusCode, get_current_span

TP_SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TP_UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (TP_SAMPLED, True),
        (TP_UNSAMPLED, True),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),  # all-zero trace id
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", False),  # all-zero span id
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", False),  # version ff
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", False),  # 00 has exactly 4 fields
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", True),  # later versions may add fields
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", False),  # uppercase is invalid
        ("garbage", False),
    ],
)
def test_parse_traceparent(value: str, valid: bool) -> None:
    assert (parse_traceparent(value) is not None) is valid


def test_context_of_headers_takes_first_valid_traceparent_and_its_tracestate() -> None:
    ctx = context_of([("a", b"1"), ("traceparent", TP_SAMPLED.encode()), ("tracestate", b"k=v"), ("x", None)])
    assert ctx is not None and ctx.sampled and ctx.tracestate == "k=v"
    assert ctx.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert context_of([("traceparent", b"nope")]) is None
    assert context_of([("traceparent", None)]) is None
    unsampled = context_of([("traceparent", TP_UNSAMPLED.encode())])
    assert unsampled is not None and not unsampled.sampled


def test_parent_context_continues_the_remote_span() -> None:
    ctx = context_of([("traceparent", TP_SAMPLED.encode()), ("tracestate", b"k=v")])
    assert ctx is not None
    span_ctx = get_current_span(parent_context(ctx)).get_span_context()
    assert span_ctx.is_remote and span_ctx.trace_flags.sampled
    assert format_traceparent(span_ctx.trace_id, span_ctx.span_id) == TP_SAMPLED
    assert span_ctx.trace_state.to_header() == "k=v"


def test_ratio_sampler_picks_about_the_ratio_and_carries_draws_between_runs() -> None:
    sampler = RecordSampler("parentbased_traceidratio", 0.01, random.Random(7))
    picked = sum(len(sampler.roots(1000)) for _ in range(200))  # 200 k records
    assert 1700 < picked < 2300
    indexes = sampler.roots(10_000)
    assert indexes == sorted(set(indexes)) and all(0 <= i < 10_000 for i in indexes)


def test_always_on_and_off() -> None:
    assert RecordSampler("always_on", 0.0).roots(5) == [0, 1, 2, 3, 4]
    assert RecordSampler("parentbased_always_off", 1.0).roots(5) == []
    assert RecordSampler("traceidratio", 0.0).roots(10_000) == []
    assert RecordSampler("traceidratio", 1.0).roots(3) == [0, 1, 2]


def test_parent_based_follows_the_sampled_flag_and_samples_roots_by_ratio() -> None:
    sampler = RecordSampler("parentbased_always_off", 0.0)
    headers = [
        (1, [("traceparent", TP_SAMPLED.encode())]),
        (2, [("traceparent", TP_UNSAMPLED.encode())]),
        (3, [("k", b"v")]),
    ]
    decided = sampler.decide(4, headers)
    assert [(i, p.traceparent if p else None) for i, p in decided] == [(1, TP_SAMPLED)]
    # Roots at 100 %: every record without context; the unsampled parent is still respected.
    decided = RecordSampler("parentbased_always_on", 0.0).decide(4, headers)
    assert [(i, p is not None) for i, p in decided] == [(0, False), (1, True), (3, False)]


def test_non_parent_based_decides_for_every_record_and_joins_the_context_it_finds() -> None:
    headers = [(1, [("traceparent", TP_UNSAMPLED.encode())])]
    decided = RecordSampler("always_on", 0.0).decide(2, headers)
    assert decided[0] == (0, None)
    assert decided[1][0] == 1 and decided[1][1] is not None and decided[1][1].traceparent == TP_UNSAMPLED
    assert RecordSampler("always_off", 1.0).decide(2, headers) == []


def test_no_headers_at_zero_ratio_decides_nothing() -> None:
    assert RecordSampler("parentbased_traceidratio", 0.0).decide(1000) == []


def test_otel_environment_sets_the_tracing_section(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "clusters: {a: {bootstrap_servers: 'x:1'}, b: {bootstrap_servers: 'y:1'}}\n"
        "flows: [{name: f, source: a, target: b, topics: [t]}]\n"
        "tracing: {ui_url_template: 'http://z/{trace_id}'}\n"
    )
    cfg = load_config(path, env={})
    assert cfg.tracing == TracingConfig(ui_url_template="http://z/{trace_id}")
    assert not cfg.tracing.enabled
    env = {
        "OTEL_TRACES_EXPORTER": "zipkin",
        "OTEL_EXPORTER_ZIPKIN_ENDPOINT": "http://127.0.0.1:9/api/v2/spans",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_TRACES_SAMPLER_ARG": "0.5",
        "OTEL_SERVICE_NAME": "svc",
    }
    t = load_config(path, env=env).tracing
    assert (t.enabled, t.exporter, t.endpoint, t.sampler, t.sampler_ratio, t.service_name) == (
        True,
        "zipkin",
        "http://127.0.0.1:9/api/v2/spans",
        "parentbased_always_on",
        0.5,
        "svc",
    )
    assert t.ui_url_template == "http://z/{trace_id}"  # the file's other settings stay
    http = load_config(
        path,
        env={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/",
        },
    ).tracing
    assert (http.exporter, http.endpoint) == ("otlp-http", "http://c:4318/v1/traces")
    assert not load_config(path, env={"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_SDK_DISABLED": "true"}).tracing.enabled
    # FERRYMAN_* wins over OTEL_*.
    assert load_config(path, env={**env, "FERRYMAN_TRACING__SAMPLER_RATIO": "0.25"}).tracing.sampler_ratio == 0.25
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        load_config(path, env={"OTEL_TRACES_EXPORTER": "jaeger"})
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER"):
        load_config(path, env={"OTEL_TRACES_SAMPLER": "sometimes"})
    with pytest.raises(ConfigError, match="sampler_ratio"):
        load_config(path, env={"OTEL_TRACES_SAMPLER_ARG": "2"})


def _run() -> RecordRun:
    return RecordRun(
        offsets=range(10, 13),
        timestamps_ms=[1, 2, 3],
        timestamp_types=[envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME],
        keys=[b"k0", None, b"k2"],
        values=[b"v0", b"v1", None],
        headers=[(1, [("h", b"x")])],
    )


@pytest.mark.parametrize("compiled", [True, False])
def test_record_traces_appended_to_a_built_envelope_decode_with_either_codec(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not compiled:
        monkeypatch.setattr(envelope, "batchcodec", None)
    elif envelope.batchcodec is None:
        pytest.fail("the compiled codec is not built in this worktree")
    src = envelope_pb2.SourcePartition(cluster_id="c", topic="t", partition=0)
    plain = envelope.encode(src, 9, _run(), wrapper_id="w", wrapper_epoch=1)
    traced = plain + envelope.record_traces_suffix([(11, TP_SAMPLED, "k=v")])
    a, b = envelope.decode(plain), envelope.decode(traced)
    assert a.record_traces == {}
    assert b.record_traces == {11: (TP_SAMPLED, "k=v")}
    assert (a.run, a.previous_offset, a.source) == (b.run, b.previous_offset, b.source)  # records untouched
    assert envelope.record_traces_suffix([]) == b""  # nothing traced: the envelope is byte for byte the same


def test_with_traceparent_replaces_in_place_or_appends() -> None:
    tp = TP_SAMPLED
    assert with_traceparent(None, tp) == [("traceparent", tp.encode())]
    assert with_traceparent([("a", b"1")], tp) == [("a", b"1"), ("traceparent", tp.encode())]
    assert with_traceparent([("traceparent", b"old"), ("b", None), ("traceparent", b"2nd")], tp) == [
        ("traceparent", tp.encode()),
        ("b", None),
        ("traceparent", b"2nd"),
    ]


@pytest.mark.parametrize("compiled", [True, False])
def test_records_with_headers_are_found_alike_by_both_codecs(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:
        monkeypatch.setattr(envelope, "batchcodec", None)
    elif envelope.batchcodec is None:
        pytest.fail("the compiled codec is not built in this worktree")
    run = [
        Message(topic="t", partition=0, offset=0, key=b"k", value=b"v"),
        Message(topic="t", partition=0, offset=1, value=b"v", headers=[("traceparent", TP_SAMPLED.encode())]),
        Message(topic="t", partition=0, offset=2, value=b"v", headers=[]),
        Message(topic="t", partition=0, offset=3, value=b"v", headers=[("a", None)]),
    ]
    found = _with_headers(run)
    assert [i for i, _ in found] == [1, 3]
    assert found[0][1] == [("traceparent", TP_SAMPLED.encode())]
    decided = RecordSampler("parentbased_always_off", 0.0).decide(len(run), found)
    assert [(i, p.traceparent if p else None) for i, p in decided] == [(1, TP_SAMPLED)]


class _Finished:
    """The record spans a Tracing exported so far (flushed on each look)."""

    def __init__(self, tracing: Tracing, memory: InMemorySpanExporter) -> None:
        self._tracing, self._memory = tracing, memory

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        assert self._tracing.records.flush(5)
        return self._memory.get_finished_spans()


def _tracing(**overrides: object) -> tuple[Tracing, _Finished]:
    """A Tracing whose record spans go to memory (as SDK spans)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    config = TracingConfig(enabled=True, **overrides)  # type: ignore[arg-type]
    records = RecordSpans(
        SdkBatches(memory, Resource.create({}), InstrumentationScope("t")), max_links=config.max_links
    )
    tracing = Tracing(config=config, sampler=RecordSampler.of(config), records=records, provider=provider)
    return tracing, _Finished(tracing, memory)


def _deduper_and_envelope(
    record_traces: list[tuple[int, str, str]],
) -> tuple[DeduperTraces, _Finished, envelope.DecodedEnvelope]:
    """A deduper's traces, its finished spans, and an envelope of _run() carrying record_traces."""
    tracing, spans = _tracing()
    traces = DeduperTraces(tracing, staging_topic="stg", consumer_group="dg")
    src = envelope_pb2.SourcePartition(cluster_id="c", topic="t", partition=0)
    env = envelope.decode(
        envelope.encode(src, 9, _run(), wrapper_id="w", wrapper_epoch=1) + envelope.record_traces_suffix(record_traces)
    )
    return traces, spans, env


def test_deduper_continues_the_wrapper_span_and_writes_its_publish_span_as_traceparent() -> None:
    tracing, spans = _tracing(max_links=1)
    traces = DeduperTraces(tracing, staging_topic="stg", consumer_group="dg")
    src = envelope_pb2.SourcePartition(cluster_id="c", topic="t", partition=0)
    wrapper_span = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
    env = envelope.decode(
        envelope.encode(src, 9, _run(), wrapper_id="w", wrapper_epoch=1)
        + envelope.record_traces_suffix([(10, wrapper_span, ""), (11, TP_SAMPLED, "k=v"), (99, TP_SAMPLED, "")])
    )
    # Record 10 was a duplicate (start=1): only 11 is written, so only 11 gets spans and a traceparent.
    column = traces.written(
        env, 1, destination="dst", staging_partition=2, staging_offset=5, headers=env.run.header_column()
    )
    assert column is not None and column[0] is None and column[2] is None
    assert column[1] is not None and column[1][0] == ("h", b"x") and column[1][1][0] == "traceparent"
    process = spans.get_finished_spans()
    assert [s.name for s in process] == ["stg process"]
    assert process[0].parent is not None and f"{process[0].parent.span_id:016x}" == "b7ad6b7169203331"
    assert process[0].attributes is not None and process[0].attributes["messaging.kafka.message.offset"] == 5
    traces.committed(records=2, started_ns=1)
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["stg process", "dst publish", "ferryman commit"]
    publish, commit = spans.get_finished_spans()[1:]
    assert column[1][1][1] == f"00-{publish.context.trace_id:032x}-{publish.context.span_id:016x}-01".encode()
    assert publish.context.trace_state.to_header() == "k=v"
    assert [link.context.span_id for link in commit.links] == [publish.context.span_id]  # capped at max_links
    # A transaction that aborts: its publish spans end with an error status, and no commit span.
    traces.written(env, 0, destination="dst", staging_partition=2, staging_offset=6, headers=None)
    traces.aborted("rewound")
    last = spans.get_finished_spans()[-2:]
    assert [s.name for s in last] == ["dst publish", "dst publish"]
    assert all(s.status.status_code is StatusCode.ERROR for s in last)


def test_deduper_leaves_headers_alone_when_no_written_record_is_traced() -> None:
    traces, spans, env = _deduper_and_envelope([(10, TP_SAMPLED, "")])
    assert traces.written(env, 1, destination="d", staging_partition=0, staging_offset=1, headers=None) is None
    assert spans.get_finished_spans() == ()


def test_deduper_ignores_a_record_trace_that_is_not_a_valid_traceparent() -> None:
    traces, spans, env = _deduper_and_envelope([(10, "00-not-hex-01", ""), (11, TP_SAMPLED.upper(), "")])
    column = traces.written(env, 0, destination="d", staging_partition=0, staging_offset=1, headers=None)
    assert column == [None, None, None]  # nothing to continue: no span, no traceparent written
    traces.committed(records=3, started_ns=1)
    assert spans.get_finished_spans() == ()


def test_deduper_continues_a_record_trace_with_whitespace_around_its_traceparent() -> None:
    traces, spans, env = _deduper_and_envelope([(10, f" {TP_SAMPLED}\t", "")])
    column = traces.written(env, 0, destination="d", staging_partition=0, staging_offset=1, headers=None)
    assert column is not None and column[0] is not None
    traceparent = dict(column[0])["traceparent"]
    assert isinstance(traceparent, bytes) and traceparent.decode()[3:35] == TP_SAMPLED[3:35]  # the same trace
    (process,) = spans.get_finished_spans()
    assert process.parent is not None and f"{process.parent.span_id:016x}" == TP_SAMPLED[36:52]
