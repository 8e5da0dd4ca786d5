"""Gap bookkeeping: which source records each partition waits for, and when to ask for them.

Pure logic, no I/O. The deduper loop reports what its dedup decisions imply
(a gap seen, an envelope accepted) and the clock; the tracker says which gaps
are due for a resend request. A gap is only forgotten once the watermark has
reached its end: an envelope that fills the start of a gap (a resend answer
that covers what was asked, while more of the gap was seen in the meantime)
shrinks it and, if what was asked for has arrived, makes the rest due at once.
A quiet source would otherwise never reveal what is still missing.
"""

from __future__ import annotations

import copy
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2


@dataclass
class Gap:
    """Source records of one partition that have not arrived: offsets missing_from..missing_to (inclusive)."""

    source: envelope_pb2.SourcePartition
    missing_from: int
    missing_to: int
    requested_to: int = -1
    """Last offset of the newest resend request for this gap, -1 if never asked."""
    requested_at: float | None = None
    """Monotonic time of the newest resend request; None: due now."""
    attempts: int = 0
    """Resend requests made since missing_from last moved (each repeat goes to another wrapper)."""
    first_missing: int = field(init=False)
    """missing_from when the gap opened (missing_from moves up as the gap is filled)."""
    opened_at_ms: int = field(init=False)
    """Wall time the gap opened, milliseconds since the epoch (for status)."""
    lost_to: int = -1
    """When >= missing_from: the source no longer holds missing_from..lost_to (a resend answer said so)."""

    def __post_init__(self) -> None:
        self.first_missing = self.missing_from
        self.opened_at_ms = int(time.time() * 1000)

    def mark_requested(self, now: float) -> None:
        """A resend request for missing_from..missing_to went out at now."""
        self.requested_at = now
        self.requested_to = self.missing_to
        self.attempts += 1


class Filled(enum.Enum):
    """What an accepted envelope did to the gap of its partition."""

    NO_GAP = "no_gap"
    """The partition had no open gap."""
    CLOSED = "closed"
    """The watermark reached the end of the gap: it is gone."""
    SHRUNK = "shrunk"
    """The gap now starts after the new watermark; the rest of a request's answer is still to come."""
    REST_DUE = "rest_due"
    """The gap now starts after the new watermark and everything asked for so far is here: the rest is due now."""


class GapTracker:
    """Open gaps per source partition (the deduper loop thread only)."""

    def __init__(self) -> None:
        self._gaps: dict[PartitionKey, Gap] = {}

    def __len__(self) -> int:
        return len(self._gaps)

    def get(self, key: PartitionKey) -> Gap | None:
        """The open gap of key, if any."""
        return self._gaps.get(key)

    def note(self, key: PartitionKey, source: envelope_pb2.SourcePartition, missing_from: int, missing_to: int) -> bool:
        """An envelope of key could not be accepted: records missing_from..missing_to are missing.

        Returns:
            True if this opens a new gap (none was open, or the open one started
            elsewhere, e.g. after a topic reset); False if it extends the open one.
        """
        gap = self._gaps.get(key)
        if gap is None or gap.missing_from != missing_from:
            self._gaps[key] = Gap(source, missing_from, missing_to)
            return True
        gap.missing_to = max(gap.missing_to, missing_to)
        return False

    def accepted(self, key: PartitionKey, watermark: int) -> tuple[Filled, Gap | None]:
        """An envelope of key was accepted and moved its watermark to watermark.

        Returns:
            What happened to the gap, and the gap as it was before (None if
            there was none). A gap that is still open afterwards starts at
            watermark + 1 and, once the newest request's range has arrived, is
            due for a request for the rest at once.
        """
        gap = self._gaps.get(key)
        if gap is None:
            return Filled.NO_GAP, None
        before = copy.copy(gap)
        if watermark >= gap.missing_to:
            del self._gaps[key]
            return Filled.CLOSED, before
        if watermark + 1 > gap.missing_from:
            gap.missing_from = watermark + 1
            gap.attempts = 0
        if watermark < gap.requested_to:
            return Filled.SHRUNK, before
        gap.requested_at = None
        return Filled.REST_DUE, before

    def lost(self, key: PartitionKey, from_offset: int, deleted_before: int) -> Gap | None:
        """A resend answer said the source log of key now starts at deleted_before, above from_offset.

        Returns:
            The gap, marked lost up to deleted_before - 1 (capped at its end), if it is still open
            and the answer concerns its start; None otherwise (a stale answer).
        """
        gap = self._gaps.get(key)
        if gap is None or from_offset > gap.missing_from or deleted_before <= gap.missing_from:
            return None
        gap.lost_to = min(gap.missing_to, deleted_before - 1)
        return gap

    def items(self) -> list[tuple[PartitionKey, Gap]]:
        """Every open gap, by partition."""
        return sorted(self._gaps.items())

    def due(self, now: float, retry_s: float) -> list[tuple[PartitionKey, Gap]]:
        """Gaps to ask for now: never asked, due at once, or asked retry_s ago without an answer that closed them."""
        return [
            (key, gap)
            for key, gap in self._gaps.items()
            if gap.requested_at is None or now - gap.requested_at >= retry_s
        ]

    def drop(self, which: Callable[[PartitionKey], bool]) -> None:
        """Forget the gaps of the partitions which selects (another deduper owns them now)."""
        for key in [k for k in self._gaps if which(k)]:
            del self._gaps[key]

    def clear(self) -> None:
        """Forget every gap (a rewind: they are found again as staging is re-read)."""
        self._gaps.clear()
