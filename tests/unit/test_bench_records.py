"""The bench's record format, its C-level generator and its tally: fast paths agree with the plain ones."""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Iterable

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message

from bench.loader import LoadProducer
from bench.readcols import NO_OTHER_TYPE, columns_of
from bench.records import SEQ_MODULUS, decode, keys_of, make_key, make_value, padding, values_of
from bench.verify import Tally


def test_values_and_keys_formatted_in_c_are_the_format_itself() -> None:
    pad = padding(100)
    seqs = [0, 1, 9, 10_000_000, 123_456_789_012]
    for partition in (0, 7, 9999):
        assert list(values_of(partition, seqs, pad)) == [make_value(partition, s, pad) for s in seqs]
    assert list(keys_of(seqs)) == [make_key(s) for s in seqs]
    assert len(make_value(3, 5, pad)) == 100


def test_a_percent_sign_in_the_padding_is_copied_not_formatted() -> None:
    assert make_value(1, 2, b":%d%%") == b"0001000000000002:%d%%"


@pytest.mark.parametrize("direct", [False, True], ids=["produce-calls", "direct"])
def test_a_full_queue_stops_the_run_at_the_first_refused_record(direct: bool) -> None:
    # No broker at this address: librdkafka only queues, so its 5-message queue fills exactly.
    quiet = {"log_level": 0}  # its connection attempts fail until the process exits; nothing to report
    load = LoadProducer(
        "127.0.0.1:1", {"queue.buffering.max.messages": 5, "enable.idempotence": False, **quiet}, direct=direct
    )
    assert load.direct is direct  # the direct path is built and adopts the load's producer
    try:
        assert load.produce_run("t", 0, range(10, 13), padding(20)) == 3
        assert load.produce_run("t", 0, range(13, 20), padding(20)) == 2
        assert load.produce_run("t", 0, range(15, 20), padding(20)) == 0
    finally:
        load.producer.purge()


def _record(partition: int, value: bytes | None) -> Message:
    return Message(topic="d", partition=partition, offset=0, value=value)


def _reference(batches: list[list[Message]], counts: list[int]) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """What a tally must say, counted the obvious way, record by record: its fields and the first missing."""
    seen: set[tuple[int, int]] = set()
    last: dict[int, int] = {}
    unique = duplicates = misplaced = disordered = foreign = 0
    for m in (m for batch in batches for m in batch if m.error() is None):
        try:
            p, seq = decode(m.value())  # type: ignore[arg-type]  # None: TypeError, foreign
            known = 0 <= p < len(counts) and seq < counts[p]
        except (TypeError, ValueError):
            known = False
        if not known:
            foreign += 1
        elif (p, seq) in seen:
            duplicates += 1
        else:
            seen.add((p, seq))
            unique += 1
            disordered += seq < last.get(p, -1)
            last[p] = max(last.get(p, -1), seq)
            misplaced += m.partition() != p
    missing = [(p, s) for p, n in enumerate(counts) for s in range(n) if (p, s) not in seen]
    return (unique, duplicates, misplaced, disordered, foreign, sum(counts)), missing[:10]


def _tally(batches: list[list[Message]], counts: list[int]) -> Tally:
    tally = Tally(counts)
    for batch in batches:
        assert tally.add(batch) == sum(m.error() is None for m in batch)
    return tally


def _fields(t: Tally) -> tuple[int, ...]:
    return (t.unique, t.duplicates, t.misplaced, t.disordered, t.foreign, t.expected)


class _RunsOnly(Tally):
    def _add_each(self, partition: int, headers: Iterable[int]) -> None:
        raise AssertionError("a correct copy must not need the record-by-record path")


def test_a_correct_copy_is_counted_in_runs() -> None:
    pad = padding(20)
    counts = [5, 3]
    batch = [_record(0, make_value(0, s, pad)) for s in range(3)] + [
        _record(1, make_value(1, s, pad)) for s in range(3)
    ]
    later = [_record(0, make_value(0, s, pad)) for s in (3, 4)]
    assert _fields(_tally([batch, later], counts)) == _reference([batch, later], counts)[0] == (8, 0, 0, 0, 0, 8)
    runs = _RunsOnly(counts)
    assert runs.add(batch) + runs.add(later) == 8
    assert runs.complete


