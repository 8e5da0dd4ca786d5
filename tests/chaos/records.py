"""What the chaos run's producers write: every record a pure function of (topic role, partition, index).

So the checker can tell, for any record read back, which one it is (its ``chaos-id`` header), whether it
is intact (key, value, headers and timestamp rebuilt from the id), and where it belongs in order.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("plain", "compacted", "txn", "recreated")
"""The run's topics: a plain one (it gets a partition added), a compacted one with tombstones, one
written by a transactional producer that aborts some transactions, and one deleted and re-created."""

ID_HEADER = "chaos-id"
ABORTED_PREFIX = b"ABORTED:"
_COMPACTED_KEYS = 16
_KEYS = 97
_TOMBSTONE_EVERY = 7


@dataclass(frozen=True)
class RecordId:
    """A record's identity: role, partition and index within the partition's sequence."""

    role: str
    partition: int
    index: int

    def encode(self) -> bytes:
        """The ``chaos-id`` header value."""
        return f"{self.role}:{self.partition}:{self.index}".encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> RecordId | None:
        """The id a header holds, None if it is not one."""
        try:
            role, partition, index = (raw or b"").decode().split(":")
            return cls(role, int(partition), int(index))
        except (UnicodeDecodeError, ValueError):
            return None


Content = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]
"""``ConsumedRecord.content()``: key, value, headers, timestamp."""


def content(rid: RecordId, base_ms: int, *, aborted: bool = False) -> Content:
    """The record a producer writes for rid (base_ms: the run's timestamp origin)."""
    keys = _COMPACTED_KEYS if rid.role == "compacted" else _KEYS
    key = f"k{rid.index % keys}".encode()
    value: bytes | None = f"{rid.role}:{rid.partition}:{rid.index}:".encode() + b"x" * (rid.index % 50)
    if rid.role == "compacted" and rid.index % _TOMBSTONE_EVERY == 3:
        value = None  # a tombstone
    if aborted and value is not None:
        value = ABORTED_PREFIX + value
    # A repeated header name and a null header value: both must survive byte-faithfully.
    headers = ((ID_HEADER, rid.encode()), ("h", b"\x00\xff"), ("h", None))
    return key, value, headers, base_ms + rid.index


def is_tombstone(c: Content) -> bool:
    """True for a record with a null value."""
    return c[1] is None
