"""The envelope codec (ferryman.envelope).

Byte-faithful round trips in the columnar form and the 0.1 row form, the consistency checks of the columns,
checksum, malformed input, and the staging partition map.
"""

from __future__ import annotations

import random
import string
import time
import zlib
from collections.abc import Sequence

import google_crc32c
import pytest
from ferryman import envelope
from ferryman.envelope import Headers, RecordRun
from ferryman.errors import CorruptEnvelopeError, EnvelopeError
from ferryman.v1 import envelope_pb2

from tests.unit._fakes import Seen, run_of_seen, wire_batch

pytestmark = pytest.mark.usefixtures("each_codec")

SRC = envelope_pb2.SourcePartition(cluster_id="src-cluster", topic="orders", topic_id=bytes(range(16)), partition=7)
CREATE = envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME
APPEND = envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME
NOT_AVAILABLE = envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE


def rec(
    offset: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: Headers | None = None,
    timestamp_ms: int = 1_700_000_000_123,
    timestamp_type: int = CREATE,
) -> Seen:
    return Seen(offset, key, value, headers or [], timestamp_ms, timestamp_type)


def _encode(
    records: Sequence[Seen] | RecordRun,
    previous_offset: int = -1,
    *,
    wrapper_id: str = "wrapper-1",
    wrapper_epoch: int = 3,
    trace_context: dict[str, str] | None = None,
) -> bytes:
    return envelope.encode(
        SRC,
        previous_offset,
        records if isinstance(records, RecordRun) else run_of_seen(records),
        wrapper_id=wrapper_id,
        wrapper_epoch=wrapper_epoch,
        trace_context=trace_context,
    )


def _round_trip(records: Sequence[Seen]) -> list[Seen]:
    return Seen.of_run(envelope.decode(_encode(records)).run)


def _row(r: Seen) -> envelope_pb2.Record:
    """A record in the row form 0.1 wrappers wrote."""
    row = envelope_pb2.Record(
        offset=r.offset,
        timestamp_ms=r.timestamp_ms,
        timestamp_type=envelope_pb2.TimestampType.ValueType(r.timestamp_type),
    )
    if r.key is not None:
        row.key = r.key
    if r.value is not None:
        row.value = r.value
    envelope.add_headers(row, r.headers)
    return row


def _envelope_around(batch: envelope_pb2.RecordBatch | bytes, source: envelope_pb2.SourcePartition = SRC) -> bytes:
    """An envelope with a valid checksum around a batch, or around raw batch bytes.

    encode_batch refuses some batches that decode must still handle.
    """
    payload = batch if isinstance(batch, bytes) else batch.SerializeToString()
    return envelope_pb2.Envelope(source=source, records=payload, records_crc32=zlib.crc32(payload)).SerializeToString()


# ---------------------------------------------------------------- round trips


def test_round_trip_keeps_coordinates_chain_link_and_metadata() -> None:
    before_ms = int(time.time() * 1000)
    env = envelope.decode(
        _encode(
            [rec(41), rec(45)],
            previous_offset=40,
            wrapper_id="w-9",
            wrapper_epoch=12,
            trace_context={"traceparent": "00-abc-def-01"},
        )
    )
    assert env.source == SRC
    assert env.previous_offset == 40
    assert (env.first_offset, env.last_offset) == (41, 45)
    assert list(env.run.offsets) == [41, 45]
    assert (env.wrapper_id, env.wrapper_epoch) == ("w-9", 12)
    assert env.trace_context == {"traceparent": "00-abc-def-01"}
    assert before_ms <= env.wrapped_at_ms <= int(time.time() * 1000)


def test_first_envelope_of_a_partition_links_to_minus_one() -> None:
    env = envelope.decode(_encode([rec(0)], previous_offset=-1))
    assert env.previous_offset == -1
    assert env.first_offset == 0


def test_null_key_and_tombstone_round_trip_as_null() -> None:
    records = [rec(0, key=None, value=b"v"), rec(1, key=b"k", value=None)]
    assert _round_trip(records) == records


