"""Packing consumed records into envelopes (ferryman_wrapper._envelopes.build_envelopes)."""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import replace

import pytest
from confluent_kafka import KafkaError, Message
from ferryman import envelope
from ferryman.envelope import Headers
from ferryman.errors import FerrymanError
from ferryman.v1 import envelope_pb2
from ferryman_wrapper._envelopes import BatchFlags, BuiltEnvelope, batch_flags, build_envelopes, partition_runs

from tests.unit._fakes import (
    ALL_TS_TYPES,
    TS_CREATE_TIME,
    TS_LOG_APPEND_TIME,
    TS_NOT_AVAILABLE,
    FakeMessage,
    Seen,
    as_messages,
    random_messages,
    sparse_offsets,
    wire_batch,
)

pytestmark = pytest.mark.usefixtures("each_codec")

SRC = envelope_pb2.SourcePartition(cluster_id="c-1", topic="orders", topic_id=b"\x07" * 16, partition=3)


def build(
    msgs: list[FakeMessage], previous_offset: int = -1, *, max_records: int = 1000, max_bytes: int = 512 * 1024
) -> list[BuiltEnvelope]:
    return list(
        build_envelopes(
            as_messages(msgs),
            SRC,
            previous_offset,
            wrapper_id="wrapper-a",
            wrapper_epoch=4,
            max_records=max_records,
            max_bytes=max_bytes,
        )
    )


def decoded(built: list[BuiltEnvelope]) -> list[envelope.DecodedEnvelope]:
    return [envelope.decode(b.value) for b in built]


def size_of(msg: FakeMessage) -> int:
    return envelope.record_size(msg.key(), msg.value(), msg.headers())


# ---------------------------------------------------------------- byte-faithful


def test_every_field_survives_byte_for_byte() -> None:
    msgs = [
        FakeMessage(0, None, b"v0"),
        FakeMessage(1, b"k1", None),  # tombstone
        FakeMessage(2, b"", b""),  # empty, not null
        FakeMessage(3, None, None),
        FakeMessage(5, b"\x00\xff", bytes(range(256)), [("h", b"1"), ("h", b"2"), ("n", None), ("e", b"")]),
        FakeMessage(6, b"k", b"v", [], timestamp_ms=42, timestamp_type=TS_LOG_APPEND_TIME),
        FakeMessage(9, b"k", b"v", None, timestamp_ms=-1, timestamp_type=TS_NOT_AVAILABLE),
    ]
    (env,) = decoded(build(msgs, previous_offset=-1))
    assert env.source == SRC
    assert (env.wrapper_id, env.wrapper_epoch) == ("wrapper-a", 4)
    assert Seen.of_run(env.run) == [Seen.of_message(m) for m in msgs]


def test_the_envelope_parses_as_the_protobuf_library_builds_it() -> None:
    # The records are joined to the library-serialized small fields as wire bytes (one copy, instead of
    # upb's encoder over the whole payload): the same message, whatever the field order.
    msgs = [FakeMessage(o, b"k%d" % o, b"v" * o) for o in range(7, 12)]
    (built,) = build(msgs, previous_offset=-1)
    env = envelope_pb2.Envelope.FromString(built.value)
    expected = envelope_pb2.Envelope(
        source=SRC,
        previous_offset=-1,
        records=env.records,
        record_count=5,
        wrapper_id="wrapper-a",
        wrapper_epoch=4,
        wrapped_at_ms=env.wrapped_at_ms,
    )
    if envelope.crc32c is not None:
        expected.records_crc32c = envelope.crc32c(env.records)
    else:
        expected.records_crc32 = zlib.crc32(env.records)
    assert env == expected
    assert envelope_pb2.Envelope.FromString(expected.SerializeToString()) == env
    assert abs(env.wrapped_at_ms - time.time() * 1000) < 60_000


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_record_traces_are_written_into_each_envelope_for_its_own_records() -> None:
    msgs = [FakeMessage(o, None, b"x" * 100) for o in range(10, 30)]
    asked: list[tuple[int, int]] = []

    def traces(after: int, upto: int) -> bytes:
        asked.append((after, upto))
        return envelope.record_traces_suffix([(upto, TRACEPARENT, f"upto={upto}")])

    built = list(
        build_envelopes(
            as_messages(msgs),
            SRC,
            9,
            wrapper_id="wrapper-a",
            wrapper_epoch=4,
            max_records=8,
            max_bytes=512 * 1024,
            record_traces=traces,
        )
    )
    assert asked == [(9, 17), (17, 25), (25, 29)]  # each envelope's own (previous, last]
    for b, (_, upto) in zip(built, asked, strict=True):
        env = envelope.decode(b.value)
        assert env.record_traces == {upto: (TRACEPARENT, f"upto={upto}")}
        assert Seen.of_run(env.run) == [Seen.of_message(m) for m in msgs if upto - b.record_count < m.offset() <= upto]


