"""The two alignments of one source partition's records with their copies, and what each finds.

Pure functions over numpy columns: each audit task hands its partition's rows to
``classify`` on an executor. Records are compared by a 16-byte content key: two
int64 columns that are equal exactly when key, value, headers, timestamp and
timestamp type are (``_identity``: exact codes, nulls told apart from empty
values; the "hashes" below are those keys).

*By content* (works without the offset map): the k-th copy of a content at the
destination is the k-th occurrence of that content in the expected records.
Unmatched records are then placed in the gaps between matched ones: in one gap,
an expected record and a destination record of unknown content are one
**altered** record; expected records left over are **missing**; destination
records left over are **duplicated** when their content is expected, else
**unexpected**. Destination records after the last match that are copies of
source records past the range (the lookahead) belong to a later audit.

*By the offset map*: each expected record's mapped destination offset is looked
up; a copy with other content is altered, no mapping or no copy is missing, and
destination records no mapping points at are duplicated or unexpected as above.

**Reordered** counts, in both, the fewest records that must move to restore the
source order (records minus the longest run in order).

Keys are paired by sorting both sides' keys together, unless they are dense
codes (``Rows.code_bound``, what the compiled coder gives) and the compiled
pairings (``_pairs``) are built: occurrences are then counted in arrays indexed
by code, in linear time, and the map's offsets are found by merging. Both find
the same pairs (a unit test holds the two paths' outcomes equal on random
inputs). Where an order is already known (each side's offsets ascend), nothing
is sorted again.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, fields
from enum import IntEnum

import numpy as np
import numpy.typing as npt

try:
    from ferryman_auditor import _pairs
except ImportError:  # not built (no C compiler at install): keys are paired by sorting
    _pairs = None  # type: ignore[assignment]

Int64s = npt.NDArray[np.int64]

#: Which pairing ``classify`` takes for dense codes, for logs.
PAIRING = "compiled (_pairs)" if _pairs is not None else "sorting (the compiled pairing is not built)"


class Side(IntEnum):
    """What a row handed to ``classify`` is."""

    EXPECTED = 0
    """A source record in the range."""
    FOUND = 1
    """A destination record in the window."""
    LOOKAHEAD = 2
    """A source record past the range, whose copy may already be in the window."""
    MAPPED = 3
    """An offset-map entry: ``offset`` is the source offset, ``mapped`` the destination offset."""


class Leading(IntEnum):
    """What destination records before the first match are, when they match nothing expected."""

    COUNT = 0
    """Faults like any other: the window starts exactly where the range's copies start."""
    UNVERIFIABLE = 1
    """Copies of source records retention or compaction removed: reported apart."""
    IGNORE = 2
    """Copies of records before an explicit range: outside the audit."""


@dataclass(frozen=True)
class Counts:
    """What one alignment found in one partition."""

    found: int = 0
    missing: int = 0
    duplicated: int = 0
    reordered: int = 0
    altered: int = 0
    unexpected: int = 0
    unverifiable: int = 0

    def faults(self) -> tuple[int, int, int, int, int]:
        """(missing, duplicated, reordered, altered, unexpected): what two alignments must agree on."""
        return (self.missing, self.duplicated, self.reordered, self.altered, self.unexpected)

    def as_dict(self) -> dict[str, int]:
        """The counts by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Rows:
    """One partition's rows, by side, each sorted by offset."""

    expected_offsets: Int64s
    expected_hashes: npt.NDArray[np.void]
    found_offsets: Int64s
    found_hashes: npt.NDArray[np.void]
    lookahead_hashes: npt.NDArray[np.void]
    map_source: Int64s
    map_destination: Int64s
    code_bound: int | None = None
    """When set, every key is a dense code: its second half is 0 and its first half lies in ``[0, code_bound)``
    (the compiled coder's row numbers). The keys can then be paired without sorting."""


@dataclass(frozen=True)
class Outcome:
    """Both alignments of one partition, and where the next incremental audit starts at the destination."""

    content: Counts
    by_map: Counts | None
    """None when the partition has no offset-map entries for its expected records."""
    next_destination_offset: int
    """First destination offset not accounted for (copies of lookahead records start there), or -1: the window end."""
    samples: dict[str, list[int]]
    """A few offsets of each kind of fault (source offsets for missing/altered, destination ones otherwise)."""


#: Offsets kept per kind of fault in a report (enough to start looking, small in a compacted record).
SAMPLES = 10


