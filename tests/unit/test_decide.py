"""The dedup decision (ferryman_deduper._decide), verdict by verdict."""

from __future__ import annotations

import pytest
from ferryman_deduper._decide import Decision, PartitionState, Verdict, decide

TID_A = b"\xaa" * 16
TID_B = b"\xbb" * 16
TID_C = b"\xcc" * 16


def at(watermark: int, topic_id: bytes = TID_A) -> PartitionState:
    return PartitionState(watermark=watermark, topic_id=topic_id)


def accepted(d: Decision, offsets: list[int]) -> list[int]:
    """The offsets the deduper writes for decision d on an envelope holding offsets."""
    assert d.verdict is Verdict.ACCEPT
    return offsets[d.start :]


def watermark(d: Decision) -> int:
    assert d.new_state is not None
    return d.new_state.watermark


# ---------------------------------------------------------------- the first envelope


@pytest.mark.parametrize("state", [None, PartitionState()], ids=["never-seen", "restored-empty"])
def test_first_envelope_is_accepted_and_offset_zero_is_a_real_record(state: PartitionState | None) -> None:
    d = decide(state, TID_A, -1, [0, 1, 2])
    assert accepted(d, [0, 1, 2]) == [0, 1, 2]
    assert watermark(d) == 2
    assert d.new_state is not None and d.new_state.topic_id == TID_A
    assert not d.recreated


def test_single_record_at_offset_zero_is_not_a_duplicate() -> None:
    d = decide(None, TID_A, -1, [0])
    assert accepted(d, [0]) == [0]
    assert watermark(d) == 0


def test_first_envelope_after_retention_or_latest_start_is_accepted() -> None:
    # A logical start links to -1 whatever the first readable offset is.
    d = decide(None, TID_A, -1, [5000, 5001])
    assert accepted(d, [5000, 5001]) == [5000, 5001]
    assert watermark(d) == 5001


def test_first_envelope_that_follows_an_unseen_record_is_a_gap() -> None:
    d = decide(None, TID_A, 4, [5, 6])
    assert d.verdict is Verdict.GAP
    assert (d.missing_from, d.missing_to) == (0, 4)
    assert d.new_state is None


# ---------------------------------------------------------------- duplicates and overlap


@pytest.mark.parametrize(
    ("previous_offset", "offsets"),
    [(-1, [0, 1, 2, 3]), (3, [4, 5]), (9, [10]), (5, [7, 9, 10]), (4, [5, 7, 10]), (-1, [10])],
)
def test_envelopes_entirely_at_or_below_the_watermark_are_dropped(previous_offset: int, offsets: list[int]) -> None:
    d = decide(at(10), TID_A, previous_offset, offsets)
    assert d.verdict is Verdict.DUPLICATE
    assert d.new_state is None
    assert not d.recreated


@pytest.mark.parametrize(
    ("watermark_", "previous_offset", "offsets", "expected"),
    [
        (7, 4, [5, 6, 7, 8, 9], [8, 9]),
        (7, 4, [5, 7, 9, 12], [9, 12]),
        (7, -1, [0, 1, 2, 3, 4, 5, 6, 7, 8], [8]),
        (6, 2, [5, 9], [9]),  # the watermark sits in a hole of the envelope
        (10, 10, [11, 12], [11, 12]),  # the exact continuation
        (10, 3, [4, 20], [20]),
    ],
)
def test_partial_overlap_accepts_from_the_first_record_above_the_watermark(
    watermark_: int, previous_offset: int, offsets: list[int], expected: list[int]
) -> None:
    d = decide(at(watermark_), TID_A, previous_offset, offsets)
    assert accepted(d, offsets) == expected
    assert watermark(d) == offsets[-1]
    assert not d.recreated


def test_accept_does_not_mutate_the_given_state() -> None:
    st = PartitionState(watermark=3, topic_id=TID_A, retired_topic_ids={TID_C})
    d = decide(st, TID_A, 3, [4, 5])
    assert st == PartitionState(watermark=3, topic_id=TID_A, retired_topic_ids={TID_C})
    assert d.new_state is not None
    assert d.new_state.retired_topic_ids == {TID_C}
    assert d.new_state.retired_topic_ids is not st.retired_topic_ids


# ---------------------------------------------------------------- gaps


