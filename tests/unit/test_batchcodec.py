"""The compiled fast path of the envelope codec (ferryman._batchcodec) against the protobuf library.

The library stays the reference: whatever the compiled path writes must parse
to what the pure-Python path writes, whatever it reads must read as the library
reads it, and whatever it does not understand it must hand back (None) rather
than guess.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from confluent_kafka import KafkaError, Message
from ferryman import _batchcodec, envelope
from ferryman.envelope import RecordRun
from ferryman.errors import EnvelopeError
from ferryman.v1 import envelope_pb2

from tests.unit._fakes import (
    ALL_TS_TYPES,
    TS_CREATE_TIME,
    TS_LOG_APPEND_TIME,
    FakeMessage,
    as_messages,
    random_messages,
    sparse_offsets,
)

APPEND = envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME


def test_the_services_run_the_compiled_codec() -> None:
    """The build compiled it: a silent fall-back to the pure-Python path would cost ~0.2 us per record."""
    assert envelope.batchcodec is _batchcodec
    assert envelope.CODEC == "compiled"


def test_this_confluent_kafka_messages_are_read_directly() -> None:
    """The import-time layout check passed for the pinned confluent-kafka: a silent fall-back to the
    accessors would cost ~0.3 us per record. If an upgrade fails this, compare the Message struct in
    its src/confluent_kafka/src/confluent_kafka.h with the one _batchcodec.pyx declares."""
    assert _batchcodec.DIRECT_MESSAGE_READS


class _SubclassedMessage(Message):
    """Not exactly a Message: the codec may not assume its layout, so it calls the accessors."""


def _subclassed(msgs: list[Message]) -> list[Message]:
    return [
        _SubclassedMessage(
            topic=m.topic(),
            partition=m.partition(),
            offset=m.offset(),
            key=m.key(),
            value=m.value(),
            headers=m.headers(),
            timestamp=m.timestamp(),
        )
        for m in msgs
    ]


@pytest.mark.parametrize("seed", range(20))
def test_direct_reads_encode_exactly_as_the_accessors(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    msgs = as_messages(random_messages(rng, sparse_offsets(rng, n) if seed % 2 else range(1000, 1000 + n)))
    assert _batchcodec.encode_messages(msgs, 0, len(msgs)) == _batchcodec.encode_messages(
        _subclassed(msgs), 0, len(msgs)
    )


def test_direct_reads_of_mixed_messages_encode_exactly_as_the_accessors() -> None:
    msgs = as_messages([FakeMessage(o, headers_=[("h", b"%d" % o)] if o % 3 else None) for o in range(10)])
    mixed = [m if i % 2 else _subclassed([m])[0] for i, m in enumerate(msgs)]
    assert _batchcodec.encode_messages(mixed, 0, 10) == _batchcodec.encode_messages(msgs, 0, 10)


def test_partition_chunks_are_the_runs_of_one_topic_partition() -> None:
    msgs = [
        Message(topic=topic, partition=partition, offset=offset, value=b"v", timestamp=(1, 0))
        for topic, partition, offset in [("a", 0, 5), ("a", 0, 6), ("a", 1, 0), ("b", 1, 0), ("b", 1, 1), ("a", 0, 7)]
    ]
    assert _batchcodec.partition_chunks(msgs) == [("a", 0, 0, 2), ("a", 1, 2, 3), ("b", 1, 3, 5), ("a", 0, 5, 6)]
    assert _batchcodec.partition_chunks([]) == []


def test_batch_flags_read_other_types_through_the_accessors() -> None:
    msgs = as_messages([FakeMessage(o, headers_=[("h", b"x")] if o == 2 else None) for o in range(4)])
    for batch in (msgs, _subclassed(msgs)):
        assert _batchcodec.batch_flags(batch) == _batchcodec.BATCH_HEADERS
        assert _batchcodec.batch_flags(batch[:2]) == 0
    event = _SubclassedMessage(topic="a", partition=0, error=KafkaError(KafkaError._PARTITION_EOF))
    assert _batchcodec.batch_flags([*msgs[:2], event]) == _batchcodec.BATCH_ERRORS


def test_partition_chunks_leave_error_events_and_other_types_to_the_accessors() -> None:
    msgs = [Message(topic="a", partition=0, offset=o, value=b"v", timestamp=(1, 0)) for o in range(3)]
    assert not _batchcodec.has_error_events(msgs)
    assert _batchcodec.partition_chunks(_subclassed(msgs)) is None
    msgs[1].set_error(KafkaError(KafkaError._PARTITION_EOF))
    assert _batchcodec.has_error_events(msgs)
    event = _SubclassedMessage(topic="a", partition=0, error=KafkaError(KafkaError._PARTITION_EOF))
    assert _batchcodec.has_error_events([*_subclassed(msgs[:1]), event])  # read through error()
    assert _batchcodec.partition_chunks(msgs) is None


def _python_payload(msgs: list[FakeMessage]) -> bytes:
    """What the pure-Python path writes for the same records (one timestamp type when all agree, as it does)."""
    types = [envelope.TIMESTAMP_TYPES.get(m.timestamp_type, 0) for m in msgs]
    return envelope.payload_of(
        RecordRun(
            offsets=[m.offset() for m in msgs],
            timestamps_ms=[m.timestamp_ms for m in msgs],
            timestamp_types=types if len(set(types)) > 1 else types[:1],
            keys=[m.key() for m in msgs],
            values=[m.value() for m in msgs],
            headers=[(i, h) for i, m in enumerate(msgs) if (h := m.headers())],
        )
    )


def _encode(msgs: list[FakeMessage], lo: int = 0, hi: int | None = None) -> bytes:
    encoded = _batchcodec.encode_messages(as_messages(msgs), lo, len(msgs) if hi is None else hi)
    assert encoded is not None
    data, header_count = encoded
    assert header_count == sum(len(m.headers() or ()) for m in msgs[lo:hi])
    return data


def _library_run(payload: bytes) -> RecordRun:
    return envelope.run_of(envelope_pb2.RecordBatch.FromString(payload))


def _expanded(run: RecordRun) -> tuple[object, ...]:
    """A run's contents with one timestamp type per record (the form a batch stores them in may differ)."""
    types = [run.timestamp_type(i) for i in range(len(run))]
    return (list(run.offsets), list(run.timestamps_ms), types, list(run.keys), list(run.values), list(run.headers))


