"""The audit's two alignments on hand-made partitions (ferryman_auditor._align; no Kafka, no Spark)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from ferryman_auditor._align import Counts, Leading, Rows, classify, hashes, out_of_order


def _h(contents: Sequence[int]) -> npt.NDArray[np.void]:
    v = np.asarray(contents, dtype=np.int64)
    return hashes(v, v * 7 + 1)


def _rows(
    expected: Sequence[int],
    found: Sequence[int],
    *,
    lookahead: Sequence[int] = (),
    mapping: Sequence[tuple[int, int]] = (),
    expected_offsets: Sequence[int] | None = None,
) -> Rows:
    eo = expected_offsets if expected_offsets is not None else [2 * i for i in range(len(expected))]  # sparse
    return Rows(
        expected_offsets=np.asarray(eo, dtype=np.int64),
        expected_hashes=_h(expected),
        found_offsets=np.arange(100, 100 + len(found), dtype=np.int64),
        found_hashes=_h(found),
        lookahead_hashes=_h(lookahead),
        map_source=np.asarray([m[0] for m in mapping], dtype=np.int64),
        map_destination=np.asarray([m[1] for m in mapping], dtype=np.int64),
    )


def _faults(c: Counts) -> dict[str, int]:
    return {k: v for k, v in c.as_dict().items() if v and k != "found"}


@pytest.mark.parametrize(
    ("found", "faults"),
    [
        ([1, 2, 3, 4, 5], {}),
        ([1, 2, 2, 3, 4, 5], {"duplicated": 1}),
        ([1, 2, 4, 5], {"missing": 1}),
        ([1, 2, 9, 4, 5], {"altered": 1}),
        ([1, 3, 2, 4, 5], {"reordered": 1}),
        ([1, 2, 3, 77, 4, 5], {"unexpected": 1}),
        ([1, 2, 3, 4, 5, 77], {"unexpected": 1}),
        ([5, 4, 3, 2, 1], {"reordered": 4}),
    ],
    ids=["clean", "duplicate", "missing", "altered", "swapped-pair", "foreign", "foreign-at-end", "reversed"],
)
def test_content_alignment_names_each_fault(found: list[int], faults: dict[str, int]) -> None:
    outcome = classify(_rows([1, 2, 3, 4, 5], found), Leading.COUNT, 0, 10)
    assert _faults(outcome.content) == faults
    assert outcome.by_map is None


def test_repeated_contents_are_matched_occurrence_by_occurrence() -> None:
    outcome = classify(_rows([1, 1, 1], [1, 1, 1, 1]), Leading.COUNT, 0, 6)
    assert _faults(outcome.content) == {"duplicated": 1}


def test_copies_of_records_past_the_range_are_left_to_the_next_audit() -> None:
    outcome = classify(_rows([1, 2, 3], [1, 2, 3, 4, 5], lookahead=[4, 5, 6]), Leading.COUNT, 0, 6)
    assert _faults(outcome.content) == {}
    assert outcome.next_destination_offset == 103


def test_leading_copies_of_removed_records_are_unverifiable_not_unexpected() -> None:
    outcome = classify(_rows([3, 4], [1, 2, 3, 4]), Leading.UNVERIFIABLE, 0, 4)
    assert outcome.content.unverifiable == 2
    assert _faults(outcome.content) == {"unverifiable": 2}
    ignored = classify(_rows([3, 4], [1, 2, 3, 4]), Leading.IGNORE, 0, 4)
    assert _faults(ignored.content) == {}


def test_the_offset_map_alignment_agrees_on_a_faithful_copy_and_on_a_duplicate() -> None:
    exact = [(0, 100), (2, 101), (4, 102)]
    clean = classify(_rows([1, 2, 3], [1, 2, 3], mapping=exact), Leading.COUNT, 0, 6)
    assert clean.by_map is not None and _faults(clean.by_map) == {} and clean.by_map.found == 3
    dup = classify(_rows([1, 2, 3], [1, 2, 2, 3], mapping=[(0, 100), (2, 101), (4, 103)]), Leading.COUNT, 0, 6)
    assert dup.by_map is not None
    assert _faults(dup.content) == _faults(dup.by_map) == {"duplicated": 1}


def test_a_wrong_offset_map_disagrees_with_the_content_alignment() -> None:
    swapped = [(0, 100), (2, 102), (4, 101)]  # the map says the copies are in another order than they are
    outcome = classify(_rows([1, 2, 3], [1, 2, 3], mapping=swapped), Leading.COUNT, 0, 6)
    assert _faults(outcome.content) == {}
    assert outcome.by_map is not None and _faults(outcome.by_map) != {}


def test_mappings_of_compacted_source_records_make_their_copies_unverifiable() -> None:
    # Source offset 2 was compacted away after it was copied to 101: its copy cannot be checked.
    rows = _rows([1, 3], [1, 2, 3], mapping=[(0, 100), (2, 101), (4, 102)], expected_offsets=[0, 4])
    outcome = classify(rows, Leading.COUNT, 0, 6)
    assert _faults(outcome.content) == {"unverifiable": 1}
    assert outcome.by_map is not None and _faults(outcome.by_map) == {"unverifiable": 1}


def test_out_of_order_counts_the_fewest_moves() -> None:
    assert out_of_order(np.asarray([1, 2, 3], dtype=np.int64)) == 0
    assert out_of_order(np.asarray([2, 1, 3], dtype=np.int64)) == 1
    assert out_of_order(np.asarray([3, 1, 2, 4], dtype=np.int64)) == 1


@pytest.mark.parametrize("seed", range(20))
def test_key_matching_pairs_occurrences_as_a_plain_reference_does(seed: int) -> None:
    """_match and _isin over int64 halves agree with counting occurrences in Python (keys sharing a half too)."""
    from collections import Counter  # noqa: PLC0415

    from ferryman_auditor._align import _isin, _match  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    # Few distinct values per half: many repeats, and equal first halves with different second ones.
    left_pairs = rng.integers(-3, 3, size=(int(rng.integers(0, 60)), 2))
    right_pairs = rng.integers(-3, 3, size=(int(rng.integers(0, 60)), 2))
    left, right = hashes(left_pairs[:, 0], left_pairs[:, 1]), hashes(right_pairs[:, 0], right_pairs[:, 1])
    lk = [tuple(p) for p in left_pairs.tolist()]
    rk = [tuple(p) for p in right_pairs.tolist()]

    i, j = _match(left, right)
    pairs = sorted(zip(i.tolist(), j.tolist(), strict=True))
    seen_l: Counter[tuple[int, ...]] = Counter()
    seen_r: Counter[tuple[int, ...]] = Counter()
    occurrence_l = []
    for key in lk:
        occurrence_l.append(seen_l[key])
        seen_l[key] += 1
    positions_r: dict[tuple[tuple[int, ...], int], int] = {}
    for n, key in enumerate(rk):
        positions_r[(key, seen_r[key])] = n
        seen_r[key] += 1
    want = sorted(
        (n, positions_r[(key, occurrence_l[n])]) for n, key in enumerate(lk) if (key, occurrence_l[n]) in positions_r
    )
    assert pairs == want
    assert _isin(left, right).tolist() == [key in set(rk) for key in lk]