@pytest.mark.parametrize(
    ("watermark_", "previous_offset", "offsets", "missing"),
    [
        (10, 20, [21, 22], (11, 20)),
        (10, 11, [12], (11, 11)),
        (-1, 0, [1], (0, 0)),
        (10, 15, [40, 41], (11, 15)),
    ],
)
def test_gap_reports_the_missing_range_and_accepts_nothing(
    watermark_: int, previous_offset: int, offsets: list[int], missing: tuple[int, int]
) -> None:
    d = decide(at(watermark_), TID_A, previous_offset, offsets)
    assert d.verdict is Verdict.GAP
    assert (d.missing_from, d.missing_to) == missing
    assert d.new_state is None
    assert d.start == 0


def test_gap_then_the_resend_fills_it_then_the_held_envelope_is_a_duplicate() -> None:
    state = at(10)
    held = decide(state, TID_A, 20, [21, 22])
    assert held.verdict is Verdict.GAP
    assert (held.missing_from, held.missing_to) == (11, 20)
    # The resend starts just after the watermark and runs through the held envelope.
    resend = decide(state, TID_A, 10, [11, 13, 20, 21, 22])
    assert accepted(resend, [11, 13, 20, 21, 22]) == [11, 13, 20, 21, 22]
    assert resend.new_state is not None
    assert decide(resend.new_state, TID_A, 20, [21, 22]).verdict is Verdict.DUPLICATE


def test_gap_then_a_partial_resend_then_the_held_envelope_is_accepted() -> None:
    state = at(10)
    assert decide(state, TID_A, 20, [21, 22]).verdict is Verdict.GAP
    resend = decide(state, TID_A, 10, [11, 13, 20])
    assert resend.new_state is not None and resend.new_state.watermark == 20
    held = decide(resend.new_state, TID_A, 20, [21, 22])
    assert accepted(held, [21, 22]) == [21, 22]
    assert watermark(held) == 22


# ---------------------------------------------------------------- sparse offsets


def test_holes_inside_an_envelope_are_not_gaps() -> None:
    # Transaction markers and compaction leave holes: 3 -> 5 -> 9 -> 200.
    d = decide(at(2), TID_A, 2, [3, 5, 9, 200])
    assert accepted(d, [3, 5, 9, 200]) == [3, 5, 9, 200]
    assert watermark(d) == 200


def test_holes_between_envelopes_are_not_gaps_when_the_link_is_the_last_delivered_record() -> None:
    state: PartitionState | None = None
    envelopes = [(-1, [0, 1, 2]), (2, [4, 5]), (5, [7]), (7, [30, 31, 33]), (33, [34])]
    written: list[int] = []
    for previous_offset, offsets in envelopes:
        d = decide(state, TID_A, previous_offset, offsets)
        written += accepted(d, offsets)
        state = d.new_state
    assert written == [0, 1, 2, 4, 5, 7, 30, 31, 33, 34]


def test_link_below_the_watermark_after_a_rewind_to_a_marker_is_accepted() -> None:
    # A rewind restarts the chain at next_offset - 1, which may be a marker's offset.
    d = decide(at(9), TID_A, 8, [9, 12, 13])
    assert accepted(d, [9, 12, 13]) == [12, 13]


# ---------------------------------------------------------------- topic re-creation


def test_recreated_topic_with_reset_restarts_the_watermark_and_retires_the_old_id() -> None:
    d = decide(at(99, TID_A), TID_B, -1, [0, 1])
    assert d.recreated
    assert accepted(d, [0, 1]) == [0, 1]
    assert d.new_state is not None
    assert d.new_state.watermark == 1
    assert d.new_state.topic_id == TID_B
    assert d.new_state.retired_topic_ids == {TID_A}
    assert not d.new_state.halted


def test_envelopes_of_the_retired_topic_id_are_stale_afterwards() -> None:
    d = decide(at(99, TID_A), TID_B, -1, [0, 1])
    assert d.new_state is not None
    # A late envelope of the old incarnation: above the old watermark, but stale.
    for previous_offset, offsets in [(99, [100, 101]), (-1, [0]), (1, [2])]:
        stale = decide(d.new_state, TID_A, previous_offset, offsets)
        assert stale.verdict is Verdict.STALE_TOPIC
        assert stale.new_state is None
    # The new incarnation carries on.
    nxt = decide(d.new_state, TID_B, 1, [2])
    assert accepted(nxt, [2]) == [2]


def test_recreation_seen_first_through_a_later_envelope_resets_then_reports_the_gap() -> None:
    d = decide(at(99, TID_A), TID_B, 4, [5, 6])
    assert d.recreated
    assert d.verdict is Verdict.GAP
    assert (d.missing_from, d.missing_to) == (0, 4)
    # The reset state must be kept even though nothing is written.
    assert d.new_state is not None
    assert (d.new_state.watermark, d.new_state.topic_id, d.new_state.retired_topic_ids) == (-1, TID_B, {TID_A})
    fill = decide(d.new_state, TID_B, -1, [0, 2, 4, 5, 6])
    assert not fill.recreated
    assert accepted(fill, [0, 2, 4, 5, 6]) == [0, 2, 4, 5, 6]