def test_empty_bytes_are_not_null() -> None:
    records = [rec(0, key=b"", value=b""), rec(1, key=None, value=None), rec(2, key=b"", value=None)]
    assert _round_trip(records) == records


def test_headers_keep_order_repeats_nulls_and_empties() -> None:
    headers: Headers = [
        ("b", b"1"),
        ("a", b"2"),
        ("b", b"3"),  # repeated key, kept in place
        ("n", None),  # null value
        ("e", b""),  # empty, not null
        ("", b"\x00\xff"),  # empty key, binary value
        ("n", None),
    ]
    records = [rec(0, headers=headers), rec(1), rec(2, headers=[("only", None)])]
    assert _round_trip(records) == records


@pytest.mark.parametrize(
    ("timestamp_ms", "timestamp_type"),
    [
        (1_700_000_000_123, CREATE),
        (1_700_000_000_456, APPEND),
        (-1, NOT_AVAILABLE),
        (0, CREATE),
        (2**62, CREATE),
    ],
)
def test_timestamps_and_types_round_trip(timestamp_ms: int, timestamp_type: int) -> None:
    records = [rec(9, timestamp_ms=timestamp_ms, timestamp_type=timestamp_type)]
    assert _round_trip(records) == records


def test_mixed_timestamp_types_in_one_run_are_kept_per_record() -> None:
    records = [
        rec(0, timestamp_type=CREATE),
        rec(1, timestamp_type=APPEND, timestamp_ms=5),
        rec(3, timestamp_type=CREATE),
    ]
    assert _round_trip(records) == records
    assert list(wire_batch(_encode(records)).timestamp_types) == [CREATE, APPEND, CREATE]


def test_one_timestamp_type_for_all_records_is_stored_once() -> None:
    run = RecordRun(
        offsets=[4, 5, 9], timestamps_ms=[1, 2, 3], timestamp_types=[APPEND], keys=[b"a"] * 3, values=[b"b"] * 3
    )
    data = _encode(run)
    assert list(wire_batch(data).timestamp_types) == [APPEND]
    decoded = envelope.decode(data).run
    assert [decoded.timestamp_type(i) for i in range(3)] == [APPEND] * 3
    assert [s.timestamp_type for s in Seen.of_run(decoded)] == [APPEND] * 3


def test_confluent_timestamp_codes_map_to_distinct_proto_types() -> None:
    assert envelope.TIMESTAMP_TYPES == {
        0: envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE,
        1: envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
        2: envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
    }
    # The wrapper converts codes by adding the shift instead of looking them up.
    assert all(proto == code + envelope.TIMESTAMP_TYPE_SHIFT for code, proto in envelope.TIMESTAMP_TYPES.items())


def test_large_and_binary_values_round_trip_byte_for_byte() -> None:
    rng = random.Random(7)
    records = [rec(5, key=bytes(range(256)), value=rng.randbytes(3 * 1024 * 1024)), rec(6, value=b"small")]
    assert _round_trip(records) == records


def test_many_records_keep_offsets_and_order() -> None:
    offsets = [3, 4, 6, 10, 11, 1000, 1001, 2**40]
    records = [rec(o, value=str(o).encode()) for o in offsets]
    env = envelope.decode(_encode(records, previous_offset=1))
    assert list(env.run.offsets) == offsets
    assert Seen.of_run(env.run) == records


def test_encode_refuses_an_empty_run_or_batch() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        _encode([])
    with pytest.raises(ValueError, match="at least one record"):
        envelope.encode_batch(SRC, 0, envelope_pb2.RecordBatch(), wrapper_id="w", wrapper_epoch=1)


# ---------------------------------------------------------------- null keys and values in the columnar form


