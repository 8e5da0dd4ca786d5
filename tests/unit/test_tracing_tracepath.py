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

import pytest
from ferryman import envelope
from ferryman.tracing import RecordSpan, SpanShape, _lean, _sampling

# _tracepath must be built here (the install builds it): a missing extension fails this module, never skips it.
from ferryman.tracing import _tracepath as tracepath
from ferryman.tracing._sampling import parse_traceparent, parse_traceparent_py
from ferryman.v1 import envelope_pb2
from ferryman_deduper._traces import _index_of
from ferryman_wrapper import _traces as wrapper_traces
from opentelemetry.trace import SpanKind

SHAPE = SpanShape("t process", SpanKind.CONSUMER, {})
HEX = "0123456789abcdef"


def test_the_services_use_the_compiled_paths() -> None:
    assert _lean.tracepath is _sampling.tracepath is wrapper_traces.tracepath is tracepath
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
        value = "00-" + "".join(rng.choices(HEX, k=32)) + "-" + "".join(rng.choices(HEX, k=16)) + "-0" + rng.choice("01")
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
    offsets = sorted(rng.sample(range(0, 1 << 40), n - 2)) + [0, 127]
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
