"""The independent end-of-run check: source against destination, per partition, from read_committed reads.

It counts, per topic and partition: records missing at the destination, duplicated, reordered,
altered (key, value, headers or timestamp not as written), unexpected (not from the source), and
aborted source records that appeared. It uses nothing of Ferryman: only what the producers wrote
(``records``) and what both clusters hold.

For a compacted topic both sides compact on their own, so the copy is not record for record. The check
then is: every record the destination holds was written to the source and is intact; the
destination's records of a partition are in source order without repeats; a record the source still
holds is at the destination unless the destination holds a later record of the same key; and the
latest state of every key (a tombstone or no record: absent) is the same on both sides.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.chaos.records import ABORTED_PREFIX, ID_HEADER, Content, RecordId, content, is_tombstone

Partitions = Mapping[int, Sequence[Content]]


@dataclass
class Tally:
    """Anomalies found (all must be 0 for a clean verdict)."""

    missing: int = 0
    duplicated: int = 0
    reordered: int = 0
    altered: int = 0
    unexpected: int = 0
    aborted_seen: int = 0
    state_differs: int = 0
    """Keys of a compacted topic whose latest state differs."""

    def add(self, other: Tally) -> None:
        """Add other's counts to this one."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    @property
    def clean(self) -> bool:
        """True when nothing was found."""
        return not any(asdict(self).values())


@dataclass
class TopicResult:
    """The check of one topic."""

    role: str
    source_records: int
    destination_records: int
    tally: Tally = field(default_factory=Tally)
    examples: list[str] = field(default_factory=list)
    """The first few anomalies, readable."""

    def to_json(self) -> dict[str, Any]:
        """As plain JSON data."""
        return {**asdict(self), "clean": self.tally.clean}


_MAX_EXAMPLES = 10


def _rid(c: Content) -> RecordId | None:
    return next((RecordId.decode(v) for k, v in c[2] if k == ID_HEADER), None)


def _aborted(c: Content) -> bool:
    return c[1] is not None and c[1].startswith(ABORTED_PREFIX)


def _intact(c: Content, base_ms: int) -> bool:
    rid = _rid(c)
    return rid is not None and c == content(rid, base_ms)


def check_topic(
    role: str, source: Partitions, destination: Partitions, base_ms: int, *, compacted: bool
) -> TopicResult:
    """Compare one topic's destination with its source (both read_committed, per partition).

    Args:
        role: the topic's role (``records.ROLES``).
        source: what the source holds (for a re-created topic: the old incarnation's records first).
        destination: what the destination holds.
        base_ms: the run's timestamp origin (``records.content``).
        compacted: the topic is compacted (see the module docstring).
    """
    result = TopicResult(role, sum(len(v) for v in source.values()), sum(len(v) for v in destination.values()))
    for p in sorted(set(source) | set(destination)):
        src, dst = list(source.get(p, ())), list(destination.get(p, ()))
        check = _check_compacted if compacted else _check_exact
        tally = check(p, src, dst, base_ms, result)
        result.tally.add(tally)
    return result


def _note(result: TopicResult, partition: int, what: str) -> None:
    if len(result.examples) < _MAX_EXAMPLES:
        result.examples.append(f"{result.role}/{partition}: {what}")


def _common(
    p: int, src: Sequence[Content], dst: Sequence[Content], base_ms: int, result: TopicResult
) -> tuple[Tally, list[int]]:
    """Counts shared by both checks; returns the tally and the destination's indices in order (first copies)."""
    tally = Tally()
    seen: Counter[RecordId | None] = Counter()
    order: list[int] = []
    for c in dst:
        rid = _rid(c)
        seen[rid] += 1
        if rid is None:
            tally.unexpected += 1
            _note(result, p, f"a record without {ID_HEADER}: {c!r:.120}")
            continue
        if seen[rid] > 1:
            tally.duplicated += 1
            _note(result, rid.partition, f"duplicate of index {rid.index}")
            continue
        if _aborted(c):
            tally.aborted_seen += 1
            _note(result, rid.partition, f"aborted record {rid.index} at the destination")
            continue
        if not _intact(c, base_ms):
            tally.altered += 1
            _note(result, rid.partition, f"record {rid.index} altered: {c!r:.160}")
        order.append(rid.index)
    tally.reordered = sum(1 for a, b in itertools.pairwise(order) if b < a)
    if tally.reordered:
        first = next(i for i, (a, b) in enumerate(itertools.pairwise(order)) if b < a)
        _note(result, p, f"out of order at indices {order[first : first + 3]}")
    # Source records must be intact too: otherwise the producers, not Ferryman, are wrong.
    for c in src:
        if not _intact(c, base_ms):
            _note(result, p, f"source record not as written (harness bug?): {c!r:.120}")
    return tally, order


def _check_exact(p: int, src: Sequence[Content], dst: Sequence[Content], base_ms: int, result: TopicResult) -> Tally:
    tally, _ = _common(p, src, dst, base_ms, result)
    src_ids = {_rid(c) for c in src}
    dst_ids = {_rid(c) for c in dst if not _aborted(c)}  # aborted ones are counted as such
    for rid in sorted((i for i in src_ids - dst_ids if i is not None), key=lambda r: r.index):
        tally.missing += 1
        _note(result, rid.partition, f"record {rid.index} missing")
    for extra in dst_ids - src_ids:
        if extra is not None:
            tally.unexpected += 1
            _note(result, extra.partition, f"record {extra.index} not at the source")
    return tally


def _check_compacted(
    p: int, src: Sequence[Content], dst: Sequence[Content], base_ms: int, result: TopicResult
) -> Tally:
    tally, _ = _common(p, src, dst, base_ms, result)
    dst_ids = {rid for c in dst if (rid := _rid(c)) is not None}
    latest_dst_index: dict[bytes | None, int] = {}
    for c in dst:
        rid = _rid(c)
        if rid is not None:
            latest_dst_index[c[0]] = max(latest_dst_index.get(c[0], -1), rid.index)
    for c in src:
        rid = _rid(c)
        if rid is None or rid in dst_ids:
            continue
        if latest_dst_index.get(c[0], -1) > rid.index:
            continue  # compacted away at the destination: a later record of its key is there
        tally.missing += 1
        _note(result, rid.partition, f"record {rid.index} (key {c[0]!r}) missing")
    # A destination record the source no longer holds must have been superseded there.
    src_ids = {rid for c in src if (rid := _rid(c)) is not None}
    latest_src_index: dict[bytes | None, int] = {}
    for c in src:
        rid = _rid(c)
        if rid is not None:
            latest_src_index[c[0]] = max(latest_src_index.get(c[0], -1), rid.index)
    for c in dst:
        rid = _rid(c)
        if rid is not None and rid not in src_ids and latest_src_index.get(c[0], -1) < rid.index:
            tally.unexpected += 1
            _note(result, rid.partition, f"record {rid.index} at the destination, never superseded at the source")
    if _state(src) != _state(dst):
        diff = {k for k in set(_state(src)) | set(_state(dst)) if _state(src).get(k) != _state(dst).get(k)}
        tally.state_differs += len(diff)
        _note(result, p, f"latest state differs for keys {sorted(diff, key=repr)[:5]}")
    return tally


def _state(records: Sequence[Content]) -> dict[bytes | None, Content]:
    """The latest record of each key; a tombstone removes the key."""
    state: dict[bytes | None, Content] = {}
    for c in records:
        if is_tombstone(c):
            state.pop(c[0], None)
        else:
            state[c[0]] = c
    return state
