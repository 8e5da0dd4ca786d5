"""The demo's own check (ferryman_local.verify): exact means byte for byte; traceparent is left out only when asked."""

from __future__ import annotations

from ferryman_local.verify import Record, compare, without_header

SOURCE: dict[int, list[Record]] = {
    0: [(b"k", b"v1", (("source", b"demo"), ("source", b"repeated")), 1), (None, None, (), 2)],
    1: [(b"k", b"v3", (), 3)],
}
#: The copy of a run with tracing on: partition 0's first record was traced (its traceparent appended).
TRACED: dict[int, list[Record]] = {
    0: [
        (b"k", b"v1", (("source", b"demo"), ("source", b"repeated"), ("traceparent", b"00-ab-cd-01")), 1),
        (None, None, (), 2),
    ],
    1: [(b"k", b"v3", (), 3)],
}


def test_an_identical_copy_is_exact_and_a_traceparent_is_a_difference() -> None:
    assert compare(SOURCE, SOURCE).exact
    verdict = compare(SOURCE, TRACED)
    assert not verdict.exact
    assert (verdict.missing, verdict.duplicated) == (1, 1)


def test_without_traceparent_the_traced_copy_is_exact_and_the_traced_records_are_counted() -> None:
    source, untraced = without_header(SOURCE, "traceparent")
    copy, traced = without_header(TRACED, "traceparent")
    assert (untraced, traced) == (0, 1)
    assert copy == SOURCE and source == SOURCE
    assert compare(source, copy).exact


def test_leaving_traceparent_out_still_sees_every_other_byte() -> None:
    altered: dict[int, list[Record]] = {**TRACED, 1: [(b"k", b"v3", (("x", b"1"),), 3)]}
    source, _ = without_header(SOURCE, "traceparent")
    copy, _ = without_header(altered, "traceparent")
    assert not compare(source, copy).exact