@pytest.mark.parametrize("others", [[], [FakeMessage(1)]], ids=["alone", "among-known-types"])
def test_unknown_timestamp_type_is_unspecified_not_a_guess(others: list[FakeMessage]) -> None:
    (env,) = decoded(build([FakeMessage(0, timestamp_type=7), *others]))
    assert env.run.timestamp_type(0) == envelope_pb2.TIMESTAMP_TYPE_UNSPECIFIED


def test_large_value_survives() -> None:
    big = random.Random(3).randbytes(2 * 1024 * 1024 + 17)
    built = build([FakeMessage(0, b"k", b"small"), FakeMessage(1, b"k", big)], max_bytes=1024 * 1024)
    assert [b.record_count for b in built] == [1, 1]
    env = decoded(built)[1]
    assert env.run.values == [big]


@pytest.mark.parametrize("seed", range(60))
def test_random_records_round_trip_byte_for_byte(seed: int) -> None:
    """Property: whatever the records, build_envelopes then decode gives them back exactly, chained.

    Each seed also draws the shape of the columns, so that every branch of the
    columnar form is reached: no null at all, sparse nulls, all nulls (the
    column is then left out), one timestamp type for all or mixed types.
    """
    rng = random.Random(seed)
    types = rng.choice([ALL_TS_TYPES, (TS_CREATE_TIME,), (TS_LOG_APPEND_TIME,), (TS_NOT_AVAILABLE,)])
    msgs = random_messages(
        rng,
        sparse_offsets(rng, rng.randint(1, 120), start=rng.choice([0, 1, 7, 2**40])),
        max_len=rng.choice([1, 40, 300]),
        null_rate=rng.choice([0.0, 0.1, 0.6, 1.0]),
        empty_rate=rng.choice([0.0, 0.1, 0.4]),
        header_rate=rng.choice([0.0, 0.3, 1.0]),
        timestamp_types=types,
    )
    previous_offset = max(-1, msgs[0].offset() - rng.randint(1, 3))
    built = build(msgs, previous_offset, max_records=rng.randint(1, 30), max_bytes=rng.choice([1, 200, 2000, 1 << 20]))
    envs = decoded(built)
    assert [s for e in envs for s in Seen.of_run(e.run)] == [Seen.of_message(m) for m in msgs]
    assert [e.previous_offset for e in envs] == [previous_offset] + [b.last_offset for b in built[:-1]]
    if len(types) == 1:
        assert all(len(wire_batch(b.value).timestamp_types) == 1 for b in built)


# ---------------------------------------------------------------- the columnar form as the wrapper writes it


def test_a_source_topic_with_one_timestamp_type_stores_it_once_per_envelope() -> None:
    # The usual case: the type is a property of the source topic (message.timestamp.type).
    msgs = [FakeMessage(o, timestamp_type=TS_LOG_APPEND_TIME) for o in range(10)]
    built = build(msgs, max_records=4)
    append = envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME
    assert [list(wire_batch(b.value).timestamp_types) for b in built] == [[append]] * 3
    assert {s.timestamp_type for e in decoded(built) for s in Seen.of_run(e.run)} == {append}


def test_mixed_timestamp_types_in_one_run_are_kept_per_record() -> None:
    types = [TS_CREATE_TIME, TS_LOG_APPEND_TIME, TS_NOT_AVAILABLE, TS_CREATE_TIME, TS_LOG_APPEND_TIME]
    msgs = [FakeMessage(o, timestamp_type=t) for o, t in enumerate(types)]
    expected = [Seen.of_message(m).timestamp_type for m in msgs]
    (whole,) = build(msgs)
    assert list(wire_batch(whole.value).timestamp_types) == expected
    for max_records in (1, 2, 3):
        envs = decoded(build(msgs, max_records=max_records))
        assert [s.timestamp_type for e in envs for s in Seen.of_run(e.run)] == expected


