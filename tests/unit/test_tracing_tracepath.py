"""The compiled per-record tracing work (ferryman.tracing._tracepath) does what the pure-Python paths do.

Ids are random, non-zero hex of the right length and differ after a fork; the
``traceparent`` check agrees with ``parse_traceparent_py`` on seeded random and
mutated values; the wrapper's ``record_traces`` suffix is byte for byte the
Python function's, and what the compiled one leaves (returns None for) still
comes out the same through ``RunTraces.suffix``.
"""

from __future__ import annotations

import os
import random
import string
from types import SimpleNamespace

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Message
from ferryman import envelope
from ferryman.tracing import RecordSampler, RecordSpan, SpanShape, _lean, _sampling

# _tracepath must be built here (the install builds it): a missing extension fails this module, never skips it.
from ferryman.tracing import _tracepath as tracepath
from ferryman.tracing._sampling import parse_traceparent, parse_traceparent_py
from ferryman.tracing._spans import SOURCE_TIMESTAMP
from ferryman.v1 import envelope_pb2
from ferryman_deduper import _traces as deduper_traces
from ferryman_deduper._traces import _index_of
from ferryman_wrapper import _traces as wrapper_traces
from opentelemetry.trace import SpanKind

SHAPE = SpanShape("t process", SpanKind.CONSUMER, {})
HEX = "0123456789abcdef"


def test_the_services_use_the_compiled_paths() -> None:
    users = (_lean, _sampling, wrapper_traces, deduper_traces)
    assert all(vars(module)["tracepath"] is tracepath for module in users)
    assert _lean.RecordSpan is tracepath.RecordSpan
    assert _lean.new_span_id is tracepath.span_id and _lean.new_trace_id is tracepath.trace_id