@pytest.mark.parametrize("seed", range(80))
def test_encoding_parses_to_what_the_library_writes(seed: int) -> None:
    rng = random.Random(seed)
    msgs = random_messages(
        rng,
        sparse_offsets(rng, rng.randint(1, 200), start=rng.choice([0, 1, 7, 2**40, 2**62])),
        max_len=rng.choice([1, 40, 300]),
        null_rate=rng.choice([0.0, 0.1, 0.6, 1.0]),
        empty_rate=rng.choice([0.0, 0.1, 0.4]),
        header_rate=rng.choice([0.0, 0.3, 1.0]),
        timestamp_types=rng.choice([ALL_TS_TYPES, (TS_CREATE_TIME,), (TS_LOG_APPEND_TIME,), (5,)]),
    )
    lo = rng.randint(0, len(msgs) - 1)
    hi = rng.randint(lo + 1, len(msgs))
    data = _encode(msgs, lo, hi)
    assert _expanded(_library_run(data)) == _expanded(_library_run(_python_payload(msgs[lo:hi])))


def test_a_uniform_run_encodes_byte_for_byte_as_the_library_does() -> None:
    msgs = [FakeMessage(o, b"k%d" % o, b"v" * o, timestamp_ms=1_700_000_000_000 + o) for o in range(100, 160)]
    msgs[0] = replace(msgs[0], headers_=[("", b""), ("trace", None), ("k\u00e9y", b"v")])
    msgs[7] = replace(msgs[7], headers_=[("a", b"1"), ("a", b"2")])
    assert _encode(msgs) == _python_payload(msgs)


def test_negative_timestamps_and_offset_zero_survive() -> None:
    msgs = [FakeMessage(0, timestamp_ms=-1, timestamp_type=0), FakeMessage(1, timestamp_ms=-(2**62))]
    run = _library_run(_encode(msgs))
    assert list(run.offsets) == [0, 1]
    assert list(run.timestamps_ms) == [-1, -(2**62)]


def test_an_empty_headers_list_is_no_headers() -> None:
    run = _library_run(_encode([FakeMessage(0, headers_=[]), FakeMessage(1, headers_=[("h", b"1")])]))
    assert list(run.headers) == [(1, [("h", b"1")])]


@pytest.mark.parametrize(
    ("key", "value"),
    [("text-key", b"v"), (b"k", "text-value"), (b"k", bytearray(b"v"))],
    ids=["key", "value", "buffer"],
)
def test_keys_and_values_of_another_type_are_left_to_the_pure_python_path(key: object, value: object) -> None:
    msg = as_messages([FakeMessage(0)])[0]
    odd = Message(topic="orders", partition=3, offset=1, key=key, value=value, timestamp=(1, 5))  # type: ignore[arg-type]
    assert _batchcodec.encode_messages([msg, odd], 0, 1) is not None
    assert _batchcodec.encode_messages([msg, odd], 0, 2) is None


@pytest.mark.parametrize("headers", [[("h", "text")], [(b"h", b"1")], [("h", b"1", b"2")]], ids=str)
def test_headers_of_another_shape_are_left_to_the_pure_python_path(headers: list[object]) -> None:
    msg = as_messages([FakeMessage(0)])[0]
    odd = Message(topic="orders", partition=3, offset=1, value=b"v", headers=headers, timestamp=(1, 5))  # type: ignore[arg-type]
    assert _batchcodec.encode_messages([msg, odd], 0, 1) is not None
    assert _batchcodec.encode_messages([msg, odd], 0, 2) is None


