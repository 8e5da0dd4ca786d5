"""The dedup decision (pure logic) and a model check of the exactly-once argument."""

from __future__ import annotations

import random

import pytest
from ferryman.v1 import envelope_pb2
from ferryman_deduper._decide import PartitionState, Verdict, decide

TID = b"\x01" * 16
NEW_TID = b"\x02" * 16


def recs(*offsets: int) -> list[envelope_pb2.Record]:
    return [envelope_pb2.Record(offset=o) for o in offsets]


def test_first_envelope_accepted_including_offset_zero() -> None:
    d = decide(None, TID, -1, recs(0, 1, 2))
    assert d.verdict is Verdict.ACCEPT
    assert d.start == 0
    assert d.new_state is not None and d.new_state.watermark == 2


def test_envelope_at_or_below_watermark_is_a_duplicate() -> None:
    st = PartitionState(watermark=10, topic_id=TID)
    d = decide(st, TID, 4, recs(5, 7, 10))
    assert d.verdict is Verdict.DUPLICATE
    assert d.new_state is None


def test_partial_overlap_accepts_only_records_above_watermark() -> None:
    st = PartitionState(watermark=7, topic_id=TID)
    d = decide(st, TID, 4, recs(5, 7, 9, 12))
    assert d.verdict is Verdict.ACCEPT
    assert d.start == 2
    assert d.new_state is not None and d.new_state.watermark == 12


def test_gap_is_reported_with_missing_range_and_nothing_accepted() -> None:
    st = PartitionState(watermark=10, topic_id=TID)
    d = decide(st, TID, 20, recs(21, 22))
    assert d.verdict is Verdict.GAP
    assert (d.missing_from, d.missing_to) == (11, 20)
    assert d.new_state is None


def test_gap_closed_by_the_resend() -> None:
    st = PartitionState(watermark=10, topic_id=TID)
    assert decide(st, TID, 20, recs(21)).verdict is Verdict.GAP
    fill = decide(st, TID, 10, recs(11, 15, 20, 21))
    assert fill.verdict is Verdict.ACCEPT and fill.start == 0
    assert fill.new_state is not None and fill.new_state.watermark == 21


def test_sparse_offsets_from_markers_and_compaction_are_not_gaps() -> None:
    st = PartitionState(watermark=3, topic_id=TID)
    # previous_offset is the last delivered record (3), not offset - 1 (7).
    d = decide(st, TID, 3, recs(8, 40, 41, 90))
    assert d.verdict is Verdict.ACCEPT


def test_recreated_topic_resets_and_retires_old_id() -> None:
    st = PartitionState(watermark=99, topic_id=TID)
    d = decide(st, NEW_TID, -1, recs(0, 1))
    assert d.recreated
    assert d.verdict is Verdict.ACCEPT
    assert d.new_state is not None
    assert d.new_state.watermark == 1
    assert d.new_state.topic_id == NEW_TID
    assert TID in d.new_state.retired_topic_ids
    stale = decide(d.new_state, TID, 99, recs(100))
    assert stale.verdict is Verdict.STALE_TOPIC


def test_recreated_topic_with_halt_policy_halts_and_stays_halted() -> None:
    st = PartitionState(watermark=99, topic_id=TID)
    d = decide(st, NEW_TID, -1, recs(0), on_topic_recreated="halt")
    assert d.verdict is Verdict.HALTED
    assert d.new_state is not None and d.new_state.halted
    again = decide(d.new_state, TID, 99, recs(100))
    assert again.verdict is Verdict.HALTED


def test_empty_topic_ids_do_not_look_like_recreation() -> None:
    st = PartitionState(watermark=5, topic_id=b"")
    d = decide(st, TID, 5, recs(6))
    assert d.verdict is Verdict.ACCEPT and not d.recreated
    assert d.new_state is not None and d.new_state.topic_id == TID
    d2 = decide(PartitionState(watermark=5, topic_id=TID), b"", 5, recs(6))
    assert d2.verdict is Verdict.ACCEPT and not d2.recreated


def _source(rng: random.Random, n: int) -> list[int]:
    """Sparse source offsets (markers, aborted records, compaction)."""
    offsets, o = [], 0
    for _ in range(n):
        o += 1 if rng.random() < 0.8 else rng.randint(2, 6)
        offsets.append(o)
    if rng.random() < 0.5:
        offsets[0] = 0
    return offsets


def _wrapper_stream(rng: random.Random, source: list[int]) -> list[tuple[int, list[int]]]:
    """Envelopes as an unreliable wrapper sends them: replays from earlier commits,
    and sends whose predecessor failed (arriving before the resend)."""
    out: list[tuple[int, list[int]]] = []
    committed = 0  # index of the next record after the last commit
    pos = 0
    while pos < len(source):
        size = rng.randint(1, 7)
        batch = source[pos : pos + size]
        prev = source[pos - 1] if pos > 0 else -1
        r = rng.random()
        if r < 0.1 and pos > 0:
            # A failed send: this envelope is lost, the next one gets through,
            # then the wrapper rewinds to the last commit and replays.
            nxt = pos + size
            if nxt < len(source):
                out.append((source[nxt - 1], source[nxt : nxt + rng.randint(1, 4)]))
            pos = committed
            continue
        out.append((prev, batch))
        pos += size
        if rng.random() < 0.3:
            committed = pos
        if rng.random() < 0.08:
            pos = committed  # crash + restart: replay since the last commit
    return out


@pytest.mark.parametrize("seed", range(300))
def test_model_every_record_exactly_once_in_order(seed: int) -> None:
    rng = random.Random(seed)
    source = _source(rng, rng.randint(1, 60))
    state: PartitionState | None = None
    written: list[int] = []
    for prev, offsets in _wrapper_stream(rng, source):
        d = decide(state, TID, prev, recs(*offsets))
        if d.verdict is Verdict.ACCEPT:
            written.extend(offsets[d.start :])
        if d.new_state is not None:
            state = d.new_state
        # The invariant after every step: the destination is exactly the source up to the watermark.
        w = state.watermark if state is not None else -1
        assert written == [o for o in source if o <= w]
    assert written == source