@pytest.mark.parametrize(("make", "digits"), [(tracepath.span_id, 16), (tracepath.trace_id, 32)])
def test_ids_are_distinct_lowercase_hex_of_their_length(make: object, digits: int) -> None:
    assert callable(make)
    ids = [make() for _ in range(20_000)]
    assert all(len(i) == digits and set(i) <= set(HEX) and i != "0" * digits for i in ids)
    assert len(set(ids)) == len(ids)
    # Every hex digit turns up in every position (the generator's bits reach the whole id).
    assert all(len({i[p] for i in ids}) == 16 for p in range(digits))


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, "".join(tracepath.span_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    parent = "".join(tracepath.span_id() for _ in range(4))
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert len(child) == 64 and child != parent


def _traceparents(rng: random.Random, n: int) -> list[str]:
    """Valid ones, and mutations of them at every position (one character changed, cut, padded)."""
    out = []
    for _ in range(n):
        trace, span = "".join(rng.choices(HEX, k=32)), "".join(rng.choices(HEX, k=16))
        value = f"00-{trace}-{span}-0{rng.choice('01')}"
        out.append(value)
        at = rng.randrange(55)
        out.append(value[:at] + rng.choice(string.printable + "é") + value[at + 1 :])
        out.append(value[:at] + "0" * (35 - at if at < 35 else 0) + value[35:] if 3 <= at < 35 else value)
        out.append(rng.choice([" ", "\t", ""]) + value + rng.choice([" ", "", "-"]))
        out.append(rng.choice(["01", "ff", "0A", "fe"]) + value[2:])
    out += ["00-" + "0" * 32 + "-" + "1" * 16 + "-01", "00-" + "1" * 32 + "-" + "0" * 16 + "-01", "", "x" * 55]
    return out


def test_the_traceparent_check_agrees_with_the_python_parser() -> None:
    values = _traceparents(random.Random(20261128), 3_000)
    handled = 0
    for value in values:
        canonical = tracepath.canonical_traceparent(value)
        if canonical is not None:
            handled += 1
            assert (value if canonical else None) == parse_traceparent_py(value), value
        assert parse_traceparent(value) == parse_traceparent_py(value), value
    assert handled > len(values) // 2  # the fast path takes the common forms
    assert tracepath.canonical_traceparent(b"00-x") is None and tracepath.canonical_traceparent(None) is None


def _spans(rng: random.Random, n: int) -> list[tuple[int, RecordSpan]]:
    offsets = [*rng.sample(range(1 << 40), n - 2), 0, 127]
    states = ["", "k=v", "a" * 200, "vendor=1,other=two"]
    return [
        (o, RecordSpan(SHAPE, tracepath.trace_id(), tracepath.span_id(), "", 1, False, rng.choice(states)))
        for o in sorted(offsets)
    ]


def _python_suffix(spans: list[tuple[int, RecordSpan]], after: int, upto: int) -> bytes:
    return envelope.record_traces_suffix((o, s.traceparent, s.tracestate) for o, s in spans if after < o <= upto)


def test_the_record_traces_suffix_is_the_python_functions_bytes() -> None:
    rng = random.Random(7)
    for _ in range(300):
        spans = _spans(rng, rng.randrange(2, 40))
        after, upto = sorted(rng.choice([-1, *(o for o, _ in spans)]) for _ in range(2))
        compiled = tracepath.record_traces_suffix(spans, after, upto)
        assert compiled == _python_suffix(spans, after, upto)
        parsed = envelope_pb2.Envelope.FromString(compiled)
        assert [t.offset for t in parsed.record_traces] == [o for o, _ in spans if after < o <= upto]
    assert tracepath.record_traces_suffix([], -1, 10) == b""


@pytest.mark.parametrize(
    "odd",
    [
        RecordSpan(SHAPE, "a" * 31, "b" * 16, "", 1),  # a short trace id
        RecordSpan(SHAPE, "a" * 32, "b" * 16, "", 1, tracestate="k=vé"),  # a tracestate UTF-8 encodes longer
        RecordSpan(SHAPE, "a" * 32, "é" * 16, "", 1),  # a non-ASCII span id
    ],
)
def test_spans_the_compiled_suffix_leaves_come_out_the_same_through_run_traces(
    odd: RecordSpan, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans = [*_spans(random.Random(3), 4), (1 << 41, odd)]
    assert tracepath.record_traces_suffix(spans, -1, 1 << 42) is None
    assert tracepath.record_traces_suffix([(1 << 70, spans[0][1])], -1, 1 << 42) is None  # beyond int64
    run = wrapper_traces.RunTraces(spans, _tracing=None)  # type: ignore[arg-type]  # suffix needs no tracing
    expected = _python_suffix(spans, -1, 1 << 42)
    assert run.suffix(-1, 1 << 42) == expected
    monkeypatch.setattr(wrapper_traces, "tracepath", None)  # as when not built
    assert run.suffix(-1, 1 << 42) == expected


def test_the_pure_python_paths_stand_in_when_it_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sampling, "tracepath", None)
    value = "00-" + tracepath.trace_id() + "-" + tracepath.span_id() + "-01"
    assert parse_traceparent(" " + value) == value and parse_traceparent(value.upper()) is None
    ids = {_lean.new_span_id_py() for _ in range(100)} | {_lean.new_trace_id_py() for _ in range(100)}
    assert len(ids) == 200 and {len(i) for i in ids} == {16, 32}


@pytest.mark.parametrize("offsets", [range(100, 110), [100, 101, 104, 109], range(5, 5)])
def test_the_deduper_finds_a_record_by_offset_in_a_range_or_a_list(offsets: range | list[int]) -> None:
    index = _index_of(offsets)
    for offset in range(90, 120):
        assert index(offset) == (list(offsets).index(offset) if offset in offsets else -1)


class _Kept:
    """A RecordSpans stand-in that keeps what is ended (no export thread)."""

    def __init__(self) -> None:
        self.ended: list[RecordSpan] = []
        self.max_links = 64

    def end_many(self, spans: list[RecordSpan], end_ns: int) -> None:
        self.ended.extend(spans)

    def links(self, spans: list[RecordSpan]) -> list[RecordSpan]:
        return spans[: self.max_links]


def _fields(span: RecordSpan, ids: dict[str, str]) -> tuple[object, ...]:
    """A span's fields, its random ids named by order of first sight (so two runs compare)."""

    def named(value: str) -> str:
        return ids.setdefault(value, f"id{len(ids)}") if value else ""

    return (
        (span.shape.name, span.shape.kind, dict(span.shape.attributes)),  # shapes are compared by identity
        named(span.trace_id),
        named(span.span_id),
        named(span.parent_id),
        span.start_ns > 0,
        span.remote_parent,
        span.tracestate,
        span.attributes,
        span.links,
        span.end_ns,
        span.status,
        span.message,
    )


def _record(offset: int, headers: list[tuple[str, str | bytes | None]] | None) -> Message:
    # Every fourth record without a timestamp (a record from a broker that keeps none): no timestamp attribute.
    timestamp = (TIMESTAMP_NOT_AVAILABLE, 0) if offset % 4 == 0 else (TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + offset)
    return Message(topic="t", partition=0, offset=offset, key=b"k", value=b"v", headers=headers, timestamp=timestamp)


def test_the_compiled_wrapper_spans_are_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    run = [
        _record(40 + i, [("traceparent", parent.encode()), ("tracestate", b"k=v")] if i % 3 == 0 else None)
        for i in range(30)
    ]
    made = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(wrapper_traces, "tracepath", None)
        tracing = SimpleNamespace(sampler=RecordSampler("parentbased_traceidratio", 0.3, random.Random(5)))
        traces = wrapper_traces.WrapperTraces(tracing, consumer_group="g")  # type: ignore[arg-type]
        got = traces.start("t", 0, run)
        assert got is not None
        ids: dict[str, str] = {}
        made.append([(offset, type(span), _fields(span, ids)) for offset, span in got.spans])
    assert made[0] and [m[::2] for m in made[0]] == [m[::2] for m in made[1]]
    assert {m[1] for m in made[0]} == {tracepath.RecordSpan}
    # The source timestamp rides on the span when the record has one (the wait before the wrapper took it).
    stamped = {offset: dict(fields[7]).get(SOURCE_TIMESTAMP) for offset, _type, fields in made[0]}  # type: ignore[call-overload]
    assert stamped == {o: None if o % 4 == 0 else 1_700_000_000_000 + o for o in stamped}
    assert None in stamped.values() and len(set(stamped.values())) > 2


def _envelope(traces: list[tuple[int, str, str]]) -> envelope.DecodedEnvelope:
    src = envelope_pb2.SourcePartition(cluster_id="c", topic="t", partition=0)
    run = envelope.RecordRun(
        offsets=range(10, 16),
        timestamps_ms=[1] * 6,
        timestamp_types=[envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME],
        keys=[b"k"] * 6,
        values=[b"v"] * 6,
        headers=[(1, [("h", b"x")]), (2, [("traceparent", b"old"), ("h", b"y")]), (4, [])],
    )
    return envelope.decode(
        envelope.encode(src, 9, run, wrapper_id="w", wrapper_epoch=1) + envelope.record_traces_suffix(traces)
    )


@pytest.mark.parametrize("start", [0, 2])
def test_the_compiled_deduper_spans_and_headers_are_the_python_ones(
    start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    env = _envelope(
        [
            (10, tp, ""),  # before start=2: not written
            (11, tp, "k=v"),  # a record with other headers
            (12, tp, ""),  # an existing traceparent header, replaced in place
            (13, " " + tp, ""),  # whitespace around: the parsed value counts
            (14, tp.upper(), ""),  # invalid: nothing to continue
            (15, "01-" + tp[3:] + "-more", "s=1"),  # a later version
            (99, tp, ""),  # not one of the envelope's records
        ]
    )
    results = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(deduper_traces, "tracepath", None)
        kept = _Kept()
        tracing = SimpleNamespace(records=kept)
        traces = deduper_traces.DeduperTraces(tracing, staging_topic="stg", consumer_group="d")  # type: ignore[arg-type]
        column = traces.written(
            env, start, destination="dst", staging_partition=3, staging_offset=7, headers=env.run.header_column()
        )
        traces.committed(records=6, started_ns=1)
        ids: dict[str, str] = {}
        spans = [_fields(span, ids) for span in kept.ended[:-1]]  # the commit span links the publish spans
        assert column is not None
        headers = [
            None
            if h is None
            else [(k, ids.get(bytes(v or b"")[36:52].decode(), v) if k == "traceparent" else v) for k, v in h]
            for h in column
        ]
        results.append((headers, spans))
    assert results[0] == results[1]
    headers, spans = results[0]
    assert headers[2] is not None and [k for k, _ in headers[2]] == ["traceparent", "h"]  # replaced in place
    assert len(spans) == (10 if start == 0 else 6)  # a process and a publish span per continued record


def test_compiled_record_spans_take_what_the_dataclass_takes() -> None:
    compiled, python = (
        cls(SHAPE, "a" * 32, "b" * 16, "", 1, tracestate="k=v", attributes=(("a", 1),), end_ns=5, status=2, message="m")
        for cls in (tracepath.RecordSpan, _lean.RecordSpanPy)
    )
    ids: dict[str, str] = {}
    assert _fields(compiled, ids) == _fields(python, ids) and compiled.traceparent == python.traceparent
    compiled.status, compiled.end_ns = 1, 9  # mutable, as the data paths end them
    with pytest.raises(AttributeError):
        compiled.other = 1  # type: ignore[attr-defined]  # no dict: a typo fails, as with slots
    assert "trace_id='" + "a" * 32 in repr(compiled)


@pytest.mark.parametrize("ratio", [0.5, 0.01, 0.0001, 1e-9])
def test_the_compiled_sampler_draws_what_the_python_one_draws(ratio: float, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [random.Random(ratio).randrange(1, 3000) for _ in range(300)]
    compiled = RecordSampler("traceidratio", ratio, random.Random(11))
    chosen = [compiled.roots(n) for n in runs]
    monkeypatch.setattr(_sampling, "tracepath", None)
    python = RecordSampler("traceidratio", ratio, random.Random(11))
    assert chosen == [python.roots(n) for n in runs]
    assert compiled._skip == python._skip and isinstance(compiled._skip, int)
    if ratio >= 0.01:
        assert sum(map(len, chosen)) > 0
