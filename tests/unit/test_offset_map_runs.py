"""The deduper writes one offset-map record per run of a source partition, not one per envelope.

At hundreds of partitions a streaming wrapper sends envelopes of a few records each; a map record per envelope
made the map cost a record (and a protobuf encode) per envelope in every transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from ferryman.state import PartitionKey, mapped_source_offsets
from ferryman.v1 import envelope_pb2, state_pb2
from ferryman_deduper._datapath import DataPath
from ferryman_deduper._transaction import Slice


class _Producer:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, state_pb2.OffsetMapping, int]] = []

    def produce(self, topic: str, *, key: bytes, value: bytes, partition: int) -> None:
        self.records.append((topic, key, state_pb2.OffsetMapping.FromString(value), partition))


def _datapath(slices: list[Slice]) -> tuple[DataPath, _Producer, dict[PartitionKey, int]]:
    producer = _Producer()
    last: dict[PartitionKey, int] = {}
    dp = object.__new__(DataPath)
    state: dict[str, Any] = {
        "_flow": SimpleNamespace(staging_partitions=12),
        "_names": SimpleNamespace(offset_map_topic="map"),
        "_txn": SimpleNamespace(slices=slices, producer=producer),
        "_parts": SimpleNamespace(last_dest_offset=last),
    }
    dp.__dict__.update(state)
    return dp, producer, last


def _src(partition: int, topic_id: bytes = b"id1") -> envelope_pb2.SourcePartition:
    return envelope_pb2.SourcePartition(cluster_id="c", topic="t", topic_id=topic_id, partition=partition)


def _slice(partition: int, offsets: Sequence[int], first_dest: int, topic_id: bytes = b"id1") -> Slice:
    key = PartitionKey("t", partition)
    return Slice(key, _src(partition, topic_id), "d.t", offsets, first_dest, first_dest + len(offsets) - 1)


def _mapped(records: list[tuple[str, bytes, state_pb2.OffsetMapping, int]]) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for _topic, _key, m, _p in records:
        for i, so in enumerate(mapped_source_offsets(m)):
            assert (m.source.partition, so) not in out
            out[(m.source.partition, so)] = m.first_destination_offset + i
    return out


def test_envelopes_of_many_partitions_make_one_map_record_per_partition() -> None:
    slices = []
    # 256 partitions, 5 envelopes of 3 records each, interleaved as a consume batch hands them out.
    for e in range(5):
        for p in range(256):
            slices.append(_slice(p, range(3 * e, 3 * e + 3), 100 + 3 * e))
    dp, producer, last = _datapath(slices)
    dp._produce_mappings()
    assert len(producer.records) == 256
    for _topic, key, m, _p in producer.records:
        assert key == f"t/{m.source.partition}/0".encode()
        assert (m.first_source_offset, m.record_count, list(m.source_offsets)) == (0, 15, [])  # range form
        assert m.first_destination_offset == 100
    assert _mapped(producer.records) == {(p, so): 100 + so for p in range(256) for so in range(15)}
    assert last == {PartitionKey("t", p): 114 for p in range(256)}


def test_runs_break_where_the_destination_or_the_source_does_not_continue() -> None:
    slices = [
        _slice(0, [0, 1, 2], 10),
        _slice(0, [5, 6], 13),  # a hole at the source (markers, compaction): merged, listed
        _slice(0, [7, 8], 20),  # another writer took 15..19 at the destination: a new record
        _slice(0, [9], 22, topic_id=b"id2"),  # the source topic was re-created: never merged across
    ]
    dp, producer, _last = _datapath(slices)
    dp._produce_mappings()
    maps = [m for _t, _k, m, _p in producer.records]
    assert [(m.first_destination_offset, list(mapped_source_offsets(m))) for m in maps] == [
        (10, [0, 1, 2, 5, 6]),
        (20, [7, 8]),
        (22, [9]),
    ]
    assert list(maps[0].source_offsets) == [0, 1, 2, 5, 6]  # listed: the hole must show
    assert [k for _t, k, _m, _p in producer.records] == [b"t/0/0", b"t/0/7", b"t/0/9"]


def test_a_slice_without_consecutive_destination_offsets_is_left_out_and_does_not_join_a_run() -> None:
    bad = _slice(0, [3, 4, 5], 13)
    bad.last_destination_offset = 20  # 3 records over 8 offsets: someone else wrote in between
    slices = [_slice(0, [0, 1, 2], 10), bad, _slice(0, [6, 7], 21)]
    dp, producer, last = _datapath(slices)
    dp._produce_mappings()
    maps = [m for _t, _k, m, _p in producer.records]
    assert [(m.first_destination_offset, list(mapped_source_offsets(m))) for m in maps] == [
        (10, [0, 1, 2]),
        (21, [6, 7]),
    ]
    assert last[PartitionKey("t", 0)] == 22