@pytest.mark.parametrize(("lo", "hi"), [(0, 0), (2, 1), (-1, 1), (0, 4)])
def test_a_bad_slice_is_refused(lo: int, hi: int) -> None:
    with pytest.raises(ValueError, match="bad slice"):
        _batchcodec.encode_messages(as_messages([FakeMessage(0), FakeMessage(1), FakeMessage(2)]), lo, hi)


# ---------------------------------------------------------------- decoding


def _batches(rng: random.Random) -> envelope_pb2.RecordBatch:
    """A columnar RecordBatch as the pure-Python path writes it, headers included."""
    msgs = random_messages(
        rng,
        sparse_offsets(rng, rng.randint(1, 60), start=rng.choice([0, 5, 2**40])),
        null_rate=rng.choice([0.0, 0.2, 1.0]),
        header_rate=rng.choice([0.0, 0.3]),
    )
    run = RecordRun(
        offsets=[m.offset() for m in msgs],
        timestamps_ms=[m.timestamp_ms for m in msgs],
        timestamp_types=[envelope.TIMESTAMP_TYPES.get(m.timestamp_type, 0) for m in msgs],
        keys=[m.key() for m in msgs],
        values=[m.value() for m in msgs],
        headers=[(i, h) for i, m in enumerate(msgs) if (h := m.headers()) is not None],
    )
    return envelope.batch_of(run)


@pytest.mark.parametrize("seed", range(60))
def test_decoding_reads_what_the_library_reads(seed: int) -> None:
    payload = _batches(random.Random(seed)).SerializeToString()
    assert _batchcodec.decode_columns(payload) is not None
    assert _expanded(envelope.run_of_payload(payload)) == _expanded(_library_run(payload))


def _outcome(read: object, payload: bytes) -> object:
    try:
        return _expanded(read(payload))  # type: ignore[operator]
    except EnvelopeError:
        return "refused"


def test_damaged_bytes_are_read_or_refused_exactly_as_the_library_does() -> None:
    """Property: truncated or bit-flipped batches never crash the compiled path nor read differently.

    Many damaged batches still parse (a flipped bit in a value, a cut at a
    field boundary): the compiled path must read those itself, as the count
    shows, and agree with the library on every one.
    """

    def library(data: bytes) -> RecordRun:
        try:
            return _library_run(data)
        except Exception as exc:  # DecodeError: the library's refusal
            raise EnvelopeError(str(exc)) from exc

    read_by_compiled_path = 0
    for seed in range(400):
        rng = random.Random(seed)
        damaged = bytearray(_batches(rng).SerializeToString())
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.3:
                del damaged[rng.randrange(len(damaged)) :]
            if damaged:
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        payload = bytes(damaged)
        read_by_compiled_path += _batchcodec.decode_columns(payload) is not None
        assert _outcome(envelope.run_of_payload, payload) == _outcome(library, payload), f"seed {seed}"
    assert read_by_compiled_path >= 100


def test_the_row_form_is_left_to_the_library() -> None:
    batch = envelope_pb2.RecordBatch(records=[envelope_pb2.Record(offset=3, value=b"v")])
    payload = batch.SerializeToString()
    assert _batchcodec.decode_columns(payload) is None
    assert list(envelope.run_of_payload(payload).offsets) == [3]


def test_unpacked_scalars_are_left_to_the_library() -> None:
    """Protobuf readers accept repeated scalars unpacked too; the compiled path hands those over."""
    payload = bytes([0x18, 0x05, 0x18, 0x06, 0x20, 0x02, 0x50, 0x09])  # timestamps 5, 6; type 2; base offset 9
    assert _batchcodec.decode_columns(payload) is None
    run = envelope.run_of_payload(payload)
    assert (list(run.offsets), list(run.timestamps_ms)) == ([9, 10], [5, 6])


def test_an_unknown_field_is_skipped_as_the_library_skips_it() -> None:
    batch = envelope_pb2.RecordBatch(base_offset=4, timestamps_ms=[1], timestamp_types=[APPEND], values=[b"v"])
    unknown = bytes([0xFA, 0x01, 0x02, 0xAB, 0xCD])  # field 31, length-delimited, 2 bytes
    payload = batch.SerializeToString() + unknown
    assert _batchcodec.decode_columns(payload) is not None
    assert _expanded(envelope.run_of_payload(payload)) == _expanded(_library_run(payload))


def test_fields_split_over_several_occurrences_are_joined() -> None:
    """Serialized messages concatenate: repeated fields written twice read as one list."""
    first = envelope_pb2.RecordBatch(timestamps_ms=[1, 2], values=[b"a", b"b"], timestamp_types=[APPEND])
    second = envelope_pb2.RecordBatch(timestamps_ms=[3], values=[b"c"], base_offset=10)
    payload = first.SerializeToString() + second.SerializeToString()
    run = envelope.run_of_payload(payload)
    assert (list(run.offsets), list(run.values)) == ([10, 11, 12], [b"a", b"b", b"c"])
    assert _expanded(run) == _expanded(_library_run(payload))
