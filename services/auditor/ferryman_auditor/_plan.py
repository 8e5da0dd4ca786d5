"""What one audit reads: per source partition, the source range, its lookahead and the destination window.

The order of the reads is what makes an incremental audit sound while the flow
runs (the deduper commits records and watermarks in one transaction, and a
partition's watermark only grows):

1. the offset map's end (the next run reads the map from there: every mapping
   below it belongs to a record at or below the watermark read next);
2. the flow's committed watermarks ``W1``: the range ends at ``W1 + 1``, so
   every expected record's copy is already committed;
3. the destination's ends: the window holds every expected copy, and perhaps
   copies of records past the range that were committed since step 2;
4. the watermarks again, ``W2``: source records in ``(W1, W2]`` are read as a
   lookahead, so those copies are recognised and left to the next audit
   instead of being reported as unexpected.

"Committed" is not "visible everywhere at once": the coordinator writes a
transaction's markers partition by partition after its decision, so a
watermark can be visible while the same transaction's copies, or its
watermark while its offset-map records, are not yet. So reads 2, 3 and 4
each first wait until no transaction begun before them is open on the
partitions they read (``ferryman.topics.settled_ends``): whatever the
previous read saw committed is then visible to this one. A running flow's
open transaction ends within its interval; a dead deduper's holds the audit
until the coordinator aborts it, and past the audit's budget the planning
fails (transient: the next run plans again).

A source without a committed watermark (no state topic: the flow was never
run, or the audit compares topics the flow did not write) is expected whole,
up to its last stable offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ferryman_auditor._align import Leading


@dataclass(frozen=True)
class AuditRange:
    """What an audit checks."""

    kind: Literal["since-last", "offsets", "time"] = "since-last"
    """``since-last``: from the last verified position (the beginning on a first run) to what is committed;
    ``offsets``: explicit source offsets; ``time``: source records with timestamps in a window."""
    start_offsets: Mapping[int, int] | None = None
    """``offsets``: first source offset per partition (absent partitions: the beginning)."""
    end_offsets: Mapping[int, int] | None = None
    """``offsets``: end (exclusive) per partition (absent partitions: what is committed)."""
    start_ms: int | None = None
    """``time``: records at or after this time (ms since the epoch)."""
    end_ms: int | None = None
    """``time``: records before this time (None: up to what is committed)."""
    topics: tuple[str, ...] | None = None
    """Source topics to audit (None: every topic of the flow)."""

    def describe(self) -> dict[str, object]:
        """The range as plain data, for reports."""
        out: dict[str, object] = {"kind": self.kind}
        if self.start_offsets is not None:
            out["start_offsets"] = {str(k): v for k, v in self.start_offsets.items()}
        if self.end_offsets is not None:
            out["end_offsets"] = {str(k): v for k, v in self.end_offsets.items()}
        if self.start_ms is not None:
            out["start_ms"] = self.start_ms
        if self.end_ms is not None:
            out["end_ms"] = self.end_ms
        if self.topics is not None:
            out["topics"] = list(self.topics)
        return out


@dataclass(frozen=True)
class PartitionPlan:
    """What to read for one source partition."""

    topic: str
    """Source topic."""
    partition: int
    """Partition number (the same at both ends)."""
    destination_topic: str
    """Where the flow copies the topic."""
    range_start: int
    """First source offset of the audited range (may be below the source's low watermark)."""
    source_start: int
    """First source offset read: range_start, or the low watermark if retention removed what was before it."""
    range_end: int
    """End of the audited range (exclusive)."""
    source_end: int
    """End of the source records read as expected (range_end, or source_start if that is past it)."""
    lookahead_end: int
    """End of the lookahead read after the range (exclusive, at least source_end)."""
    destination_start: int
    """First destination offset of the window."""
    destination_end: int
    """End of the window (exclusive): the destination's last stable offset when planned."""
    leading: Leading
    """What unmatched destination records before the first match are."""

    @property
    def unverifiable_range(self) -> tuple[int, int] | None:
        """Source offsets of the range that retention removed before the audit, if any."""
        end = min(self.source_start, self.range_end)
        return (self.range_start, end) if self.range_start < end else None


def plan_partition(
    *,
    topic: str,
    partition: int,
    destination_topic: str,
    audit_range: AuditRange,
    source_marks: tuple[int, int],
    replicated_end: int,
    lookahead_end: int,
    destination_marks: tuple[int, int],
    checkpoint: tuple[int, int] | None,
    time_offsets: tuple[int, int] | None = None,
) -> PartitionPlan:
    """Plan one source partition (pure: every Kafka answer is an argument).

    Args:
        topic: source topic.
        partition: partition number.
        destination_topic: its copy.
        audit_range: what the audit checks.
        source_marks: the source partition's (low watermark, last stable offset).
        replicated_end: one past the flow's committed watermark W1 (or the last stable offset without state).
        lookahead_end: one past W2 (at least replicated_end).
        destination_marks: the destination partition's (low watermark, last stable offset); (0, 0) if absent.
        checkpoint: (next source offset, next destination offset) of the last since-last audit, if any.
        time_offsets: ``time`` ranges: the source offsets of the window's start and end
            (-1: no record at or after that time).
    """
    low, _stable = source_marks
    dest_low, dest_end = destination_marks
    if audit_range.kind == "since-last":
        start = checkpoint[0] if checkpoint else 0
        end = replicated_end
        if checkpoint is not None:
            dest_start, leading = checkpoint[1], Leading.COUNT
        else:
            dest_start, leading = dest_low, Leading.UNVERIFIABLE if low > 0 else Leading.COUNT
    elif audit_range.kind == "offsets":
        start = (audit_range.start_offsets or {}).get(partition, 0)
        end = min((audit_range.end_offsets or {}).get(partition, replicated_end), replicated_end)
        dest_start = dest_low
        leading = Leading.COUNT if start == 0 and low == 0 else Leading.IGNORE
    else:
        assert time_offsets is not None
        found_start, found_end = time_offsets
        start = replicated_end if found_start < 0 else found_start
        end = replicated_end if found_end < 0 else min(found_end, replicated_end)
        dest_start, leading = dest_low, Leading.IGNORE
    end = max(start, end)
    source_start = max(start, low)
    return PartitionPlan(
        topic=topic,
        partition=partition,
        destination_topic=destination_topic,
        range_start=start,
        range_end=end,
        source_start=source_start,
        source_end=max(end, source_start),
        lookahead_end=max(lookahead_end, end, source_start),
        destination_start=min(max(dest_start, dest_low), dest_end),
        destination_end=dest_end,
        leading=leading,
    )
