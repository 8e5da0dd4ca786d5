"""The offset-map record's two forms (ferryman.state.offset_mapping / mapped_source_offsets)."""

from __future__ import annotations

import pytest
from ferryman.state import mapped_source_offsets, offset_mapping
from ferryman.v1 import envelope_pb2, state_pb2

SRC = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", topic_id=b"\x01" * 16, partition=4)


def _round_trip(source_offsets: list[int] | range) -> state_pb2.OffsetMapping:
    m = offset_mapping(SRC, "src.orders", 100, source_offsets)
    return state_pb2.OffsetMapping.FromString(m.SerializeToString())


@pytest.mark.parametrize("offsets", [[0], [5, 6, 7], range(2**40, 2**40 + 1000)], ids=["one", "three", "a-range"])
def test_consecutive_source_offsets_are_stored_as_first_offset_and_count(offsets: list[int] | range) -> None:
    m = _round_trip(offsets)
    assert (list(m.source_offsets), m.first_source_offset, m.record_count) == ([], offsets[0], len(offsets))
    assert list(mapped_source_offsets(m)) == list(offsets)


def test_source_offsets_with_holes_are_listed() -> None:
    m = _round_trip([5, 6, 9])
    assert (list(m.source_offsets), m.first_source_offset, m.record_count) == ([5, 6, 9], 0, 3)
    assert list(mapped_source_offsets(m)) == [5, 6, 9]


def test_the_mapping_names_its_source_and_destination() -> None:
    m = _round_trip([3])
    assert (m.source, m.destination_topic, m.destination_partition, m.first_destination_offset) == (
        SRC,
        "src.orders",
        4,
        100,
    )