@pytest.mark.parametrize("column", ["key", "value"])
@pytest.mark.parametrize(
    ("entries", "stored", "nulls"),
    [
        ([b"a", b"b", b"c"], [b"a", b"b", b"c"], []),
        ([None, None, None], [], []),  # all null: the column is left out
        ([b"", b"", b""], [b"", b"", b""], []),  # all empty: a column of empties, not nulls
        ([None, b"", b"c"], [b"", b"", b"c"], [0]),
        ([b"a", None, b"c"], [b"a", b"", b"c"], [1]),
        ([b"a", None, None], [b"a", b"", b""], [1, 2]),
    ],
    ids=["no-null", "all-null", "all-empty", "first-null", "middle-null", "trailing-nulls"],
)
def test_nulls_are_written_sparsely_and_read_back_as_null(
    column: str, entries: list[bytes | None], stored: list[bytes], nulls: list[int]
) -> None:
    records = [
        rec(o, key=e, value=b"x") if column == "key" else rec(o, key=b"x", value=e) for o, e in enumerate(entries)
    ]
    batch = wire_batch(_encode(records))
    written, written_nulls = (batch.keys, batch.null_keys) if column == "key" else (batch.values, batch.null_values)
    other, other_nulls = (batch.values, batch.null_values) if column == "key" else (batch.keys, batch.null_keys)
    assert (list(written), list(written_nulls)) == (stored, nulls)
    assert (list(other), list(other_nulls)) == ([b"x"] * 3, [])
    assert _round_trip(records) == records


def test_all_null_keys_and_values_round_trip() -> None:
    # Tombstones of null-keyed records: neither column is written.
    records = [rec(o, key=None, value=None) for o in (0, 2, 3)]
    batch = wire_batch(_encode(records))
    assert not (batch.keys or batch.values or batch.null_keys or batch.null_values)
    assert _round_trip(records) == records


def test_header_column_spreads_the_sparse_headers_over_the_records() -> None:
    run = RecordRun(
        offsets=[1, 2, 3, 4],
        timestamps_ms=[0] * 4,
        timestamp_types=[CREATE],
        keys=[None] * 4,
        values=[None] * 4,
        headers=[(1, [("a", b"1")]), (3, [("b", None)])],
    )
    assert run.header_column() == [None, [("a", b"1")], None, [("b", None)]]
    assert RecordRun([1], [0], [CREATE], [None], [None]).header_column() is None
    assert list(wire_batch(_encode(run)).headers) == [
        envelope_pb2.RecordHeaders(index=1, headers=[envelope_pb2.Header(key="a", value=b"1")]),
        envelope_pb2.RecordHeaders(index=3, headers=[envelope_pb2.Header(key="b")]),
    ]


# ---------------------------------------------------------------- the row form of 0.1 wrappers


def test_row_form_written_by_0_1_wrappers_still_decodes() -> None:
    records = [
        rec(41, key=None, value=b"v"),
        rec(42, key=b"k", value=None),
        rec(44, key=b"", value=b"", timestamp_type=APPEND, timestamp_ms=7),
        rec(45, key=None, value=None, headers=[("h", b"1"), ("h", None), ("e", b"")]),
        rec(90, key=bytes(range(256)), timestamp_type=NOT_AVAILABLE, timestamp_ms=-1),
        rec(91, timestamp_type=envelope_pb2.TIMESTAMP_TYPE_UNSPECIFIED),
    ]
    data = envelope.encode_batch(
        SRC,
        40,
        envelope_pb2.RecordBatch(records=[_row(r) for r in records]),
        wrapper_id="wrapper-0.1",
        wrapper_epoch=2,
    )
    env = envelope.decode(data)
    assert Seen.of_run(env.run) == records
    assert (env.previous_offset, env.first_offset, env.last_offset) == (40, 41, 91)
    assert (env.source, env.wrapper_id, env.wrapper_epoch) == (SRC, "wrapper-0.1", 2)


@pytest.mark.parametrize("offsets", [[5, 5], [5, 7, 6]], ids=["repeated", "decreasing"])
def test_row_form_with_offsets_out_of_order_is_refused(offsets: list[int]) -> None:
    batch = envelope_pb2.RecordBatch(records=[_row(rec(o)) for o in offsets])
    with pytest.raises(EnvelopeError, match="offsets are not strictly increasing"):
        envelope.decode(envelope.encode_batch(SRC, 4, batch, wrapper_id="w", wrapper_epoch=1))