def hashes(h1: npt.ArrayLike, h2: npt.ArrayLike) -> npt.NDArray[np.void]:
    """One 16-byte key per record from its two 64-bit content hashes (comparable and sortable as a whole)."""
    pair = np.empty(len(np.asarray(h1)), dtype=[("a", "<i8"), ("b", "<i8")])
    pair["a"], pair["b"] = h1, h2
    return pair.view("V16")


def classify(
    rows: Rows, leading: Leading, range_start: int, range_end: int, *, compiled: bool | None = None
) -> Outcome:
    """Align one partition both ways and count what each finds.

    ``[range_start, range_end)`` is the audited source range: offset-map entries
    inside it whose source record is gone (compacted away since it was copied)
    make their copies unverifiable, in both alignments. ``compiled``: the compiled
    pairings (True: ``_pairs`` must be built and the keys dense codes), numpy's
    sorts and searches (False: the reference), or the compiled ones where they
    apply (None: dense codes are paired compiled, offsets always looked up so).

    Raises:
        RuntimeError: the compiled pairing was asked for and is not built, or the keys are not dense codes.
    """
    if compiled and (_pairs is None or rows.code_bound is None):
        raise RuntimeError("the compiled pairing needs ferryman_auditor._pairs built and dense codes (code_bound)")
    bound = rows.code_bound if compiled is not False and _pairs is not None else None
    by_map, gone = _by_map(rows, range_start, range_end, bound, compiled is not False)
    content, next_destination, samples = _by_content(rows, leading, gone, bound)
    return Outcome(content, by_map, next_destination, samples)


