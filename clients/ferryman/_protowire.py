"""Protobuf wire-format pieces for the few messages written by hand on hot paths (record traces, OTLP spans).

Building a message object and serialising it costs microseconds in Python; a
traced record's context and spans are written as bytes instead. Parsers see
ordinary protobuf (tests parse these bytes with the generated classes).
"""

from __future__ import annotations


def varint(n: int) -> bytes:
    """The base-128 varint of an int (a negative int64 as its 10-byte two's complement)."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string, bytes or an embedded message."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