# ---------------------------------------------------------------- the chain


@pytest.mark.parametrize("previous_offset", [-1, 0, 41, 10**12])
def test_the_chain_links_each_envelope_to_the_last_offset_of_the_one_before(previous_offset: int) -> None:
    offsets = [previous_offset + d for d in (1, 2, 4, 5, 9, 10, 30, 31, 32)]
    built = build([FakeMessage(o) for o in offsets], previous_offset, max_records=2)
    envs = decoded(built)
    assert [e.previous_offset for e in envs] == [previous_offset] + [e.last_offset for e in envs[:-1]]
    assert [b.last_offset for b in built] == [e.last_offset for e in envs]
    assert [b.record_count for b in built] == [len(e.run) for e in envs]
    assert [o for e in envs for o in e.run.offsets] == offsets


def test_nothing_to_pack_builds_nothing() -> None:
    assert build([]) == []


def test_previous_offset_is_passed_through_even_below_a_hole() -> None:
    # After a rewind to a marker the link is next_offset - 1, which is no record.
    (env,) = decoded(build([FakeMessage(12), FakeMessage(13)], previous_offset=10))
    assert env.previous_offset == 10
    assert env.first_offset == 12


# ---------------------------------------------------------------- chunking


@pytest.mark.parametrize(("n", "max_records", "expected"), [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (3, 1, [1, 1, 1])])
def test_chunks_by_max_records(n: int, max_records: int, expected: list[int]) -> None:
    built = build([FakeMessage(i) for i in range(n)], max_records=max_records)
    assert [b.record_count for b in built] == expected


def test_chunks_by_max_bytes() -> None:
    msgs = [FakeMessage(i, b"k", b"x" * 100) for i in range(10)]
    per_record = size_of(msgs[0])
    built = build(msgs, max_bytes=3 * per_record)
    assert [b.record_count for b in built] == [3, 3, 3, 1]
    built = build(msgs, max_bytes=3 * per_record - 1)
    assert [b.record_count for b in built] == [2, 2, 2, 2, 2]


def test_headers_count_towards_the_size_budget() -> None:
    headers: Headers = [("trace", b"x" * 200)]
    plain = [FakeMessage(i, b"k", b"v") for i in range(4)]
    with_headers = [FakeMessage(i, b"k", b"v", headers) for i in range(4)]
    budget = 3 * size_of(plain[0])
    assert [b.record_count for b in build(plain, max_bytes=budget)] == [3, 1]
    assert [b.record_count for b in build(with_headers, max_bytes=budget)] == [1, 1, 1, 1]


def test_a_record_larger_than_max_bytes_gets_its_own_envelope() -> None:
    msgs = [
        FakeMessage(0, b"k", b"a" * 10),
        FakeMessage(1, b"k", b"a" * 10),
        FakeMessage(2, b"k", b"y" * 5000),
        FakeMessage(3, b"k", b"a" * 10),
        FakeMessage(4, b"k", b"z" * 5000),
        FakeMessage(5, b"k", b"z" * 5000),
    ]
    built = build(msgs, max_bytes=1000)
    assert [list(e.run.offsets) for e in decoded(built)] == [[0, 1], [2], [3], [4], [5]]


