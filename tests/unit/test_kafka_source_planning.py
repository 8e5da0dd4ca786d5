"""Planning of the ferryman-kafka data source: options, spans, splits (no Kafka, no Spark)."""

from __future__ import annotations

import pytest
from ferryman_auditor.kafka_source import (
    BoundSpec,
    KafkaSourceError,
    OffsetSpan,
    Watermarks,
    parse_options,
    plan_splits,
    resolve_spans,
    split_span,
)

BASE = {"bootstrap.servers": "k:9092", "topic": "t"}


def test_a_span_is_split_by_offsets_into_contiguous_pieces() -> None:
    pieces = split_span(OffsetSpan("t", 0, 10, 35), 10)
    assert [(s.start, s.end) for s in pieces] == [(10, 20), (20, 30), (30, 35)]
    assert split_span(OffsetSpan("t", 0, 10, 20), 10) == [OffsetSpan("t", 0, 10, 20)]


def test_empty_spans_plan_no_split_and_partitions_keep_their_order() -> None:
    spans = [OffsetSpan("t", 2, 0, 3), OffsetSpan("t", 0, 5, 5), OffsetSpan("t", 1, 7, 4)]
    assert plan_splits(spans, 100) == [OffsetSpan("t", 2, 0, 3)]
    assert plan_splits([], 100) == []


def test_sparse_offsets_split_by_position_not_by_count() -> None:
    # A transactional partition: 0..49 data, 50 a marker, 51..100 data, 101 a marker. The span ends after the
    # marker; splits cover every offset once, whatever lies there, and none assumes end - start records.
    marks = {0: Watermarks(0, 102)}
    (span,) = resolve_spans("t", marks, BoundSpec("earliest"), BoundSpec("latest"))
    pieces = plan_splits([span], 51)
    assert [(s.start, s.end) for s in pieces] == [(0, 51), (51, 102)]
    assert pieces[-1].end == 102  # the reader stops at its position past the marker, not after N records


def test_bounds_are_clamped_to_what_the_partition_stores() -> None:
    marks = {0: Watermarks(100, 200), 1: Watermarks(0, 0)}
    start = BoundSpec("earliest", per_partition={0: 50})  # below the low watermark: retention removed it
    end = BoundSpec("latest", per_partition={0: 500})  # past the end: nothing there yet
    spans = resolve_spans("t", marks, start, end)
    assert spans == [OffsetSpan("t", 0, 100, 200), OffsetSpan("t", 1, 0, 0)]
    assert spans[1].empty


def test_an_end_before_the_start_gives_an_empty_span() -> None:
    spans = resolve_spans("t", {0: Watermarks(0, 100)}, BoundSpec(60), BoundSpec(40))
    assert spans == [OffsetSpan("t", 0, 60, 60)]


def test_timestamps_resolve_through_kafkas_offsets_for_times() -> None:
    marks = {0: Watermarks(0, 100), 1: Watermarks(10, 50)}
    spans = resolve_spans(
        "t",
        marks,
        BoundSpec("earliest", timestamp_ms=1000),
        BoundSpec("latest", timestamp_ms=2000),
        start_times={0: 20, 1: -1},  # -1: no record at or after that time
        end_times={0: 70, 1: -1},
    )
    assert spans == [OffsetSpan("t", 0, 20, 70), OffsetSpan("t", 1, 50, 50)]


def test_options_parse_spark_style_bounds_and_pass_kafka_properties_through() -> None:
    opts = parse_options(
        {
            **BASE,
            "partitions": "2,0",
            "startingOffsets": '{"0": 5, "2": "earliest"}',
            "endingOffsets": "latest",
            "kafka.security.protocol": "SASL_SSL",
            "maxOffsetsPerSplit": "1000",
        }
    )
    assert opts.partitions == (0, 2)
    assert opts.start.of(0) == 5 and opts.start.of(2) == "earliest" and opts.start.of(1) == "earliest"
    assert opts.end.of(0) == "latest"
    assert opts.kafka_config == {
        "security.protocol": "SASL_SSL",
        "bootstrap.servers": "k:9092",
        "isolation.level": "read_committed",
    }
    assert opts.max_offsets_per_split == 1000


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"topic": "t"}, "bootstrap.servers"),
        ({**BASE, "securityprotocol": "x"}, "unknown option"),
        ({**BASE, "isolation.level": "dirty"}, "isolation.level"),
        ({**BASE, "startingOffsets": "{nope"}, "JSON"),
        ({**BASE, "startingOffsets": "-5"}, "negative"),
        ({**BASE, "endingOffsets": "1", "endingTimestamp": "5"}, "not both"),
        ({**BASE, "maxOffsetsPerSplit": "0"}, "positive"),
        ({**BASE, "partitions": "a,b"}, "partitions"),
    ],
)
def test_bad_options_fail_at_once_naming_the_option(options: dict[str, str], complaint: str) -> None:
    with pytest.raises(KafkaSourceError, match=complaint):
        parse_options(options)