@pytest.mark.parametrize("column", ["offsets", "base_offset", "timestamps_ms", "keys", "values", "headers"])
def test_a_batch_holding_both_forms_is_refused(column: str) -> None:
    """Rows plus any columnar field (not only offsets) is refused: no column is silently ignored."""
    columnar = envelope.batch_of(run_of_seen([rec(1, headers=[("h", b"1")]), rec(3)]))  # a hole: offsets listed
    batch = envelope_pb2.RecordBatch(records=[_row(rec(1)), _row(rec(2))])
    if column == "base_offset":
        batch.base_offset = 1
    else:
        getattr(batch, column).extend(getattr(columnar, column))
    with pytest.raises(EnvelopeError, match="both the row and the columnar form"):
        envelope.decode(envelope.encode_batch(SRC, 0, batch, wrapper_id="w", wrapper_epoch=1))


# ---------------------------------------------------------------- inconsistent columns


def _columns(**changes: object) -> envelope_pb2.RecordBatch:
    """A consistent three-record columnar batch, with changes."""
    fields: dict[str, object] = {
        "offsets": [10, 11, 13],
        "timestamps_ms": [1, 2, 3],
        "timestamp_types": [CREATE],
        "keys": [b"a", b"b", b"c"],
        "values": [b"x", b"y", b"z"],
    }
    return envelope_pb2.RecordBatch(**(fields | changes))  # type: ignore[arg-type]


def _headers_at(*indexes: int) -> list[envelope_pb2.RecordHeaders]:
    return [envelope_pb2.RecordHeaders(index=i, headers=[envelope_pb2.Header(key="h")]) for i in indexes]


def test_the_consistent_batch_decodes() -> None:
    run = envelope.decode(_envelope_around(_columns(headers=_headers_at(0, 2)))).run
    assert (list(run.offsets), run.header_column()) == ([10, 11, 13], [[("h", None)], None, [("h", None)]])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"timestamps_ms": [1, 2]}, "inconsistent columnar batch: 3 offsets, 2 timestamps, 1 timestamp types"),
        ({"timestamps_ms": [1, 2, 3, 4]}, "3 offsets, 4 timestamps"),
        ({"timestamp_types": [CREATE, APPEND]}, "2 timestamp types"),
        ({"timestamp_types": []}, "0 timestamp types"),
        ({"keys": [b"a", b"b"]}, "2 keys, 3 values"),
        ({"values": [b"x", b"y", b"z", b"w"]}, "3 keys, 4 values"),
        ({"offsets": [10, 10, 13]}, "offsets are not strictly increasing"),
        ({"offsets": [10, 13, 11]}, "offsets are not strictly increasing"),
        ({"null_keys": [3]}, "null index out of range"),
        ({"null_values": [0, -1]}, "null index out of range"),
        ({"headers": _headers_at(3)}, "header index 3 out of order or range"),
        ({"headers": _headers_at(-1)}, "header index -1 out of order or range"),
        ({"headers": _headers_at(2, 1)}, "header index 1 out of order or range"),
        ({"headers": _headers_at(1, 1)}, "header index 1 out of order or range"),
        ({"base_offset": 10}, "gives both offsets and a base offset"),
        ({"offsets": [], "base_offset": -1}, "base offset -1 is negative"),
        ({"offsets": [], "base_offset": 10, "keys": [b"a"]}, "3 offsets, 3 timestamps, 1 timestamp types, 1 keys"),
    ],
    ids=[
        "timestamps-short",
        "timestamps-long",
        "types-neither-one-nor-all",
        "types-missing",
        "keys-short",
        "values-long",
        "offsets-repeated",
        "offsets-decreasing",
        "null-key-past-the-end",
        "null-value-negative",
        "header-index-past-the-end",
        "header-index-negative",
        "header-indexes-out-of-order",
        "header-index-repeated",
        "offsets-and-base-offset",
        "base-offset-negative",
        "consecutive-form-keys-short",
    ],
)
def test_inconsistent_columns_are_an_envelope_error(changes: dict[str, object], message: str) -> None:
    with pytest.raises(EnvelopeError, match=message):
        envelope.decode(_envelope_around(_columns(**changes)))
    with pytest.raises(EnvelopeError, match=message):
        envelope.run_of(_columns(**changes))