@pytest.mark.parametrize("first_small", [False, True])
def test_large_records_are_cut_by_size_and_encoded_by_the_compiled_codec(
    each_codec: str, first_small: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records too large for a piece of max_records never go through the protobuf library (issue 29).

    The compiled codec encodes the greedy cuts itself, whether the first record tells at once that a
    piece cannot fit or a piece found too big does; the envelopes are the pure-Python path's.
    """
    msgs = [FakeMessage(i, b"k", b"v" * (10 if first_small and i == 0 else 10_240)) for i in range(300)]
    expected = [list(e.run.offsets) for e in decoded(build(msgs, max_bytes=64 * 1024))]
    assert len(expected) > 40 and all(len(offsets) <= 7 for offsets in expected)
    if each_codec == "compiled":

        def refused(*_args: object, **_kwargs: object) -> bytes:
            raise AssertionError("large records went through the protobuf library")

        monkeypatch.setattr(envelope, "payload_of", refused)
    assert [list(e.run.offsets) for e in decoded(build(msgs, max_bytes=64 * 1024))] == expected


def test_first_oversized_record_is_not_preceded_by_an_empty_envelope() -> None:
    built = build([FakeMessage(0, b"k", b"y" * 5000)], max_bytes=100)
    assert [b.record_count for b in built] == [1]


@pytest.mark.parametrize("seed", range(25))
def test_envelopes_respect_both_limits(seed: int) -> None:
    rng = random.Random(seed)
    msgs = random_messages(rng, sparse_offsets(rng, rng.randint(1, 150)), max_len=rng.choice([10, 100, 500]))
    max_records = rng.randint(1, 20)
    max_bytes = rng.choice([50, 300, 1500, 10_000])
    envs = decoded(build(msgs, rng.randint(-1, 5), max_records=max_records, max_bytes=max_bytes))
    by_offset = {m.offset(): m for m in msgs}
    for env in envs:
        sizes = [size_of(by_offset[o]) for o in env.run.offsets]
        assert 1 <= len(sizes) <= max_records
        assert len(sizes) == 1 or sum(sizes) <= max_bytes
    assert sum(len(e.run) for e in envs) == len(msgs)


@pytest.mark.parametrize("seed", range(25))
def test_envelopes_are_filled_greedily(seed: int) -> None:
    rng = random.Random(seed)
    msgs = [
        replace(m, headers_=None)
        for m in random_messages(rng, sparse_offsets(rng, rng.randint(1, 150)), max_len=rng.choice([10, 100, 500]))
    ]
    max_records = rng.randint(1, 20)
    max_bytes = rng.choice([50, 300, 1500, 10_000])
    envs = decoded(build(msgs, max_records=max_records, max_bytes=max_bytes))
    index = 0
    for env in envs[:-1]:
        sizes = [size_of(m) for m in msgs[index : index + len(env.run)]]
        index += len(sizes)
        # Cut only because the next record did not fit, by count or by size.
        assert len(sizes) == max_records or sum(sizes) + size_of(msgs[index]) > max_bytes


# ------------------------------------------------------------ batch grouping


def _msg(topic: str, partition: int, offset: int) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"v", timestamp=(1, 0))


def test_partition_runs_regroups_interleaved_chunks_in_order() -> None:
    """librdkafka hands out chunks per partition, interleaved; each partition's order must survive."""
    batch = [
        *(_msg("a", 0, o) for o in (0, 1, 2)),
        *(_msg("a", 1, o) for o in (7, 8)),
        *(_msg("b", 0, o) for o in (4,)),  # same partition number, other topic
        *(_msg("a", 0, o) for o in (3, 4)),
        *(_msg("a", 1, o) for o in (9,)),
    ]
    runs = partition_runs(batch)
    assert {k: [m.offset() for m in v] for k, v in runs.items()} == {
        ("a", 0): [0, 1, 2, 3, 4],
        ("a", 1): [7, 8, 9],
        ("b", 0): [4],
    }
    assert list(runs) == [("a", 0), ("a", 1), ("b", 0)]


def test_partition_runs_refuses_a_chunk_that_does_not_continue_its_partition() -> None:
    """Runs are labelled by their ends when they have no hole, so they must be in offset order."""
    batch = [_msg("a", 0, 5), _msg("a", 0, 6), _msg("a", 1, 1), _msg("a", 0, 6), _msg("a", 0, 8)]
    with pytest.raises(FerrymanError, match="a-0 out of offset order: 6 after 6"):
        partition_runs(batch)


@pytest.mark.parametrize("size", [0, 1, 500])
def test_partition_runs_of_one_partition_is_the_batch(size: int) -> None:
    batch = [_msg("t", 3, o) for o in range(size)]
    runs = partition_runs(batch)
    assert runs == ({("t", 3): batch} if size else {})


def test_batch_flags_see_an_error_event_and_a_record_with_headers_anywhere() -> None:
    batch = [_msg("t", 0, o) for o in range(5)]
    maybe = envelope.batchcodec is None  # the pure-Python path does not look: any batch may have headers
    assert batch_flags(batch) == BatchFlags(errors=False, headers=maybe)
    batch[3].set_error(KafkaError(KafkaError._PARTITION_EOF))
    assert batch_flags(batch) == BatchFlags(errors=True, headers=maybe)
    batch[1].set_headers([("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")])
    assert batch_flags(batch) == BatchFlags(errors=True, headers=True)
    assert batch_flags(tuple(batch)) == BatchFlags(errors=True, headers=True)  # no codec: headers may be there
