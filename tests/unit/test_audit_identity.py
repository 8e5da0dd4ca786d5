"""Exact content identities (ferryman_auditor._identity) and the offset map's expansion (no Kafka, no Spark)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from ferryman.state import offset_mapping
from ferryman.v1 import envelope_pb2
from ferryman_auditor._identity import content_keys
from ferryman_auditor._task import expand_mappings
from ferryman_auditor.kafka_source import ARROW_SCHEMA

_SCHEMA = pa.schema([ARROW_SCHEMA.field(c) for c in ("key", "value", "headers", "timestamp", "timestamp_type")])


def _record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"key": b"k", "value": b"v", "headers": None, "timestamp": 1_000, "timestamp_type": 0}
    return {**base, **changes}


def _identities(records: list[dict[str, Any]], chunk: int = 3) -> list[tuple[int, int]]:
    table = pa.Table.from_pylist(records, schema=_SCHEMA)
    # Several chunks, as a task's reads give: codes must not depend on where a chunk starts.
    table = pa.concat_tables([table.slice(i, chunk) for i in range(0, len(records), chunk)] or [table])
    first, second = content_keys(table)
    return list(zip(first.tolist(), second.tolist(), strict=True))


def test_equal_contents_and_only_those_share_an_identity() -> None:
    h1 = [{"key": "h", "value": b"1"}]
    records = [
        _record(),
        _record(key=None),
        _record(key=b""),
        _record(value=None),
        _record(value=b""),
        _record(value=b"w"),
        _record(headers=[]),
        _record(headers=h1),
        _record(headers=[{"key": "h", "value": None}]),
        _record(headers=[{"key": "h", "value": b""}]),
        _record(headers=h1 * 2),
        _record(headers=[{"key": "g", "value": b"1"}]),
        _record(headers=[{"key": "h", "value": b"1"}, {"key": "g", "value": b"1"}]),
        _record(headers=[{"key": "g", "value": b"1"}, {"key": "h", "value": b"1"}]),
        _record(timestamp=1_001),
        _record(timestamp_type=1),
        _record(timestamp_type=-1),
    ]
    ids = _identities(records)
    assert len(set(ids)) == len(records)  # every change of key, value, headers, timestamp or type is seen
    again = _identities(records + records[::-1])
    n = len(records)
    assert again[:n] == [again[2 * n - 1 - i] for i in range(n)]  # the same contents, the same identities
    assert len(set(again)) == n


def test_an_empty_table_has_no_identities() -> None:
    assert _identities([]) == []


def test_mappings_of_one_partition_in_source_order() -> None:
    def raw(topic: str, partition: int, first_dest: int, offsets: list[int]) -> bytes:
        source = envelope_pb2.SourcePartition(topic=topic, partition=partition)
        return offset_mapping(source, "dst", first_dest, offsets).SerializeToString()

    values = [raw("t", 0, 50, [10, 12]), raw("t", 1, 0, [3]), None, raw("u", 0, 9, [1]), raw("t", 0, 40, [4, 5, 6])]
    ms, md = expand_mappings(values, "t", 0)
    assert ms.tolist() == [4, 5, 6, 10, 12]
    assert md.tolist() == [40, 41, 42, 50, 51]