def test_every_kind_of_wrong_copy_is_counted_as_record_by_record() -> None:
    """Duplicates, gaps, reordering, misplaced, foreign and null values, error events, in random batches."""
    for seed in range(300):
        _compare_on_a_random_copy(seed)


def _compare_on_a_random_copy(seed: int) -> None:
    rng = random.Random(seed)
    pad = padding(20)
    counts = [rng.randint(0, 12) for _ in range(rng.randint(1, 4))]
    stream: list[Message] = []
    for p, n in enumerate(counts):
        seqs = list(range(n))
        for _ in range(rng.randint(0, 3)):
            kind = rng.choice(["dup", "drop", "swap", "far", "foreign", "null", "error", "beyond"])
            if kind == "dup" and seqs:
                i = rng.randrange(len(seqs))
                seqs.insert(i + rng.randint(0, 2), seqs[i])
            elif kind == "drop" and seqs:
                seqs.pop(rng.randrange(len(seqs)))
            elif kind == "swap" and len(seqs) > 1:
                i = rng.randrange(len(seqs) - 1)
                seqs[i], seqs[i + 1] = seqs[i + 1], seqs[i]
            elif kind in ("foreign", "null", "error", "beyond", "far"):
                seqs.insert(rng.randint(0, len(seqs)), -1 - ["foreign", "null", "error", "beyond", "far"].index(kind))
        for s in seqs:
            if s >= 0:
                stream.append(_record(p, make_value(p, s, pad)))
            elif s == -1:
                stream.append(_record(p, b"not a bench record"))
            elif s == -2:
                stream.append(_record(p, None))
            elif s == -3:
                stream.append(Message(topic="d", partition=p, error=KafkaError(KafkaError._PARTITION_EOF)))
            elif s == -4:
                stream.append(_record(p, make_value(p, n + 1, pad)))
            else:  # a record of another partition, copied here
                q = rng.randrange(len(counts))
                if counts[q]:
                    stream.append(_record(p, make_value(q, rng.randrange(counts[q]), pad)))
    batches: list[list[Message]] = []
    while stream:
        k = rng.randint(1, 8)
        batches.append(stream[:k])
        stream = stream[k:]
    tally = _tally(batches, counts)
    assert (_fields(tally), tally.missing_examples()) == _reference(batches, counts), f"seed {seed}"


def test_columns_of_a_batch_split_runs_and_skip_events() -> None:
    pad = padding(20)
    batch = [
        _record(0, make_value(0, 0, pad)),
        _record(0, make_value(0, 1, pad)),
        Message(topic="d", partition=0, error=KafkaError(KafkaError._PARTITION_EOF)),
        _record(1, make_value(1, 5, pad)),
        _record(1, make_value(1, 7, pad)),
        _record(0, None),
        _record(0, b"0000000000000002"[:15]),
    ]
    cols = columns_of(batch)
    assert list(cols.headers) == [0, 1, SEQ_MODULUS + 5, SEQ_MODULUS + 7, -1, -1]
    assert cols.runs == [(0, 0, 2, True), (1, 2, 4, False), (0, 4, 6, False)]
    assert (cols.events, cols.other_type) == (1, NO_OTHER_TYPE)


def test_latencies_stop_at_the_first_record_of_another_timestamp_type() -> None:
    now_ms = time.time() * 1000
    batch = [
        Message(topic="d", partition=0, value=b"x", timestamp=(TIMESTAMP_LOG_APPEND_TIME, int(now_ms) - 50)),
        Message(topic="d", partition=0, value=b"x", timestamp=(TIMESTAMP_CREATE_TIME, int(now_ms) - 40)),
        Message(topic="d", partition=0, value=b"x", timestamp=(TIMESTAMP_LOG_APPEND_TIME, int(now_ms) - 30)),
    ]
    latencies = array("d")
    cols = columns_of(batch, TIMESTAMP_LOG_APPEND_TIME, latencies)
    assert cols.other_type == TIMESTAMP_CREATE_TIME
    assert len(latencies) == 1
    assert 50 <= latencies[0] < 50 + 10_000
    with pytest.raises(ValueError, match="latencies need"):
        columns_of(batch, TIMESTAMP_LOG_APPEND_TIME)
