"""The bench's record format, its C-level generator and its tally: fast paths agree with the plain ones."""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Iterable
from itertools import groupby

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


def _record(partition: int, value: bytes | None, topic: int = 0) -> Message:
    """A record read from ``partition`` of the copy of the ``topic``-th source topic (named ``t<topic>``)."""
    return Message(topic=f"t{topic}", partition=partition, offset=0, value=value)


def _topic_index(m: Message) -> int:
    return int(str(m.topic())[1:])


def _reference(
    batches: list[list[Message]], counts: list[int], topics: int = 1, *, topic_known: bool = False
) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """What a tally must say, counted the obvious way, record by record: its fields and the first missing.

    ``counts`` covers ``topics`` topics (``Tally``); ``topic_known``: the reader says which topic's copy a
    record was read from, and one found in another topic's copy is misplaced.
    """
    partitions = len(counts) // topics
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
            misplaced += m.partition() != p % partitions or (topic_known and _topic_index(m) != p // partitions)
    missing = [(p, s) for p, n in enumerate(counts) for s in range(n) if (p, s) not in seen]
    return (unique, duplicates, misplaced, disordered, foreign, sum(counts)), missing[:10]


def _tally(batches: list[list[Message]], counts: list[int], topics: int = 1, *, topic_known: bool = False) -> Tally:
    """Each batch counted whole (the reader does not say which topic a record came from), or topic by topic."""
    tally = Tally(counts, topics)
    for batch in batches:
        if topic_known:
            added = sum(tally.add(list(run), t) for t, run in groupby(batch, _topic_index))
        else:
            added = tally.add(batch)
        assert added == sum(m.error() is None for m in batch)
    return tally


def _fields(t: Tally) -> tuple[int, ...]:
    return (t.unique, t.duplicates, t.misplaced, t.disordered, t.foreign, t.expected)


class _RunsOnly(Tally):
    def _add_each(self, partition: int, topic: int | None, headers: Iterable[int]) -> None:
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


def test_a_correct_copy_of_several_topics_is_counted_in_runs() -> None:
    """Partition p of the i-th topic is numbered i * P + p in the records; each topic's copy keeps its own p."""
    pad = padding(20)
    counts = [2, 1, 3, 2]  # two topics of two partitions
    batch = [
        *(_record(0, make_value(0, s, pad), topic=0) for s in range(2)),
        _record(1, make_value(1, 0, pad), topic=0),
        *(_record(0, make_value(2, s, pad), topic=1) for s in range(3)),
        *(_record(1, make_value(3, s, pad), topic=1) for s in range(2)),
    ]
    blind = _RunsOnly(counts, 2)
    assert blind.add(batch) == 8
    known = _RunsOnly(counts, 2)
    assert sum(known.add(list(run), t) for t, run in groupby(batch, _topic_index)) == 8
    assert blind.complete and known.complete
    assert blind.misplaced == known.misplaced == 0


def test_a_record_in_another_topics_copy_is_misplaced_where_the_reader_says_which_topic() -> None:
    pad = padding(20)
    counts = [1, 1]  # two topics of one partition
    # Topic 1's record in topic 0's copy, and topic 0's in topic 1's: each on the right partition number.
    swapped = [_record(0, make_value(1, 0, pad), topic=0), _record(0, make_value(0, 0, pad), topic=1)]
    assert _fields(_tally([swapped], counts, 2, topic_known=True)) == (2, 0, 2, 0, 0, 2)
    # Read through one queue, the topic is unknown: only the partition number can be checked.
    assert _fields(_tally([swapped], counts, 2)) == (2, 0, 0, 0, 0, 2)


def test_a_tally_refuses_counts_that_do_not_split_over_its_topics() -> None:
    with pytest.raises(ValueError, match="3 partition counts"):
        Tally([1, 2, 3], 2)


def test_every_kind_of_wrong_copy_is_counted_as_record_by_record() -> None:
    """Duplicates, gaps, reordering, misplaced, foreign and null values, error events, in random batches.

    Of one to three source topics, read topic by topic (``audit``) and through one queue (``LiveWatcher``).
    """
    for seed in range(300):
        _compare_on_a_random_copy(seed)


def _compare_on_a_random_copy(seed: int) -> None:
    rng = random.Random(seed)
    pad = padding(20)
    topics, partitions = rng.randint(1, 3), rng.randint(1, 4)
    counts = [rng.randint(0, 12) for _ in range(topics * partitions)]
    stream: list[Message] = []
    for numbered, n in enumerate(counts):
        topic, p = divmod(numbered, partitions)
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
                stream.append(_record(p, make_value(numbered, s, pad), topic))
            elif s == -1:
                stream.append(_record(p, b"not a bench record", topic))
            elif s == -2:
                stream.append(_record(p, None, topic))
            elif s == -3:
                eof = KafkaError(KafkaError._PARTITION_EOF)
                stream.append(Message(topic=f"t{topic}", partition=p, error=eof))
            elif s == -4:
                stream.append(_record(p, make_value(numbered, n + 1, pad), topic))
            else:  # a record of another partition (of any topic), copied here
                q = rng.randrange(len(counts))
                if counts[q]:
                    stream.append(_record(p, make_value(q, rng.randrange(counts[q]), pad), topic))
    batches: list[list[Message]] = []
    while stream:
        k = rng.randint(1, 8)
        batches.append(stream[:k])
        stream = stream[k:]
    for known in (False, True):
        tally = _tally(batches, counts, topics, topic_known=known)
        found = (_fields(tally), tally.missing_examples())
        assert found == _reference(batches, counts, topics, topic_known=known), f"seed {seed}, topic known: {known}"


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
