"""The compiled pairing of dense codes (ferryman_auditor._pairs) against the sorting path it replaces.

``classify`` takes the compiled pairing when the keys are dense codes (what the
compiled coder gives) and ``_pairs`` is built; the sorting path stays the
reference and the fallback. Both must give identical outcomes, counts, samples
and next positions alike: on the fault cases of ``test_audit_align`` and on
random partitions (repeated contents, drops, duplicates, alterations, moves,
foreign records, lookahead, faithful, wrong and compacted offset maps). The
module imports ``_pairs`` itself: a build without it fails here, never skips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from ferryman_auditor import _pairs
from ferryman_auditor._align import Leading, Outcome, Rows, classify, hashes
from hypothesis import given, settings
from hypothesis import strategies as st


def _dense(contents: Sequence[int]) -> tuple[np.ndarray, int]:
    """Dense codes as the compiled coder gives them: the row of the first record with the same content."""
    first: dict[int, int] = {}
    codes = [first.setdefault(c, row) for row, c in enumerate(contents)]
    return np.asarray(codes, dtype=np.int64), len(contents)


def _both_rows(
    expected: Sequence[int],
    found: Sequence[int],
    lookahead: Sequence[int],
    mapping: Sequence[tuple[int, int]],
    expected_offsets: Sequence[int],
) -> tuple[Rows, Rows]:
    """The same partition with dense codes and with arbitrary 16-byte keys (contents as the test's ints)."""
    codes, bound = _dense([*expected, *lookahead, *found])
    zero = np.zeros(len(codes), dtype=np.int64)
    dense = hashes(codes, zero)
    n_e, n_l = len(expected), len(lookahead)
    raw = np.asarray([*expected, *lookahead, *found], dtype=np.int64)
    sparse = hashes(raw * 7919 - 3, raw ^ 0x5DEECE66D)  # equal exactly when the contents are
    common: dict[str, Any] = {
        "expected_offsets": np.asarray(expected_offsets, dtype=np.int64),
        "found_offsets": np.arange(1_000, 1_000 + len(found), dtype=np.int64),
        "map_source": np.asarray([m[0] for m in mapping], dtype=np.int64),
        "map_destination": np.asarray([m[1] for m in mapping], dtype=np.int64),
    }
    with_codes = Rows(
        expected_hashes=dense[:n_e],
        lookahead_hashes=dense[n_e : n_e + n_l],
        found_hashes=dense[n_e + n_l :],
        code_bound=bound,
        **common,
    )
    with_keys = Rows(
        expected_hashes=sparse[:n_e],
        lookahead_hashes=sparse[n_e : n_e + n_l],
        found_hashes=sparse[n_e + n_l :],
        **common,
    )
    return with_codes, with_keys


def _all_equal(rows: tuple[Rows, Rows], leading: Leading, start: int, end: int) -> Outcome:
    """Classify three ways (compiled codes, sorted codes, sorted keys), assert equal outcomes, return one."""
    with_codes, with_keys = rows
    compiled = classify(with_codes, leading, start, end, compiled=True)
    assert classify(with_codes, leading, start, end, compiled=False) == compiled
    assert classify(with_keys, leading, start, end) == compiled
    return compiled


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
        ([], {"missing": 5}),
    ],
    ids=["clean", "duplicate", "missing", "altered", "swapped", "foreign", "foreign-at-end", "reversed", "none"],
)
def test_the_fault_cases_give_the_same_outcome_both_ways(found: list[int], faults: dict[str, int]) -> None:
    outcome = _all_equal(_both_rows([1, 2, 3, 4, 5], found, [6, 7], [], [0, 2, 4, 6, 8]), Leading.COUNT, 0, 10)
    assert {k: v for k, v in outcome.content.as_dict().items() if v and k != "found"} == faults


