"""The compiled record-span encoders (ferryman.tracing._spanwire) write what the pure-Python encoders write.

Each format is compared byte for byte on seeded random batches (parents, remote
parents, tracestates, per-span attributes, links, statuses, non-ASCII names and
values, times on second and rounding edges); spans the compiled path leaves to
Python (see its module docstring) still come out the same through ``encode``.
"""

from __future__ import annotations

import io
import random
import sys
import threading
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

# _spanwire must be built here (the install builds it): a missing extension fails this module, never skips it.
from ferryman.tracing import ERROR, OK, RecordSpan, SpanShape, _file, _otlp, _spanwire, _zipkin
from ferryman.tracing._file import FileBatches
from ferryman.tracing._lean import UNSET
from ferryman.tracing._otlp import HttpSpanExporter, OtlpBatches
from ferryman.tracing._zipkin import ZipkinBatches
from opentelemetry.exporter.zipkin.json import ZipkinExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

# One resource for every encoder: Resource.create adds a random service.instance.id.
RESOURCE = Resource.create({"service.name": "svc-ñ", "deployment.environment": 'q"a'})
SCOPE = InstrumentationScope("ferryman")

SHAPES = [
    SpanShape("orders process", SpanKind.CONSUMER, {"messaging.system": "kafka", "ferryman.source.partition": 3}),
    SpanShape("dst publish", SpanKind.PRODUCER, {"messaging.destination.name": "dst"}),
    SpanShape("ferryman commit", SpanKind.INTERNAL, {}),
    SpanShape('tópico 名前 "q" process', SpanKind.CONSUMER, {"messaging.destination.name": 'tópico "名前"'}),
    SpanShape("rpc", SpanKind.SERVER, {"n": 0, "big": 2**63 - 1, "neg": -(2**63), "s": "\u2028\x00\\"}),
    SpanShape("call", SpanKind.CLIENT, {"k": "v" * 200}),  # Zipkin cuts tag values at 128
]
TRACESTATES = ["", "", "key=x,value=y", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", "a=1"]
KEYS = ["messaging.kafka.message.offset", "ferryman.source.offset", "ferryman.transaction.records", "x"]
INTS = [0, 1, -1, 7, 2**31, 2**62, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**70, -(2**64)]
STRS = ["", "plain", 'with "quotes"', "välue 名前", "\n\t\\", "e\u0301\U0001f600", "x" * 300]
MESSAGES = ["", 'transaction not committed: "rewound"', "échec — 失敗", '\\"\n']
#: Nanoseconds into a second: the microsecond rounding edges and the next second's.
EDGES = [0, 1, 499, 500, 501, 999, 1_000, 1_499, 1_500, 999_999_499, 999_999_500, 999_999_999]
#: Seconds since the epoch: the epoch, a leap day, ends of years and centuries, ~2026, up to 2262.
SECONDS = [0, 59, 86_399, 951_782_400, 946_684_799, 1_800_000_000, 4_102_444_799, 4_107_542_400, 9_000_000_000]


def _hex(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(4 * digits) or 1:0{digits}x}"


def _time(rng: random.Random) -> int:
    second = rng.choice(SECONDS) if rng.random() < 0.5 else rng.randrange(1_700_000_000, 1_900_000_000)
    fraction = rng.choice(EDGES) if rng.random() < 0.7 else rng.randrange(1_000_000_000)
    return second * 1_000_000_000 + fraction


def _span(rng: random.Random, earlier: Sequence[RecordSpan]) -> RecordSpan:
    start = _time(rng)
    attributes: list[tuple[str, int | str]] = []
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        key = rng.choice(KEYS)
        attributes.append((key, rng.choice(STRS) if rng.random() < 0.2 else rng.choice(INTS)))
    status = rng.choice([UNSET, UNSET, OK, ERROR])
    span = RecordSpan(
        rng.choice(SHAPES),
        _hex(rng, 32),
        _hex(rng, 16),
        _hex(rng, 16) if rng.random() < 0.6 else "",
        start,
        rng.random() < 0.4,
        rng.choice(TRACESTATES),
        tuple(attributes),
        rng.sample(earlier, min(len(earlier), rng.choice([0, 0, 1, 1, 3, 8]))),
        end_ns=start + rng.choice([0, 1, 499, 500, 999_999_500, rng.randrange(10**11)]),
        status=status,
        message=rng.choice(MESSAGES) if status == ERROR or rng.random() < 0.1 else "",
    )
    if rng.random() < 0.05:
        span.end_ns = 0  # not ended: a negative Zipkin duration
    return span


def _batch(rng: random.Random, size: int) -> list[RecordSpan]:
    spans: list[RecordSpan] = []
    for _ in range(size):
        spans.append(_span(rng, spans[-20:]))
    return spans


def _file_pair() -> tuple[FileBatches, FileBatches]:
    return (FileBatches(ConsoleSpanExporter(out=io.StringIO()), RESOURCE), FileBatches(ConsoleSpanExporter(), RESOURCE))


def _zipkin_pair() -> tuple[ZipkinBatches, ZipkinBatches]:
    return ZipkinBatches(ZipkinExporter(), RESOURCE, SCOPE), ZipkinBatches(ZipkinExporter(), RESOURCE, SCOPE)


def _otlp_pair() -> tuple[OtlpBatches, OtlpBatches]:
    return OtlpBatches(HttpSpanExporter(), RESOURCE, SCOPE), OtlpBatches(HttpSpanExporter(), RESOURCE, SCOPE)


def _text(encoded: bytes | None) -> str | None:
    """The compiled JSON encoders' bytes as the str their Python references make."""
    return None if encoded is None else encoded.decode()


def _file_compiled(batches: FileBatches, spans: Sequence[RecordSpan]) -> str | None:
    return _text(_spanwire.file_lines(batches, spans, _file._STATUS, _file._error))


def _zipkin_compiled(batches: ZipkinBatches, spans: Sequence[RecordSpan]) -> str | None:
    return _text(_spanwire.zipkin_spans(batches, spans, _zipkin._STATUS_TAGS, _zipkin._tag))


def _otlp_compiled(batches: OtlpBatches, spans: Sequence[RecordSpan]) -> bytes | None:
    return _spanwire.otlp_request(
        batches, spans, _otlp._key_value, _otlp._FLAGS_LOCAL, _otlp._FLAGS_REMOTE, _otlp._LINK_FLAGS
    )


def test_the_encoders_run_the_compiled_path() -> None:
    assert _file.spanwire is _zipkin.spanwire is _otlp.spanwire is _spanwire
    assert _file.ENCODER == _zipkin.ENCODER == _otlp.ENCODER == "compiled"


#: Per format: a (compiled-path, Python-path) encoder pair, and the compiled call the compiled one makes.
FORMATS: dict[str, tuple[Callable[[], tuple[Any, Any]], Callable[[Any, Sequence[RecordSpan]], str | bytes | None]]] = {
    "file": (_file_pair, _file_compiled),
    "zipkin": (_zipkin_pair, _zipkin_compiled),
    "otlp": (_otlp_pair, _otlp_compiled),
}


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_compiled_output_is_the_python_encoders(fmt: str, seed: int) -> None:
    rng = random.Random(seed)
    make_pair, compiled_call = FORMATS[fmt]
    compiled, python = make_pair()  # separate caches: each fills its own
    for size in (1, 2, rng.randrange(3, 60)):
        spans = _batch(rng, size)
        encoded = compiled_call(compiled, spans)
        assert encoded is not None
        assert encoded == python.encode_py(spans)
        assert compiled.encode(spans) == encoded


def test_empty_batches() -> None:
    file, _ = _file_pair()
    zipkin, _ = _zipkin_pair()
    otlp, _ = _otlp_pair()
    assert _file_compiled(file, []) == file.encode_py([]) == ""
    assert _zipkin_compiled(zipkin, []) == zipkin.encode_py([]) == "[]"
    assert _otlp_compiled(otlp, []) == otlp.encode_py([])


def test_large_batches_grow_the_buffers_and_later_batches_reuse_them() -> None:
    """Batches of several MB (spans with many links), then small ones: same output as Python."""
    rng = random.Random(7)
    linked = _batch(rng, 64)
    spans = _batch(rng, 3000)
    for span in spans:
        span.links = linked
    pairs: list[tuple[Any, Any, Callable[[Any, Sequence[RecordSpan]], object]]] = [
        (*_file_pair(), _file_compiled),
        (*_zipkin_pair(), _zipkin_compiled),
        (*_otlp_pair(), _otlp_compiled),
    ]
    for compiled, python, encode in pairs:
        assert encode(compiled, spans) == python.encode_py(spans)
        small = _batch(rng, 10)
        assert encode(compiled, small) == python.encode_py(small)


def _plain_span() -> RecordSpan:
    span = RecordSpan(SHAPES[0], "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "", 1_800_000_000_000_000_000)
    span.end_ns = span.start_ns + 1
    return span


def _odd_spans() -> list[tuple[str, RecordSpan]]:
    """Spans the compiled path may leave to Python (odd ids, times, statuses, keys), named."""

    def but(**changes: object) -> RecordSpan:
        span = _plain_span()
        for name, value in changes.items():
            setattr(span, name, value)
        return span

    trace_id, span_id = _plain_span().trace_id, _plain_span().span_id
    return [
        ("uppercase hex", but(trace_id=trace_id.upper(), span_id=span_id.upper())),
        ("short id", but(span_id="abc")),
        ("non-hex id", but(trace_id="z" * 32)),
        ("spaced hex", but(span_id="b7ad6b71 9203331")),
        ("non-ASCII id", but(span_id="é" * 16)),
        ("non-ASCII parent", but(parent_id="ü" * 16)),
        ("non-ASCII link id", but(links=[but(trace_id="名" * 32)])),
        ("non-ASCII key", but(attributes=(("clé", 1), ("k", "v")))),
        ("before 1970", but(start_ns=-5_000_000_499, end_ns=-1)),
        ("just before 1970", but(start_ns=-500, end_ns=-501)),
        ("after 2262", but(start_ns=2**63 + 5, end_ns=2**64 - 1)),
        ("year 9999", but(start_ns=253_402_300_799_999_999_499, end_ns=253_402_300_799_999_999_500)),
        ("status 3", but(status=3)),
        ("status True", but(status=True)),
        ("bool attribute", but(attributes=(("b", True), ("f", False)))),
        ("float attribute", but(attributes=(("f", 1.5),))),
        ("huge attribute", but(attributes=(("h", 10**30), ("n", -(10**30))))),
        ("ERROR without message", but(status=ERROR)),
        ("message on OK", but(status=OK, message="ok ✓")),
        ("surrogate in message", but(status=ERROR, message="\udc80")),
        ("non-ASCII tracestate", but(tracestate="k=välue")),
        ("links in a tuple", but(links=(_plain_span(), _plain_span()))),
    ]


@pytest.mark.parametrize("pair", [_file_pair, _zipkin_pair, _otlp_pair], ids=["file", "zipkin", "otlp"])
def test_odd_spans_come_out_as_python_writes_them(pair: Callable[[], tuple[object, object]]) -> None:
    """Whatever path a span takes, ``encode`` gives ``encode_py``'s output, or raises what it raises."""
    compiled: Any
    python: Any
    compiled, python = pair()
    for label, odd in _odd_spans():
        spans = [_plain_span(), odd]
        try:
            expected: object = python.encode_py(spans)
        except Exception as exc:  # an invalid span: the same error either way
            with pytest.raises(type(exc)):
                compiled.encode(spans)
            continue
        assert compiled.encode(spans) == expected, label


def test_the_python_path_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``spanwire`` None (as when not built) ``encode`` is ``encode_py``; otherwise it calls the compiled one."""
    spans = _batch(random.Random(3), 20)
    calls: list[str] = []

    def counted(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object) -> object:
            calls.append(name)
            return fn(*args)

        return call

    spy = SimpleNamespace(
        file_lines=counted("file", _spanwire.file_lines),
        zipkin_spans=counted("zipkin", _spanwire.zipkin_spans),
        otlp_request=counted("otlp", _spanwire.otlp_request),
    )
    file, zipkin, otlp = _file_pair()[0], _zipkin_pair()[0], _otlp_pair()[0]
    for module in (_file, _zipkin, _otlp):
        monkeypatch.setattr(module, "spanwire", spy)
    compiled = (file.encode(spans), zipkin.encode(spans), otlp.encode(spans))
    assert calls == ["file", "zipkin", "otlp"]
    for module in (_file, _zipkin, _otlp):
        monkeypatch.setattr(module, "spanwire", None)
    assert (file.encode(spans), zipkin.encode(spans), otlp.encode(spans)) == compiled
    assert calls == ["file", "zipkin", "otlp"]


def test_a_call_made_while_another_is_encoding_gets_buffers_of_its_own() -> None:
    """An encoding started from a callback of another (as another thread may) leaves that one's output whole."""
    rng = random.Random(5)
    outer, inner = _batch(rng, 40), _batch(rng, 40)
    zipkin, reference = _zipkin_pair()
    inner_outputs: list[str | None] = []

    def tag(value: object) -> str:
        inner_outputs.append(_text(_spanwire.zipkin_spans(zipkin, inner, _zipkin._STATUS_TAGS, _zipkin._tag)))
        return _zipkin._tag(value)

    for span in outer:
        span.attributes = (("s", "a str value: tag() is called"),)
    assert _text(_spanwire.zipkin_spans(zipkin, outer, _zipkin._STATUS_TAGS, tag)) == reference.encode_py(outer)
    assert inner_outputs and all(out == reference.encode_py(inner) for out in inner_outputs)


def test_threads_encoding_at_once_each_get_their_own_output() -> None:
    """Python callbacks (str tags, cache misses) let threads interleave: each still gets its own batches."""
    rng = random.Random(11)
    batches = [_batch(rng, 30) for _ in range(8)]
    zipkin, reference = _zipkin_pair()
    expected = [reference.encode_py(b) for b in batches]
    failures: list[str] = []

    def encode_all(offset: int) -> None:
        for i in range(40):
            k = (i + offset) % len(batches)
            if zipkin.encode(batches[k]) != expected[k]:
                failures.append(f"thread {offset} batch {k}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, inside the callbacks too
    try:
        threads = [threading.Thread(target=encode_all, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not failures