def test_columns_without_offsets_are_consecutive_from_the_base_offset() -> None:
    run = envelope.decode(_envelope_around(_columns(offsets=[], base_offset=41))).run
    assert list(run.offsets) == [41, 42, 43]
    assert list(envelope.run_of(_columns(offsets=[])).offsets) == [0, 1, 2]


def test_columns_without_offsets_or_timestamps_are_an_envelope_without_records() -> None:
    with pytest.raises(EnvelopeError, match="without records"):
        envelope.decode(_envelope_around(_columns(offsets=[], timestamps_ms=[])))
    with pytest.raises(EnvelopeError, match="0 offsets"):
        envelope.run_of(_columns(offsets=[], timestamps_ms=[]))


@pytest.mark.parametrize("start", [0, 1, 2**40])
def test_a_run_without_holes_is_stored_as_its_base_offset(start: int) -> None:
    offsets = [start + i for i in range(5)]
    data = _encode([rec(o) for o in offsets])
    batch = wire_batch(data)
    assert (list(batch.offsets), batch.base_offset) == ([], start)
    assert list(envelope.decode(data).run.offsets) == offsets


def test_a_run_with_holes_lists_its_offsets() -> None:
    data = _encode([rec(o) for o in (7, 8, 10)])
    batch = wire_batch(data)
    assert (list(batch.offsets), batch.base_offset) == ([7, 8, 10], 0)
    assert list(envelope.decode(data).run.offsets) == [7, 8, 10]


def test_a_run_whose_offsets_are_a_range_round_trips() -> None:
    run = RecordRun(
        offsets=range(3, 6), timestamps_ms=[1, 2, 3], timestamp_types=[CREATE], keys=[b"k"] * 3, values=[b"v"] * 3
    )
    env = envelope.decode(envelope.encode(SRC, 2, run, wrapper_id="w", wrapper_epoch=1))
    assert (list(env.run.offsets), env.first_offset, env.last_offset) == ([3, 4, 5], 3, 5)


def test_a_wrong_record_count_is_an_envelope_error() -> None:
    env = envelope_pb2.Envelope.FromString(_encode([rec(1), rec(2), rec(3)]))
    env.record_count = 5
    with pytest.raises(EnvelopeError, match="envelope says 5 records but holds 3"):
        envelope.decode(env.SerializeToString())


# ---------------------------------------------------------------- corruption and malformed input


def _corrupt_records(data: bytes, mutate: bytes) -> bytes:
    env = envelope_pb2.Envelope.FromString(data)
    env.records = mutate
    return env.SerializeToString()


def test_flipped_bit_in_the_records_is_a_corrupt_envelope() -> None:
    data = _encode([rec(1, value=b"payload-abc", headers=[("h", None)]), rec(2, key=None)])
    env = envelope_pb2.Envelope.FromString(data)
    for i in range(len(env.records)):
        flipped = bytearray(env.records)
        flipped[i] ^= 0x01
        with pytest.raises(CorruptEnvelopeError, match="checksum mismatch"):
            envelope.decode(_corrupt_records(data, bytes(flipped)))


def test_wrong_checksum_field_is_a_corrupt_envelope() -> None:
    env = envelope_pb2.Envelope.FromString(_encode([rec(1)]))
    env.records_crc32c ^= 0x8000_0000
    with pytest.raises(CorruptEnvelopeError):
        envelope.decode(env.SerializeToString())


def test_envelopes_carry_crc32c_of_their_records() -> None:
    env = envelope_pb2.Envelope.FromString(_encode([rec(1), rec(2)]))
    assert env.HasField("records_crc32c")
    assert env.records_crc32c == google_crc32c.value(env.records)
    assert env.records_crc32 == 0  # the legacy field is not written beside it
    assert envelope.CHECKSUM == "CRC-32C"  # the wheel's C extension: the fast path runs here


