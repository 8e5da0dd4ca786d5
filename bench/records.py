"""The bench's record format: one home for how test records are made and read back.

Every value starts with a fixed-width ASCII header ``PPPPSSSSSSSSSSSS``: the source
partition (4 digits) and the record's sequence number within that partition
(12 digits), then ``:`` and padding up to the value size. Sequence numbers run
0..n-1 per partition, so completeness, duplicates and order can be checked from
the values alone, whatever the replicator does to offsets. With several source
topics of P partitions each, the partition field numbers the partitions of all of
them: partition p of the i-th topic is ``i * P + p``, so that one reader of all
the copies can still tell every topic's records apart (and a record copied into
the wrong topic shows). Keys are never null
(``k`` + 7 digits) because real topics carry keys and a replicator must copy them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

#: Bytes of the ``PPPPSSSSSSSSSSSS`` header.
HEADER_BYTES = 16
#: Smallest value the format allows: the header and the ``:`` separator.
MIN_VALUE_BYTES = HEADER_BYTES + 1
#: Partitions the 4-digit partition field can name (of all source topics together).
MAX_PARTITIONS = 9999
#: Every key is this long.
KEY_BYTES = 8
#: ``header // SEQ_MODULUS`` is the partition, ``header % SEQ_MODULUS`` the sequence number.
SEQ_MODULUS = 10**12
_KEY_SPACE = 10**7
_KEY_FORMAT = b"k%07d"


def split_counts(records: int, partitions: int) -> list[int]:
    """Records per partition when ``records`` are spread round-robin over ``partitions``."""
    base, extra = divmod(records, partitions)
    return [base + (1 if p < extra else 0) for p in range(partitions)]


def padding(value_bytes: int) -> bytes:
    """The constant tail that brings a value to ``value_bytes``."""
    return b":" + b"x" * (value_bytes - MIN_VALUE_BYTES)


def make_value(partition: int, seq: int, pad: bytes) -> bytes:
    """The value of record ``seq`` of ``partition`` (``pad`` from ``padding``)."""
    return _value_format(partition, pad) % seq


def make_key(seq: int) -> bytes:
    """A non-null key of fixed length."""
    return _KEY_FORMAT % (seq % _KEY_SPACE)


def values_of(partition: int, seqs: Iterable[int], pad: bytes) -> Iterator[bytes]:
    """``make_value`` of each of ``seqs``, formatted in C: no Python code runs per record."""
    return map(_value_format(partition, pad).__mod__, seqs)


def keys_of(seqs: Iterable[int]) -> Iterator[bytes]:
    """``make_key`` of each of ``seqs``, formatted in C."""
    return map(_KEY_FORMAT.__mod__, map(_KEY_SPACE.__rmod__, seqs))


def _value_format(partition: int, pad: bytes) -> bytes:
    """A ``%``-format of one partition's values: the partition and the padding fixed, the sequence number open."""
    return b"%04d%%012d" % partition + pad.replace(b"%", b"%%")


def decode(value: bytes) -> tuple[int, int]:
    """``(partition, seq)`` of a value made by ``make_value``.

    Raises:
        ValueError: the value does not start with the header.
    """
    return divmod(int(value[:HEADER_BYTES]), SEQ_MODULUS)


def record_bytes(value_bytes: int) -> int:
    """Key plus value bytes of one record (what the MB/s figures count)."""
    return KEY_BYTES + value_bytes