def _halves(keys: npt.NDArray[np.void]) -> tuple[Int64s, Int64s]:
    """The two 64-bit hashes of each 16-byte key, as int64 columns (numpy sorts those fast, void keys ~100x slower)."""
    pairs = np.ascontiguousarray(keys).view(np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _key_runs(*sides: npt.NDArray[np.void]) -> tuple[Int64s, Int64s, Int64s]:
    """The keys of every side together, grouped by key.

    Returns ``(order, side, run)``: the positions of the concatenated keys in
    key order, the side each of them comes from, and the number of its key's
    run (equal keys, consecutive). The sort is stable, so within a run the
    sides come in argument order, each in its own order.
    """
    a, b = (np.concatenate(h) for h in zip(*(_halves(k) for k in sides), strict=True))
    order = np.lexsort((b, a))
    sa, sb = a[order], b[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    side = np.repeat(np.arange(len(sides), dtype=np.int64), [len(k) for k in sides])[order]
    return order.astype(np.int64), side, np.cumsum(starts) - 1


def _codes(keys: npt.NDArray[np.void]) -> Int64s:
    """The dense codes of keys (their first halves), contiguous."""
    return np.ascontiguousarray(_halves(keys)[0])


def _isin(keys: npt.NDArray[np.void], pool: npt.NDArray[np.void], bound: int | None = None) -> npt.NDArray[np.bool_]:
    """For each key, whether pool holds an equal key (``bound``: the keys are dense codes below it)."""
    if not len(keys) or not len(pool):
        return np.zeros(len(keys), dtype=bool)
    if bound is not None:
        held = np.zeros(bound, dtype=bool)
        held[_codes(pool)] = True
        out: npt.NDArray[np.bool_] = held[_codes(keys)]
        return out
    order, side, run = _key_runs(pool, keys)
    pooled = np.zeros(int(run[-1]) + 1, dtype=bool)
    pooled[run[side == 0]] = True
    out = np.empty(len(order), dtype=bool)
    out[order] = pooled[run]
    return out[len(pool) :]


def _match(left: npt.NDArray[np.void], right: npt.NDArray[np.void], bound: int | None = None) -> tuple[Int64s, Int64s]:
    """Indices (i, j) pairing the k-th occurrence of a key in left with its k-th occurrence in right.

    ``bound``: the keys are dense codes below it, paired by the compiled pairing (i then ascends).
    """
    if not len(left) or not len(right):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if bound is not None and _pairs is not None:
        return _pairs.match(_codes(left), _codes(right), bound)
    order, side, run = _key_runs(left, right)
    n = len(order)
    # Within a run the left keys come first, then the right ones, each in input order: number them per side.
    group_starts = np.ones(n, dtype=bool)
    group_starts[1:] = (run[1:] != run[:-1]) | (side[1:] != side[:-1])
    occurrence = np.arange(n) - np.maximum.accumulate(np.where(group_starts, np.arange(n), 0))
    in_left = np.bincount(run[side == 0], minlength=int(run[-1]) + 1)
    in_right = np.bincount(run[side == 1], minlength=int(run[-1]) + 1)
    # Occurrence k pairs with occurrence k on the other side, if that side has k + 1 of the key. Both
    # selections list (run, k) in the same order, so they pair up position by position.
    i = order[(side == 0) & (occurrence < in_right[run])]
    j = order[(side == 1) & (occurrence < in_left[run])] - len(left)
    return i, j


def out_of_order(sequence: Int64s) -> int:
    """The fewest elements to move so that sequence increases: its length minus its longest increasing run."""
    if len(sequence) < 2 or bool(np.all(sequence[1:] > sequence[:-1])):
        return 0
    tails: list[int] = []
    for x in sequence.tolist():
        at = bisect.bisect_left(tails, x)
        if at == len(tails):
            tails.append(x)
        else:
            tails[at] = x
    return len(sequence) - len(tails)


def _leftovers(
    unmatched_expected_gaps: Int64s, other_found_gaps: Int64s, n_gaps: int
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Which unmatched expected and found records pair up as altered (the first of each gap, in order)."""
    ce = np.bincount(unmatched_expected_gaps, minlength=n_gaps)
    cf = np.bincount(other_found_gaps, minlength=n_gaps)
    pairs = np.minimum(ce, cf)
    return _first_per_gap(unmatched_expected_gaps, pairs), _first_per_gap(other_found_gaps, pairs)


def _first_per_gap(gaps: Int64s, take: Int64s) -> npt.NDArray[np.bool_]:
    """Mask of the first take[g] entries of each gap g (gaps are sorted)."""
    if not len(gaps):
        return np.zeros(0, dtype=bool)
    first = np.searchsorted(gaps, gaps, side="left")
    return (np.arange(len(gaps)) - first) < take[gaps]


def _ascending(values: Int64s) -> bool:
    """Whether values never decrease (a stable sort by them changes nothing)."""
    return len(values) < 2 or bool(np.all(values[1:] >= values[:-1]))


def _by_content(
    rows: Rows, leading: Leading, gone: npt.NDArray[np.bool_], bound: int | None
) -> tuple[Counts, int, dict[str, list[int]]]:
    eo, eh, fo, fh = rows.expected_offsets, rows.expected_hashes, rows.found_offsets, rows.found_hashes
    ei, fi = _match(eh, fh, bound)
    if not _ascending(ei):  # the sorting pairing lists pairs by key; the compiled one by expected record already
        order = np.argsort(ei, kind="stable")  # expected offsets ascend: their order is the records' order
        ei, fi = ei[order], fi[order]
    reordered = out_of_order(fo[fi])
    matched_e = np.zeros(len(eo), dtype=bool)
    matched_e[ei] = True
    matched_f = np.zeros(len(fo), dtype=bool)
    matched_f[fi] = True
    matched_f_offsets = fo[matched_f]  # destination offsets ascend: masked, they stay sorted
    last_match = int(matched_f_offsets[-1]) if len(fi) else -1
    first_match = int(matched_f_offsets[0]) if len(fi) else None

    # Destination records past the last match that copy lookahead records belong to a later audit.
    f_left = np.flatnonzero(~matched_f)
    trailing = f_left[fo[f_left] > last_match]
    deferred = np.zeros(len(fo), dtype=bool)
    if len(trailing) and len(rows.lookahead_hashes):
        ti, _li = _match(fh[trailing], rows.lookahead_hashes, bound)
        deferred[trailing[ti]] = True
    next_destination = int(fo[deferred].min()) if deferred.any() else -1
    # Accounted destination records must end before the first deferred one: copies come in order.
    if next_destination >= 0:
        deferred |= fo >= next_destination
        deferred &= ~matched_f

    unverifiable = int((gone & ~matched_f & ~deferred).sum())
    f_left = np.flatnonzero(~matched_f & ~deferred & ~gone)
    if leading is not Leading.COUNT:
        before = fo[f_left] < (first_match if first_match is not None else np.iinfo(np.int64).max)
        if leading is Leading.UNVERIFIABLE:
            unverifiable += int(before.sum())
        f_left = f_left[~before]

    dup = _isin(fh[f_left], eh, bound)
    others = f_left[~dup]
    e_left = np.flatnonzero(~matched_e)
    matched_e_offsets = eo[matched_e]
    e_gaps = np.searchsorted(matched_e_offsets, eo[e_left]).astype(np.int64)
    f_gaps = np.searchsorted(matched_f_offsets, fo[others]).astype(np.int64)
    altered_e, altered_f = _leftovers(e_gaps, f_gaps, len(ei) + 1)
    counts = Counts(
        found=len(ei),
        missing=int((~altered_e).sum()),
        duplicated=int(dup.sum()),
        reordered=reordered,
        altered=int(altered_e.sum()),
        unexpected=int((~altered_f).sum()),
        unverifiable=unverifiable,
    )
    samples = {
        "missing": eo[e_left[~altered_e]][:SAMPLES].tolist(),
        "altered": eo[e_left[altered_e]][:SAMPLES].tolist(),
        "duplicated": fo[f_left[dup]][:SAMPLES].tolist(),
        "unexpected": fo[others[~altered_f]][:SAMPLES].tolist(),
    }
    if reordered:
        samples["reordered"] = _moved(fo[fi])[:SAMPLES]
    return counts, next_destination, {k: v for k, v in samples.items() if v}


def _moved(sequence: Int64s) -> list[int]:
    """Elements of sequence that are smaller than an element before them (where the order breaks)."""
    running_max = np.maximum.accumulate(sequence)
    moved: list[int] = sequence[1:][sequence[1:] < running_max[:-1]].tolist()
    return moved


def _equal(left: npt.NDArray[np.void], i: Int64s, right: npt.NDArray[np.void], j: Int64s) -> npt.NDArray[np.bool_]:
    """left[i] == right[j], key by key (compared as int64 halves: numpy compares void keys ~10x slower)."""
    la, lb = _halves(left)
    ra, rb = _halves(right)
    out: npt.NDArray[np.bool_] = (la[i] == ra[j]) & (lb[i] == rb[j])
    return out


def _locate(haystack: Int64s, needles: Int64s, compiled: bool) -> Int64s:
    """Each needle's position in the ascending haystack, or -1 where no entry equals it."""
    if compiled and _pairs is not None:
        return _pairs.locate(np.ascontiguousarray(haystack), np.ascontiguousarray(needles))
    at = np.searchsorted(haystack, needles)
    clipped = np.minimum(at, max(len(haystack) - 1, 0))
    hit = (at < len(haystack)) & (haystack[clipped] == needles) if len(haystack) else np.zeros(len(at), bool)
    out: Int64s = np.where(hit, at, -1).astype(np.int64)
    return out


def _by_map(
    rows: Rows, range_start: int, range_end: int, bound: int | None, compiled: bool
) -> tuple[Counts | None, npt.NDArray[np.bool_]]:
    """The map alignment, and which destination records copy source records that are gone."""
    eo, eh, fo, fh = rows.expected_offsets, rows.expected_hashes, rows.found_offsets, rows.found_hashes
    ms, md = rows.map_source, rows.map_destination
    at_e = _locate(eo, ms, compiled)  # each mapping's expected record, or -1
    at_f = _locate(fo, md, compiled)  # each mapping's copy in the window, or -1
    in_range = at_e >= 0
    # Mappings of source offsets in the range with no source record: compacted away since they were copied.
    gone = (~in_range) & (ms >= range_start) & (ms < range_end)
    gone_copies = np.zeros(len(fo), dtype=bool)
    gone_copies[at_f[gone & (at_f >= 0)]] = True
    if not in_range.any():
        return None, gone_copies
    e_pos, f_pos = at_e[in_range], at_f[in_range]
    copied = f_pos >= 0
    same = np.zeros(len(e_pos), dtype=bool)
    same[copied] = _equal(eh, e_pos[copied], fh, f_pos[copied])
    mapped_e = np.zeros(len(eo), dtype=bool)
    mapped_e[e_pos[copied]] = True
    copied_destinations = md[in_range][copied]
    copied_sources = ms[in_range][copied]
    if not _ascending(copied_sources):  # the map's entries come sorted by source offset: then nothing to sort
        copied_destinations = copied_destinations[np.argsort(copied_sources, kind="stable")]
    reordered = out_of_order(copied_destinations)
    loose = np.ones(len(fo), dtype=bool)
    loose[at_f[at_f >= 0]] = False
    dup = _isin(fh[loose], eh, bound)
    counts = Counts(
        found=int(same.sum()),
        missing=int((~mapped_e).sum()),
        duplicated=int(dup.sum()),
        reordered=reordered,
        altered=int((copied & ~same).sum()),
        unexpected=int((~dup).sum()),
        unverifiable=int(gone_copies.sum()),
    )
    return counts, gone_copies
