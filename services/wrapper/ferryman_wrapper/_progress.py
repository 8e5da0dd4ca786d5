"""Which source offsets are safe to commit: acknowledged, in order, no holes."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ferryman.state import PartitionKey


@dataclass
class _Partition:
    committed_next: int
    """Next offset to read according to the last commit (or the start position)."""
    acked_upto: int
    """Highest source offset whose envelope (and every earlier one) is acknowledged."""
    logical_start: int | None = None
    """Logical start (OFFSET_BEGINNING/END) while nothing has been acknowledged yet."""
    in_flight: deque[int] = field(default_factory=deque)
    """Last source offset of each unacknowledged envelope, in send order."""
    failed: bool = False


class ProgressTracker:
    """Tracks envelopes in flight per source partition.

    The idempotent producer acknowledges the envelopes of one staging partition
    in send order, and one source partition maps to one staging partition, so
    acknowledgements of a source partition arrive in order. A failure poisons
    the partition: nothing after it is committed until the wrapper rewinds.
    """

    def __init__(self) -> None:
        self._parts: dict[PartitionKey, _Partition] = {}
        #: Partitions with a failed delivery: any_failed is asked after every consume() batch, and must not
        #: walk every assigned partition to answer (hundreds of them at scale).
        self._failed: set[PartitionKey] = set()

    def start(self, key: PartitionKey, next_offset: int, logical_start: int | None = None) -> None:
        """Begin tracking key from next_offset (a start or rewind position).

        A partition new to the flow starts at a logical offset (beginning or
        end of the log); until something is acknowledged a rewind returns there
        rather than to offset 0, which retention may have deleted.
        """
        self._parts[key] = _Partition(
            committed_next=next_offset, acked_upto=next_offset - 1, logical_start=logical_start
        )
        self._failed.discard(key)

    def forget(self, key: PartitionKey) -> None:
        """Stop tracking key (partition revoked or lost)."""
        self._parts.pop(key, None)
        self._failed.discard(key)

    def sent(self, key: PartitionKey, last_offset: int) -> None:
        """Record that an envelope ending at last_offset was handed to the producer."""
        part = self._parts.get(key)
        if part is not None:
            part.in_flight.append(last_offset)

    def acked(self, key: PartitionKey, last_offset: int) -> None:
        """Record a successful delivery report."""
        part = self._parts.get(key)
        if part is None or part.failed:
            return
        # Reports of one partition come in send order, so a report for anything
        # but the oldest pending envelope is stale (sent before a rewind) and
        # must not move the commit point past envelopes still in flight.
        if part.in_flight and part.in_flight[0] == last_offset:
            part.in_flight.popleft()
            part.acked_upto = max(part.acked_upto, last_offset)
            part.logical_start = None

    def failed(self, key: PartitionKey) -> bool:
        """Record a failed delivery report: key must be rewound. True for the first since its last rewind."""
        part = self._parts.get(key)
        if part is None or part.failed:
            return False
        part.failed = True
        self._failed.add(key)
        return True

    @property
    def any_failed(self) -> bool:
        """True when some partition needs a rewind."""
        return bool(self._failed)

    def commit_positions(self, keys: list[PartitionKey] | None = None) -> dict[PartitionKey, int]:
        """Positions worth committing now: acked_upto + 1 where it moved forward."""
        out: dict[PartitionKey, int] = {}
        for key, part in self._parts.items():
            if keys is not None and key not in keys:
                continue
            nxt = part.acked_upto + 1
            if nxt > part.committed_next:
                out[key] = nxt
        return out

    def mark_committed(self, positions: dict[PartitionKey, int]) -> None:
        """Record that positions were committed."""
        for key, nxt in positions.items():
            part = self._parts.get(key)
            if part is not None:
                part.committed_next = max(part.committed_next, nxt)

    def rewind_positions(self) -> dict[PartitionKey, tuple[int, int | None]]:
        """Where each partition resumes after a rewind: just after its acked prefix.

        Returns (next offset, logical start or None) per partition.
        """
        return {key: (part.acked_upto + 1, part.logical_start) for key, part in self._parts.items()}

    def in_flight_count(self) -> int:
        """Envelopes not yet acknowledged, over all partitions."""
        return sum(len(p.in_flight) for p in self._parts.values())