def _legacy(data: bytes) -> envelope_pb2.Envelope:
    """An envelope as wrappers before records_crc32c wrote it: CRC-32 (IEEE) only."""
    env = envelope_pb2.Envelope.FromString(data)
    env.ClearField("records_crc32c")
    env.records_crc32 = zlib.crc32(env.records)
    return env


def test_envelopes_with_the_legacy_crc32_still_verify() -> None:
    # Staging written by older wrappers is read after an upgrade of the dedupers.
    records = [rec(1, value=b"old"), rec(2, key=None)]
    decoded = envelope.decode(_legacy(_encode(records)).SerializeToString())
    assert Seen.of_run(decoded.run) == records


def test_a_wrong_legacy_crc32_is_a_corrupt_envelope() -> None:
    env = _legacy(_encode([rec(1)]))
    env.records_crc32 ^= 1
    with pytest.raises(CorruptEnvelopeError, match="checksum mismatch"):
        envelope.decode(env.SerializeToString())


def test_without_the_c_extension_wrappers_write_the_legacy_crc32(monkeypatch: pytest.MonkeyPatch) -> None:
    # google-crc32c's pure-Python fallback is far too slow for the data path; zlib's CRC-32 is not.
    monkeypatch.setattr(envelope, "crc32c", None)
    data = _encode([rec(7, value=b"v7")])
    env = envelope_pb2.Envelope.FromString(data)
    assert not env.HasField("records_crc32c")
    assert env.records_crc32 == zlib.crc32(env.records)
    assert Seen.of_run(envelope.decode(data).run) == [rec(7, value=b"v7")]
    # ... and envelopes that do carry CRC-32C still verify there, through the fallback.
    monkeypatch.undo()
    crc32c_data = _encode([rec(8)])
    monkeypatch.setattr(envelope, "crc32c", None)
    assert Seen.of_run(envelope.decode(crc32c_data).run) == [rec(8)]


def test_corrupt_envelope_is_an_envelope_error() -> None:
    # Callers that catch EnvelopeError (poison staging records) also catch corruption.
    assert issubclass(CorruptEnvelopeError, EnvelopeError)


@pytest.mark.parametrize("data", [None, b""], ids=["none", "empty"])
def test_missing_staging_value_is_an_envelope_error(data: bytes | None) -> None:
    with pytest.raises(EnvelopeError, match="empty staging record"):
        envelope.decode(data)


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff garbage", b"\x0a\xff\xff\xff\xff\x0f", b"\x80", b"not an envelope at all, just text"],
)
def test_garbage_bytes_are_an_envelope_error(data: bytes) -> None:
    with pytest.raises(EnvelopeError):
        envelope.decode(data)


def test_envelope_without_records_is_an_envelope_error() -> None:
    env = envelope_pb2.Envelope(source=SRC, previous_offset=4, records=b"", records_crc32=zlib.crc32(b""))
    with pytest.raises(EnvelopeError, match="without records"):
        envelope.decode(env.SerializeToString())


def test_envelope_without_source_topic_is_an_envelope_error() -> None:
    with pytest.raises(EnvelopeError, match="without a source topic"):
        envelope.decode(_envelope_around(_columns(), envelope_pb2.SourcePartition(partition=1)))


def test_records_that_do_not_parse_are_an_envelope_error() -> None:
    payload = b"\x0a\xff\xff\xff\xff\x0f"  # a length prefix far beyond the payload
    env = envelope_pb2.Envelope(source=SRC, records=payload, records_crc32=zlib.crc32(payload))
    with pytest.raises(EnvelopeError, match="do not parse"):
        envelope.decode(env.SerializeToString())


def _flip_bits(rng: random.Random, data: bytes) -> bytes:
    """data with one to three random bits flipped."""
    mangled = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        mangled[rng.randrange(len(mangled))] ^= 1 << rng.randrange(8)
    return bytes(mangled)


def _assert_consistent(run: RecordRun) -> None:
    n = len(run)
    assert n >= 1
    assert len(run.timestamps_ms) == len(run.keys) == len(run.values) == n
    assert len(run.timestamp_types) in (1, n)
    assert all(a < b for a, b in zip(run.offsets, run.offsets[1:], strict=False))
    indexes = [i for i, _ in run.headers]
    assert indexes == sorted(set(indexes)) and all(0 <= i < n for i in indexes)