def test_recreation_seen_first_through_an_old_looking_envelope_is_not_a_duplicate() -> None:
    # Offsets below the old watermark belong to the new incarnation: they must not be dropped.
    d = decide(at(99, TID_A), TID_B, -1, [0, 1, 2])
    assert accepted(d, [0, 1, 2]) == [0, 1, 2]


def test_a_second_recreation_retires_both_earlier_ids() -> None:
    first = decide(at(50, TID_A), TID_B, -1, [0])
    assert first.new_state is not None
    second = decide(first.new_state, TID_C, -1, [0, 1])
    assert second.recreated
    assert second.new_state is not None
    assert second.new_state.retired_topic_ids == {TID_A, TID_B}
    assert second.new_state.topic_id == TID_C
    for old in (TID_A, TID_B):
        assert decide(second.new_state, old, 1, [2]).verdict is Verdict.STALE_TOPIC


def test_recreated_topic_with_halt_policy_halts() -> None:
    d = decide(at(99, TID_A), TID_B, -1, [0], on_topic_recreated="halt")
    assert d.verdict is Verdict.HALTED
    assert d.recreated
    assert d.new_state is not None
    assert d.new_state.halted
    # Nothing is reset: an operator decides what happens to the old watermark.
    assert (d.new_state.watermark, d.new_state.topic_id) == (99, TID_A)


@pytest.mark.parametrize("policy", ["reset", "halt"])
def test_a_halted_partition_stays_halted(policy: str) -> None:
    d = decide(at(99, TID_A), TID_B, -1, [0], on_topic_recreated="halt")
    assert d.new_state is not None
    halted = d.new_state
    # Whatever comes next, under whatever policy: the old id continuing the chain,
    # the new id, an id-less envelope, a third incarnation.
    for topic_id, previous_offset, offsets in [
        (TID_A, 99, [100]),
        (TID_B, -1, [0]),
        (TID_B, 0, [1]),
        (b"", 99, [100]),
        (TID_C, -1, [0]),
    ]:
        again = decide(halted, topic_id, previous_offset, offsets, on_topic_recreated=policy)
        assert again.verdict is Verdict.HALTED, (topic_id, previous_offset)
        if again.new_state is not None:
            assert again.new_state.halted
            halted = again.new_state


def test_halt_policy_does_not_affect_an_unchanged_topic() -> None:
    d = decide(at(5, TID_A), TID_A, 5, [6], on_topic_recreated="halt")
    assert accepted(d, [6]) == [6]
    assert d.new_state is not None and not d.new_state.halted


# ---------------------------------------------------------------- empty topic ids


def test_state_without_topic_id_adopts_the_first_id_without_recreation() -> None:
    # State written before topic ids were known (or by an old version).
    d = decide(at(5, b""), TID_A, 5, [6])
    assert not d.recreated
    assert accepted(d, [6]) == [6]
    assert d.new_state is not None
    assert d.new_state.topic_id == TID_A
    assert d.new_state.retired_topic_ids == set()


def test_state_without_topic_id_still_drops_duplicates() -> None:
    d = decide(at(5, b""), TID_A, 2, [3, 4, 5])
    assert d.verdict is Verdict.DUPLICATE
    assert not d.recreated


def test_envelope_without_topic_id_is_judged_against_the_current_incarnation() -> None:
    d = decide(at(5, TID_A), b"", 5, [6])
    assert not d.recreated
    assert accepted(d, [6]) == [6]
    assert d.new_state is not None and d.new_state.topic_id == TID_A
    dup = decide(at(5, TID_A), b"", 3, [4, 5])
    assert dup.verdict is Verdict.DUPLICATE and not dup.recreated


def test_empty_ids_on_both_sides_are_not_a_recreation() -> None:
    d = decide(at(5, b""), b"", 5, [6])
    assert not d.recreated
    assert accepted(d, [6]) == [6]


def test_never_seen_partition_with_empty_id_then_a_real_id_is_not_a_recreation() -> None:
    d = decide(None, b"", -1, [0])
    assert d.new_state is not None
    d2 = decide(d.new_state, TID_A, 0, [1])
    assert not d2.recreated
    assert accepted(d2, [1]) == [1]
    assert d2.new_state is not None and d2.new_state.topic_id == TID_A
