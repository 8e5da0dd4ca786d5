"""Where a consumer group resumes at the destination (``_translate_group.resolve``), without brokers.

The contract: every destination record before the translated offset comes from a source record before the
group's committed offset, every one from it on from a source record at or past it. Each case builds a
partition's mappings as the deduper writes them and checks that contract against them record by record.
"""

from __future__ import annotations

from typing import Any

import pytest
from ferryman.errors import InvalidRequestError
from ferryman.state import offset_mapping
from ferryman.v1 import control_pb2, envelope_pb2, state_pb2
from ferryman_deduper._translate_group import (
    AHEAD,
    NOT_REPLICATED,
    TRANSLATED,
    MapLookup,
    _validate,
    _visit,
    last_read,
    lookup_for,
    resolve,
)


def _mapping(first_dest: int, sources: list[int]) -> state_pb2.OffsetMapping:
    return offset_mapping(envelope_pb2.SourcePartition(topic="t", partition=0), "src.t", first_dest, sources)


#: Source offsets 0-4 at destination 0-4 (then a marker at 5), 6-9 (5 was the source's own marker) at 6-9,
#: 12-14 (10-11 compacted away at the source) at 11-13; 16 and 18 (listed: not consecutive) at 15-16.
MAPPINGS = [_mapping(0, [0, 1, 2, 3, 4]), _mapping(6, [6, 7, 8, 9]), _mapping(11, [12, 13, 14]), _mapping(15, [16, 18])]
COPIES = {s: m.first_destination_offset + i for m in MAPPINGS for i, s in enumerate(m.source_offsets)}


def _state(watermark: int, dest: int) -> state_pb2.WatermarkState:
    return state_pb2.WatermarkState(watermark=watermark, destination_offset=dest, destination_topic="src.t")


def _lookup(read: int, state: state_pb2.WatermarkState) -> MapLookup | None:
    """The lookup the translator makes, fed the mappings as its scan would."""
    lookup = lookup_for(read, state)
    for m in MAPPINGS:
        if lookup is None or lookup.done:
            break
        lookup.visit(m)
    return lookup


@pytest.mark.parametrize("committed", range(20))
def test_a_translated_offset_splits_the_copies_exactly_where_the_group_stopped(committed: int) -> None:
    state = _state(18, COPIES[18])
    status, offset = resolve(committed - 1, state, _lookup(committed - 1, state))
    assert status == TRANSLATED
    for source, dest in COPIES.items():
        assert (dest < offset) == (source < committed), (source, dest, offset)


def test_a_group_at_the_watermark_needs_no_offset_map() -> None:
    state = _state(18, 16)
    assert lookup_for(18, state) is None
    assert resolve(18, state, None) == (TRANSLATED, 17)
    assert lookup_for(17, state) is not None


def test_a_group_past_replication_resumes_after_the_last_copy_and_says_so() -> None:
    state = _state(9, 9)
    assert resolve(12, state, None) == (AHEAD, 10)
    unknown_dest = _state(9, -1)  # the state names no destination offset: the map does
    assert resolve(12, unknown_dest, _lookup(12, unknown_dest)) == (AHEAD, 10)


def test_a_group_past_only_transaction_markers_is_translated_by_its_last_record() -> None:
    """A Java consumer at a transactional partition's end commits past the marker: 16 with 15 a marker."""
    source = control_pb2.GroupOffset(topic="t", partition=0, offset=16)
    assert last_read(source) == 15  # the wrapper could not tell: ahead, and the offset is right anyway
    assert resolve(last_read(source), _state(14, 13), None) == (AHEAD, 14)
    source.last_record_offset = 14
    assert last_read(source) == 14
    assert resolve(last_read(source), _state(14, 13), None) == (TRANSLATED, 14)


def test_a_group_before_the_flows_first_record_starts_at_that_record() -> None:
    lookup = MapLookup(-1)
    lookup.visit(_mapping(40, [100, 101]))
    assert lookup.done and lookup.below is None
    assert resolve(-1, _state(101, 41), lookup) == (TRANSLATED, 40)


def test_a_partition_without_state_or_mappings_is_not_replicated() -> None:
    assert resolve(4, None, None) == (NOT_REPLICATED, -1)
    assert resolve(4, _state(-1, -1), None) == (NOT_REPLICATED, -1)
    assert resolve(4, _state(9, 9), MapLookup(4)) == (NOT_REPLICATED, -1)


def test_the_scan_feeds_each_partitions_lookup_and_stops_once_all_are_done() -> None:
    wanted = {b"t/0/": MapLookup(7), b"t/1/": MapLookup(0)}
    assert not _visit(wanted, b"t/0/0", MAPPINGS[0].SerializeToString())
    assert not _visit(wanted, b"other/0/0", b"not a mapping")  # another partition's, never parsed
    assert not _visit(wanted, b"t/0/6", MAPPINGS[1].SerializeToString())
    assert not _visit(wanted, b"t/1/0", _mapping(0, [0, 1]).SerializeToString())
    assert wanted[b"t/0/"].below == 7 and wanted[b"t/1/"].below == 0
    assert not _visit(wanted, b"t/1/2", _mapping(2, [2]).SerializeToString())
    assert _visit(wanted, b"t/0/12", MAPPINGS[2].SerializeToString())


@pytest.mark.parametrize(
    ("group", "offsets", "field"),
    [
        ("", [("t", 0, 1)], "group"),
        ("g", [("", 0, 1)], "source_offsets[0].topic"),
        ("g", [("t", 0, 1), ("t", -1, 1)], "source_offsets[1].partition"),
        ("g", [("t", 0, -2)], "source_offsets[0].offset"),
        ("g", [("t", 0, 1), ("t", 0, 2)], "source_offsets[1]"),
        ("g", [("t", 0, 5, 5)], "source_offsets[0].last_record_offset"),
        ("g", [("t", 0, 5, -2)], "source_offsets[0].last_record_offset"),
    ],
)
def test_bad_requests_name_the_field(group: str, offsets: list[tuple[Any, ...]], field: str) -> None:
    source_offsets = [
        control_pb2.GroupOffset(
            topic=o[0], partition=o[1], offset=o[2], last_record_offset=o[3] if len(o) > 3 else None
        )
        for o in offsets
    ]
    with pytest.raises(InvalidRequestError) as raised:
        _validate(group, source_offsets)
    assert raised.value.field == field
