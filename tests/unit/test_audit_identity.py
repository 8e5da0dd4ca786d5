"""Exact content identities (ferryman_auditor._identity) and the offset map's expansion (no Kafka, no Spark).

Both coders run every case: the compiled one (a 64-bit hash per record, equal
hashes confirmed byte for byte) and the Arrow kernels it replaces where it is
built. With every hash forced equal the compiled codes must stay exact.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from ferryman.state import offset_mapping
from ferryman.v1 import envelope_pb2
from ferryman_auditor._identity import compiled_codes, content_keys
from ferryman_auditor._task import expand_mappings
from ferryman_auditor.kafka_source import ARROW_SCHEMA

_SCHEMA = pa.schema([ARROW_SCHEMA.field(c) for c in ("key", "value", "headers", "timestamp", "timestamp_type")])


def _record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"key": b"k", "value": b"v", "headers": None, "timestamp": 1_000, "timestamp_type": 0}
    return {**base, **changes}


#: How a test codes a table: the compiled coder, the same with every hash equal, the Arrow kernels.
_CODERS = ["compiled", "colliding", "arrow"]


def _table(records: list[dict[str, Any]], chunk: int = 3) -> pa.Table:
    table = pa.Table.from_pylist(records, schema=_SCHEMA)
    # Several chunks, as a task's reads give: codes must not depend on where a chunk starts.
    return pa.concat_tables([table.slice(i, chunk) for i in range(0, len(records), chunk)] or [table])


def _identities(records: list[dict[str, Any]], coder: str = "compiled", chunk: int = 3) -> list[tuple[int, int]]:
    table = _table(records, chunk)
    if coder == "colliding":
        first = compiled_codes(table, hash_mask=0) if len(records) else np.zeros(0, dtype=np.int64)
        second = np.zeros(len(first), dtype=np.int64)
    else:
        first, second = content_keys(table, compiled=coder == "compiled")
    return list(zip(first.tolist(), second.tolist(), strict=True))


def _same_partition(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Whether two codings tell exactly the same rows apart."""
    return len(set(a)) == len(set(b)) == len(set(zip(a, b, strict=True)))


@pytest.mark.parametrize("coder", _CODERS)
def test_equal_contents_and_only_those_share_an_identity(coder: str) -> None:
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
    ids = _identities(records, coder)
    assert len(set(ids)) == len(records)  # every change of key, value, headers, timestamp or type is seen
    again = _identities(records + records[::-1], coder)
    n = len(records)
    assert again[:n] == [again[2 * n - 1 - i] for i in range(n)]  # the same contents, the same identities
    assert len(set(again)) == n


@pytest.mark.parametrize("coder", _CODERS)
def test_an_empty_table_has_no_identities(coder: str) -> None:
    assert _identities([], coder) == []


@pytest.mark.parametrize("coder", _CODERS)
def test_traceparent_is_left_out(coder: str) -> None:
    tp = {"key": "traceparent", "value": b"00-1-2-01"}
    other_tp = {"key": "traceparent", "value": b"00-3-4-01"}
    h = {"key": "h", "value": b"1"}
    records = [
        _record(),  # no headers
        _record(headers=[tp]),  # only a traceparent: as no headers
        _record(headers=[h]),
        _record(headers=[h, tp]),  # appended at the destination
        _record(headers=[other_tp, h]),  # replaced
        _record(headers=[]),  # empty, not null
    ]
    ids = _identities(records, coder)
    assert ids[0] == ids[1] and ids[2] == ids[3] == ids[4]
    assert len({ids[0], ids[2], ids[5]}) == 3


def _random_record(rng: random.Random) -> dict[str, Any]:
    def blob() -> bytes | None:
        some = bytes(rng.randrange(4) for _ in range(9))
        return rng.choice([None, b"", b"a", b"ab", b"abcdefgh", b"abcdefghi", some])

    mixed = [{"key": rng.choice(["a", "b", "traceparent"]), "value": blob()} for _ in range(rng.randrange(1, 4))]
    headers = rng.choice([None, [], [{"key": "traceparent", "value": blob()}], mixed])
    return {
        "key": blob(),
        "value": blob(),
        "headers": headers,
        "timestamp": rng.choice([1_000, 1_001]),
        "timestamp_type": rng.choice([-1, 0, 1]),
    }


def test_the_coders_tell_the_same_records_apart() -> None:
    rng = random.Random(27)
    pool = [_random_record(rng) for _ in range(500)]  # near misses among them (one field apart)
    records = [rng.choice(pool) for _ in range(3_000)]  # and each content many times
    arrow = _identities(records, "arrow", chunk=250)
    assert len(set(arrow)) <= 500
    assert _same_partition(arrow, _identities(records, "compiled", chunk=250))
    # Every hash equal: each record is compared with every distinct content before it (kept small).
    assert _same_partition(_identities(records[:600], "arrow"), _identities(records[:600], "colliding"))


def test_the_compiled_coder_reads_64_bit_offsets_as_it_reads_32_bit_ones() -> None:
    """Arrow's large types (a column past 2 GiB) hold 64-bit offsets: the coder reads both widths in place."""
    rng = random.Random(64)
    table = _table([_random_record(rng) for _ in range(400)], chunk=50)
    entry = pa.struct([pa.field("key", pa.large_string()), pa.field("value", pa.large_binary())])
    large = pa.schema(
        [
            pa.field("key", pa.large_binary()),
            pa.field("value", pa.large_binary()),
            pa.field("headers", pa.large_list(entry)),
            *(table.schema.field(c) for c in ("timestamp", "timestamp_type")),
        ]
    )
    narrow, wide = compiled_codes(table), compiled_codes(table.cast(large))
    assert narrow.tolist() == wide.tolist()
    assert len(set(narrow.tolist())) > 100  # many contents, each told apart


def test_mappings_of_one_partition_in_source_order() -> None:
    def raw(topic: str, partition: int, first_dest: int, offsets: list[int]) -> bytes:
        source = envelope_pb2.SourcePartition(topic=topic, partition=partition)
        return offset_mapping(source, "dst", first_dest, offsets).SerializeToString()

    values = [raw("t", 0, 50, [10, 12]), raw("t", 1, 0, [3]), None, raw("u", 0, 9, [1]), raw("t", 0, 40, [4, 5, 6])]
    ms, md = expand_mappings(values, "t", 0)
    assert ms.tolist() == [4, 5, 6, 10, 12]
    assert md.tolist() == [40, 41, 42, 50, 51]
