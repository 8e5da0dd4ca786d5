"""Staging partitions held at a record the destination refuses: pure bookkeeping, no I/O.

A record the destination refuses (too large, its timestamp, no key for a compacted topic) fails every
transaction that holds it. Every staging partition's records share the transaction, so before holds one
such record stopped the whole flow. Now the failed transaction is aborted and rewound as any other, and the
staging partition that carried the record (found from the destination partition the refusal names) is
paused at its committed offset: nothing of it is read, decided or written while it is held, and the other
staging partitions go on. A source partition has exactly one staging partition, so a hold keeps the source
partitions of that staging partition (about one in ``staging_partitions``) in order, and skips nothing.

A hold is retried by a probe (``due``): the partition is sought back to its committed offset and resumed, so
its next transaction carries the refused record again. The probe either fails like the first try (the
partition is held again, the next probe later: ``RETRY_S`` doubling up to ``RETRY_MAX_S``) or commits past
the staging offset the failed transaction had reached (``committed``): the destination takes the record now,
and the hold is released. Exactly-once never rests on this bookkeeping: a hold only stops reading, and the
abort and rewind to the last commit are the same as for any failed transaction. A hold that is lost (a
rebalance, a restart, a replaced consumer) costs one more failed transaction, which holds the partition again.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ferryman.v1 import control_pb2

#: First retry of a held partition; each failed probe doubles it, up to RETRY_MAX_S.
RETRY_S = 5.0
#: Slowest retry: a probe aborts the transaction of every partition with it, so it is rare once the hold is old.
RETRY_MAX_S = 60.0


@dataclass
class Hold:
    """One staging partition held at a refused record."""

    staging_partition: int
    refused: control_pb2.RefusedRecord
    reason: str
    """What the destination refuses and what takes it (the refusal's text)."""
    through: int
    """Staging offset the failed transaction had read to (next offset): a commit past it wrote the record."""
    retry_at: float
    """Monotonic time of the next probe."""
    backoff_s: float = RETRY_S
    probing: bool = False
    """Resumed for a probe: read again from its committed offset."""
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    """Wall time the partition was first held, milliseconds since the epoch (status)."""

    def status(self, source_partitions: list[control_pb2.HeldSourcePartition]) -> control_pb2.HeldStagingPartition:
        """The hold as the deduper's status shows it."""
        return control_pb2.HeldStagingPartition(
            staging_partition=self.staging_partition,
            refused_record=self.refused,
            reason=self.reason,
            held_since_ms=self.since_ms,
            source_partitions=source_partitions,
        )


class RefusalHolds:
    """Held staging partitions of one deduper (its loop thread only)."""

    def __init__(self) -> None:
        self._holds: dict[int, Hold] = {}
        self.paused: set[int] = set()
        """Staging partitions that must not be read now: held, not probing (checked per staging record)."""

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, sp: object) -> bool:
        return sp in self._holds

    def hold(
        self, sp: int, refused: control_pb2.RefusedRecord, reason: str, through: int, now: float
    ) -> tuple[Hold, bool]:
        """Hold sp at a refused record (again, if a probe met it again: the next probe waits twice as long).

        Returns:
            The hold, and whether it is new (sp was not held).
        """
        self.paused.add(sp)
        old = self._holds.get(sp)
        if old is None:
            hold = self._holds[sp] = Hold(sp, refused, reason, through, now + RETRY_S)
            return hold, True
        old.backoff_s = min(RETRY_MAX_S, old.backoff_s * 2) if old.probing else old.backoff_s
        old.retry_at = now + old.backoff_s
        old.probing = False
        old.refused, old.reason = refused, reason
        old.through = max(old.through, through)
        return old, False

    def due(self, now: float) -> list[int]:
        """Held partitions whose probe is due."""
        return sorted(sp for sp, h in self._holds.items() if not h.probing and now >= h.retry_at)

    def probing(self, sp: int) -> None:
        """Mark sp resumed: sought back to its committed offset."""
        self._holds[sp].probing = True
        self.paused.discard(sp)

    def committed(self, offsets: Mapping[int, int]) -> list[Hold]:
        """A transaction committed these staging offsets (next offset per partition).

        Returns:
            The holds it released: probing, and committed at or past where the failed transaction had read.
        """
        released = [h for sp, h in self._holds.items() if h.probing and sp in offsets and offsets[sp] >= h.through]
        for h in released:
            del self._holds[h.staging_partition]
        return released

    def drop(self, sps: Collection[int]) -> None:
        """Forget the holds of sps: they left this deduper (revoked, lost, or its consumer replaced).

        Whoever reads them next meets the refusal itself.
        """
        for sp in sps:
            self._holds.pop(sp, None)
            self.paused.discard(sp)

    def clear(self) -> None:
        """Forget every hold."""
        self._holds.clear()
        self.paused.clear()

    def holds(self) -> list[Hold]:
        """Every hold, by staging partition."""
        return sorted(self._holds.values(), key=lambda h: h.staging_partition)  # status: any thread