def test_repeats_lookahead_leading_and_compacted_mappings_give_the_same_outcome_both_ways() -> None:
    # Repeated contents; copies of lookahead records; leading copies; a mapping of a compacted source offset (2).
    rows = _both_rows([1, 1, 3], [8, 1, 1, 1, 9, 3, 4], [4], [(0, 1_001), (2, 1_002), (4, 1_003)], [0, 1, 4])
    for leading in Leading:
        _all_equal(rows, leading, 0, 5)


def test_codes_outside_the_bound_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        _pairs.match(np.asarray([0, 3], dtype=np.int64), np.asarray([0], dtype=np.int64), 3)
    with pytest.raises(RuntimeError, match="dense codes"):
        classify(_both_rows([1], [1], [], [], [0])[1], Leading.COUNT, 0, 1, compiled=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=30), st.lists(st.integers(-2, 33), max_size=30))
def test_offsets_are_located_as_numpy_finds_them(haystack: list[int], needles: list[int]) -> None:
    hay = np.asarray(sorted(haystack), dtype=np.int64)  # with repeats: the first equal entry counts
    for order in (sorted(needles), needles):  # merged, and searched where they do not ascend
        wanted = np.asarray(order, dtype=np.int64)
        at = np.searchsorted(hay, wanted)
        present = [bool(a < len(hay) and hay[a] == w) for a, w in zip(at.tolist(), order, strict=True)]
        expected = [a if p else -1 for a, p in zip(at.tolist(), present, strict=True)]
        assert _pairs.locate(hay, wanted).tolist() == expected


_contents = st.lists(st.integers(0, 6), max_size=40)


@st.composite
def _partitions(draw: st.DrawFn) -> tuple[tuple[Rows, Rows], Leading, int, int]:
    expected = draw(_contents)
    # Copies: the expected records edited (dropped, duplicated, altered, foreign inserted), then a few moved.
    found: list[int] = []
    for c in expected:
        edit = draw(st.sampled_from(["keep"] * 6 + ["drop", "dup", "alter", "foreign"]))
        if edit == "keep":
            found.append(c)
        elif edit == "dup":
            found += [c, c]
        elif edit == "alter":
            found.append(draw(st.integers(0, 9)))
        elif edit == "foreign":
            found += [draw(st.integers(7, 9)), c]
    lookahead = draw(st.lists(st.integers(0, 9), max_size=5))
    found += lookahead[: draw(st.integers(0, len(lookahead)))]
    for _ in range(draw(st.integers(0, 3))):
        if len(found) > 1:
            i, j = draw(st.integers(0, len(found) - 1)), draw(st.integers(0, len(found) - 1))
            found[i], found[j] = found[j], found[i]
    # Sparse, ascending source offsets; some expected records compacted away (gone) after they were mapped.
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(expected), max_size=len(expected)))
    offsets = np.cumsum(gaps).tolist() if gaps else []
    kind = draw(st.sampled_from(["none", "faithful", "shuffled", "compacted"]))
    mapping: list[tuple[int, int]] = []
    if kind != "none":
        destinations = list(range(1_000, 1_000 + len(found)))
        if kind == "shuffled":
            destinations = draw(st.permutations(destinations))
        mapping = list(zip(offsets, destinations, strict=False))
        if kind == "compacted" and expected:
            gone = draw(st.sets(st.integers(0, len(expected) - 1), max_size=3))
            keep = [n for n in range(len(expected)) if n not in gone]
            expected = [expected[n] for n in keep]
            offsets = [offsets[n] for n in keep]
    end = (offsets[-1] + 1) if offsets else 1
    rows = _both_rows(expected, found, lookahead, sorted(mapping), offsets)
    return rows, draw(st.sampled_from(list(Leading))), 0, end


@settings(max_examples=300, deadline=None)
@given(_partitions())
def test_random_partitions_give_the_same_outcome_both_ways(case: tuple[tuple[Rows, Rows], Leading, int, int]) -> None:
    rows, leading, start, end = case
    _all_equal(rows, leading, start, end)