def test_random_and_mangled_bytes_only_ever_raise_envelope_errors() -> None:
    """Whatever lands on the staging topic, decode fails with our error or returns records."""
    rng = random.Random(1234)
    good = _encode([rec(5, value=b"abc"), rec(9, key=None, headers=[("h", b"")])], previous_offset=4)
    for _ in range(3000):
        mode = rng.random()
        if mode < 0.4:
            data = rng.randbytes(rng.randint(1, 80))
        elif mode < 0.7:
            data = _flip_bits(rng, good)
        else:
            data = good[: rng.randrange(1, len(good))]
        try:
            env = envelope.decode(data)
        except EnvelopeError:
            continue
        _assert_consistent(env.run)
        assert env.source.topic


@pytest.mark.parametrize("form", ["columnar", "rows"])
def test_mangled_batches_with_a_valid_checksum_are_refused_or_consistent(form: str) -> None:
    """Past the checksum, run_of is what stands between a bad batch and the destination."""
    records = [
        rec(3, key=None, headers=[("a", None)]),
        rec(4, value=None, timestamp_type=APPEND),
        rec(8, key=b"", value=b"", headers=[("b", b"1"), ("c", b"")]),
        rec(9),
    ]
    if form == "columnar":
        batch = envelope.batch_of(run_of_seen(records))
    else:
        batch = envelope_pb2.RecordBatch(records=[_row(r) for r in records])
    good = batch.SerializeToString()
    rng = random.Random(form)
    for _ in range(3000):
        try:
            decoded = envelope.decode(_envelope_around(_flip_bits(rng, good)))
        except EnvelopeError:
            continue
        _assert_consistent(decoded.run)


# ---------------------------------------------------------------- staging partition map


def _topic_names(n: int) -> list[str]:
    rng = random.Random(99)
    alphabet = string.ascii_letters + string.digits + "._-"
    names = ["a", "orders", "__consumer_offsets", "x" * 249, "ünïcode-topic"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(n)]
    return names


def test_staging_partition_known_values_never_change() -> None:
    # The map is part of the on-disk contract: a change would split one source
    # partition's envelopes over two staging partitions across an upgrade.
    assert envelope.staging_partition("orders", 0, 12) == zlib.crc32(b"orders") % 12
    assert envelope.staging_partition("orders", 5, 12) == (zlib.crc32(b"orders") + 5) % 12
    assert envelope.staging_partition("orders", 0, 1) == 0


@pytest.mark.parametrize("staging_partitions", [1, 2, 3, 12, 50, 997])
def test_staging_partition_is_deterministic_and_in_range(staging_partitions: int) -> None:
    for topic in _topic_names(200):
        for partition in (0, 1, 2, 11, 12, 13, 499, 10_000):
            sp = envelope.staging_partition(topic, partition, staging_partitions)
            assert 0 <= sp < staging_partitions
            assert sp == envelope.staging_partition(topic, partition, staging_partitions)


@pytest.mark.parametrize("staging_partitions", [2, 6, 12, 50])
def test_consecutive_partitions_of_a_topic_spread_over_the_staging_topic(staging_partitions: int) -> None:
    for topic in _topic_names(200):
        first = envelope.staging_partition(topic, 0, staging_partitions)
        for count in (2, staging_partitions // 2, staging_partitions, 3 * staging_partitions):
            parts = [envelope.staging_partition(topic, p, staging_partitions) for p in range(count)]
            # Consecutive source partitions take consecutive staging partitions...
            assert parts == [(first + p) % staging_partitions for p in range(count)]
            # ...so up to staging_partitions of them never share one, and beyond that they balance.
            per_staging = [parts.count(s) for s in range(staging_partitions)]
            assert max(per_staging) - min(per_staging) <= 1


def test_different_topics_start_on_different_staging_partitions() -> None:
    # Many one-partition topics must not all pile onto staging partition 0.
    firsts = {envelope.staging_partition(t, 0, 12) for t in _topic_names(300)}
    assert len(firsts) == 12
