"""Resend bookkeeping without a network: the deduper's gap tracker and the wrapper's range read.

The wire side of the control link (version rule, the hub, the reconnecting
link) is in test_control_protocol.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest
from confluent_kafka import KafkaError, Message
from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2
from ferryman_deduper._control import lag_seconds
from ferryman_deduper._gaps import Filled, GapTracker
from ferryman_wrapper._control import _RESEND_POLL_S, read_range

KEY = PartitionKey("orders", 3)
SOURCE = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", partition=3)
RETRY_S = 10.0


# -- the deduper's gap tracker -----------------------------------------------------------------------------------


def test_a_gap_opens_once_then_grows_and_is_due_at_once() -> None:
    gaps = GapTracker()
    assert gaps.due(0.0, RETRY_S) == []
    assert gaps.note(KEY, SOURCE, 0, 20)  # opens
    assert not gaps.note(KEY, SOURCE, 0, 35)  # the next held envelope only extends it
    assert not gaps.note(KEY, SOURCE, 0, 30)  # never shrinks by a late, smaller report
    [(key, gap)] = gaps.due(0.0, RETRY_S)
    assert key == KEY
    assert (gap.missing_from, gap.missing_to, gap.requested_to) == (0, 35, -1)


def test_a_gap_that_starts_elsewhere_replaces_the_open_one() -> None:
    gaps = GapTracker()
    gaps.note(KEY, SOURCE, 0, 20)
    gaps.get(KEY).mark_requested(100.0)  # type: ignore[union-attr]
    # The watermark moved under the gap (a topic reset, say): a new gap, due now.
    assert gaps.note(KEY, SOURCE, 5, 9)
    gap = gaps.get(KEY)
    assert gap is not None and (gap.missing_from, gap.missing_to, gap.requested_at) == (5, 9, None)


def test_a_request_is_repeated_only_after_the_retry_interval() -> None:
    gaps = GapTracker()
    gaps.note(KEY, SOURCE, 0, 20)
    [(_, gap)] = gaps.due(100.0, RETRY_S)
    gap.mark_requested(100.0)
    assert (gap.requested_at, gap.requested_to) == (100.0, 20)
    assert gaps.due(100.0 + RETRY_S - 0.1, RETRY_S) == []
    assert [k for k, _ in gaps.due(100.0 + RETRY_S, RETRY_S)] == [KEY]


def test_an_answer_covering_only_the_start_of_a_grown_gap_keeps_the_rest_open_and_asks_for_it_at_once() -> None:
    """The bug this tracker exists for: a gap dropped on its first accepted envelope left a quiet partition stuck."""
    gaps = GapTracker()
    gaps.note(KEY, SOURCE, 0, 20)
    gaps.get(KEY).mark_requested(100.0)  # type: ignore[union-attr]  # asks for 0..20
    gaps.note(KEY, SOURCE, 0, 49)  # more held envelopes are read before the answer comes
    filled, before = gaps.accepted(KEY, 20)  # the answer: 0..20
    assert filled is Filled.REST_DUE
    assert before is not None and (before.missing_from, before.missing_to) == (0, 49)
    gap = gaps.get(KEY)
    assert gap is not None and (gap.first_missing, gap.missing_from, gap.missing_to) == (0, 21, 49)
    # Due now, not after the retry interval: nothing else would reveal the rest on a quiet source.
    assert [k for k, _ in gaps.due(100.5, RETRY_S)] == [KEY]
    gap.mark_requested(100.5)
    assert gap.requested_to == 49
    filled, before = gaps.accepted(KEY, 49)
    assert filled is Filled.CLOSED
    assert before is not None and (before.first_missing, before.missing_from, before.missing_to) == (0, 21, 49)
    assert gaps.get(KEY) is None and len(gaps) == 0


def test_an_answer_in_several_parts_shrinks_the_gap_without_asking_again() -> None:
    gaps = GapTracker()
    gaps.note(KEY, SOURCE, 0, 49)
    gaps.get(KEY).mark_requested(100.0)  # type: ignore[union-attr]  # asks for all of it
    assert gaps.accepted(KEY, 10)[0] is Filled.SHRUNK  # the first chunk of the answer
    assert gaps.accepted(KEY, 30)[0] is Filled.SHRUNK
    gap = gaps.get(KEY)
    assert gap is not None and gap.missing_from == 31
    assert gaps.due(101.0, RETRY_S) == []  # the rest of the answer is on its way
    assert gaps.accepted(KEY, 55)[0] is Filled.CLOSED  # past the end (a larger envelope) closes it too


def test_accepts_of_a_partition_without_a_gap_and_a_rewind() -> None:
    gaps = GapTracker()
    assert gaps.accepted(KEY, 7) == (Filled.NO_GAP, None)
    gaps.note(KEY, SOURCE, 8, 9)
    gaps.note(PartitionKey("orders", 4), SOURCE, 0, 1)
    assert len(gaps) == 2
    gaps.clear()  # a rewind: gaps are found again as staging is re-read
    assert len(gaps) == 0 and gaps.due(0.0, RETRY_S) == []


@dataclass
class QuietPartition:
    """A deduper's view of one source partition whose source has gone quiet, driven through the tracker.

    Source records 0..last, one per envelope; staging lost the first ``lost``
    envelopes. Verdicts follow the chain rule (an envelope is accepted when its
    previous offset is at or below the watermark). The wrapper answers each
    request with exactly the requested range, ``answer_after`` ticks later.
    The clock never moves: no retry timer ever fires.
    """

    last: int
    lost: int
    answer_after: int
    watermark: int = -1
    gaps: GapTracker = field(default_factory=GapTracker)
    in_flight: list[tuple[int, int, int]] = field(default_factory=list)
    """(tick due, from, to) of requests not answered yet."""
    requests: list[tuple[int, int]] = field(default_factory=list)

    def envelope(self, previous: int, offset: int) -> None:
        if previous <= self.watermark:
            if offset > self.watermark:
                self.watermark = offset
                self.gaps.accepted(KEY, offset)
        else:
            self.gaps.note(KEY, SOURCE, self.watermark + 1, max(previous, offset))

    def tick(self, n: int) -> None:
        for due, lo, hi in [r for r in self.in_flight if r[0] <= n]:
            self.in_flight.remove((due, lo, hi))
            for offset in range(lo, hi + 1):
                self.envelope(offset - 1, offset)
        for _key, gap in self.gaps.due(0.0, RETRY_S):
            gap.mark_requested(0.0)
            self.requests.append((gap.missing_from, gap.missing_to))
            self.in_flight.append((n + self.answer_after, gap.missing_from, gap.missing_to))


@pytest.mark.parametrize("answer_after", [0, 1, 5, 40])
def test_a_quiet_partition_with_a_gap_is_completed_without_waiting_for_a_retry(answer_after: int) -> None:
    p = QuietPartition(last=49, lost=20, answer_after=answer_after)
    staging = [(o - 1, o) for o in range(p.lost, p.last + 1)]
    n = 0
    for n, (previous, offset) in enumerate(staging):  # one staging envelope per loop, as consume_batch_size=1
        p.envelope(previous, offset)
        p.tick(n)
    # The source is quiet now: only ticks, enough for two more request/answer rounds.
    for m in range(n + 1, n + 1 + 3 * (answer_after + 1)):
        p.tick(m)
    assert p.watermark == p.last, f"stuck at {p.watermark}; requests {p.requests}"
    assert len(p.gaps) == 0
    # Each request asks for what the previous answers did not cover, and nothing twice.
    assert p.requests[0][0] == 0
    assert all(nxt[0] == prev[1] + 1 for prev, nxt in zip(p.requests, p.requests[1:], strict=False)), p.requests
    assert p.requests[-1][1] == p.last


# -- the wrapper's read of a requested range ---------------------------------------------------------------------


@dataclass(frozen=True)
class FakeRecord:
    """What read_range looks at in a consumed message."""

    offset_: int | None
    error_: KafkaError | None = None

    def offset(self) -> int | None:
        return self.offset_

    def error(self) -> KafkaError | None:
        return self.error_


def _eof(at: int) -> FakeRecord:
    return FakeRecord(at, KafkaError(KafkaError._PARTITION_EOF))


@dataclass
class FakeConsumer:
    """Hands out prepared batches, one per consume() call, then empty ones; records each timeout."""

    batches: list[list[FakeRecord]]
    timeouts: list[float] = field(default_factory=list)

    def consume(self, timeout_s: float) -> Sequence[Message]:
        self.timeouts.append(timeout_s)
        return cast("Sequence[Message]", self.batches.pop(0) if self.batches else [])


def _offsets(messages: Sequence[Message]) -> list[int | None]:
    return [m.offset() for m in messages]


def _read(consumer: FakeConsumer, from_offset: int, to_offset: int, budget_s: float = 30.0) -> list[int | None]:
    return _offsets(
        read_range(consumer.consume, "orders-3", from_offset, to_offset, deadline=time.monotonic() + budget_s)
    )


def test_range_read_returns_once_the_last_wanted_offset_is_read() -> None:
    # More records follow in the log, and further consume() calls would hand them out.
    consumer = FakeConsumer([[FakeRecord(o) for o in range(10, 13)], [FakeRecord(13), FakeRecord(14)], [_eof(15)]])
    assert _read(consumer, 10, 13) == [10, 11, 12, 13]
    assert len(consumer.timeouts) == 2  # did not wait for a full batch, nor for the end of the partition
    assert all(t <= _RESEND_POLL_S for t in consumer.timeouts)


def test_range_read_stops_past_the_range_when_its_last_offset_is_not_a_record() -> None:
    # 12 is a transaction marker: the read_committed consumer never returns it.
    consumer = FakeConsumer([[FakeRecord(10), FakeRecord(11), FakeRecord(13), FakeRecord(14)]])
    assert _read(consumer, 10, 12) == [10, 11]


def test_range_read_stops_at_the_end_of_the_partition() -> None:
    consumer = FakeConsumer([[], [FakeRecord(10), FakeRecord(11)], [], [_eof(12)]])
    assert _read(consumer, 10, 40) == [10, 11]
    assert len(consumer.timeouts) == 4


def test_range_read_that_runs_out_of_time_returns_what_it_has_or_raises() -> None:
    assert _read(FakeConsumer([[FakeRecord(10)]]), 10, 40, budget_s=0.2) == [10]
    with pytest.raises(TimeoutError, match="orders-3"):
        _read(FakeConsumer([]), 10, 40, budget_s=0.2)


def test_range_read_fails_on_a_consumer_error_and_when_stopping() -> None:
    gone = FakeRecord(None, KafkaError(KafkaError.OFFSET_OUT_OF_RANGE, "offset out of range"))
    with pytest.raises(RuntimeError, match="no longer be in the source log"):
        _read(FakeConsumer([[FakeRecord(10), gone]]), 10, 40)
    stopping = threading.Event()
    stopping.set()
    consumer = FakeConsumer([[FakeRecord(10)]])
    with pytest.raises(RuntimeError, match="abandoned"):
        read_range(consumer.consume, "orders-3", 10, 40, deadline=time.monotonic() + 30, stopping=stopping)
    assert consumer.timeouts == []


_LOST_SOURCE = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", partition=2)


def test_a_gap_is_marked_lost_only_by_an_answer_about_its_start() -> None:
    gaps = GapTracker()
    key = PartitionKey("orders", 2)
    gaps.note(key, _LOST_SOURCE, 100, 199)
    assert gaps.lost(key, 100, 100) is None  # the log starts at the gap: nothing of it deleted
    assert gaps.lost(key, 120, 150) is None  # an answer about a later range (stale)
    gap = gaps.lost(key, 100, 150)
    assert gap is not None
    assert gap.lost_to == 149
    assert gaps.lost(key, 100, 500) is gap
    assert gap.lost_to == 199  # capped at the gap's end


def test_lag_in_seconds_is_the_age_of_the_last_record_written_and_zero_without_lag() -> None:
    assert lag_seconds(0, -1, 10_000.0) == 0.0  # caught up: no lag, whatever was written
    assert lag_seconds(5, 7_500, 10_000.0) == 2.5  # behind: the last record written is 2.5 s old
    assert lag_seconds(5, -1, 10_000.0) == -1.0  # nothing written since start: unknown
    assert lag_seconds(-1, 7_500, 10_000.0) == -1.0  # log end unknown
    assert lag_seconds(5, 11_000, 10_000.0) == 0.0  # a producer clock ahead of ours: never negative
