"""Exact content identities of records, column by column (no Python code per record, no hash collisions).

What replication must keep of a record is its key, value, headers, timestamp
and timestamp type. Within one audit task (one source partition: its source
records, their lookahead and the destination window, all in one table), each
of those columns is dictionary-encoded by Arrow's C++ kernels: equal values get
equal codes, nulls a code of their own (a null key is not an empty key). The
codes are then packed into two int64 columns, so that two records have the same
pair exactly when they have the same content. ``_align`` sorts and matches the
pairs (numpy sorts int64 columns fast).

The codes mean something only within the table they were computed on: encode
every side of a partition together.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from ferryman.tracing import TRACEPARENT

Int64s = npt.NDArray[np.int64]

#: Timestamp types are -1 (none), 0 (create time) and 1 (log-append time): three values.
_TYPES = 3


def content_keys(table: pa.Table) -> tuple[Int64s, Int64s]:
    """Two int64 columns that are equal for two rows exactly when their contents are equal.

    ``table`` has the data source's ``key``, ``value``, ``headers``,
    ``timestamp`` and ``timestamp_type`` columns.
    """
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = _codes(table.column("key"))
    value = _codes(table.column("value"))
    headers = _header_codes(table.column("headers"))
    stamps = _codes(table.column("timestamp").cast(pa.int64()))
    types = table.column("timestamp_type").to_numpy().astype(np.int64) + 1
    # Codes are below n, so key and value fit in 32 bits each, and headers x timestamp x type in 63 bits
    # as long as n stays below ~1.2 billion records (a task holds one partition's audited records).
    if n >= 2**31 or (n + 2) * (n + 1) * _TYPES >= 2**63:
        raise ValueError(f"{n} records are too many for one audit task")
    first = (key << 32) | value
    second = (headers * (int(stamps.max()) + 1) + stamps) * _TYPES + types
    return first, second


def _codes(column: pa.ChunkedArray | pa.Array) -> Int64s:
    """Dense codes of a column's values: equal values, equal codes; null has a code of its own."""
    array = _one_array(column)
    encoded = pc.dictionary_encode(array, null_encoding="encode")
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def _one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One array of the column's chunks (binary as large_binary: one partition may hold more than 2 GiB)."""
    if isinstance(column, pa.ChunkedArray):
        chunks = column.chunks
        # 32-bit offsets address 2 GiB: only a larger column pays the copy to 64-bit ones.
        big = column.nbytes >= 2**31 - 2**20
        if big and (pa.types.is_binary(column.type) or pa.types.is_string(column.type)):
            large = pa.large_binary() if pa.types.is_binary(column.type) else pa.large_string()
            chunks = [c.cast(large) for c in chunks]
            return pa.concat_arrays(chunks) if chunks else pa.array([], large)
        return pa.concat_arrays(chunks) if chunks else pa.array([], column.type)
    return column


def _header_codes(column: pa.ChunkedArray | pa.Array) -> Int64s:
    """Dense codes of each record's headers (an ordered list of key/value pairs; null and empty told apart).

    Each header is coded by its key and value codes (one int64); a record's
    headers are then the bytes of its run of header codes, and those byte
    strings are dictionary-encoded like any other column.
    """
    lists = _one_array(column) if isinstance(column, pa.ChunkedArray) else column
    n = len(lists)
    if lists.null_count == n:
        return np.zeros(n, dtype=np.int64)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lists), -1).to_numpy(zero_copy_only=False), np.int64)
    flat, lengths = _without_traceparent(lists, lengths)
    if len(flat):
        pairs = (_codes(pc.struct_field(flat, [0])) << 32) | _codes(pc.struct_field(flat, [1]))
    else:
        pairs = np.zeros(0, dtype=np.int64)
    ends = np.cumsum(np.maximum(lengths, 0)) * 8
    if len(ends) and ends[-1] >= 2**31:
        raise ValueError(f"{len(pairs)} headers are too many for one audit task")
    offsets = np.concatenate([np.zeros(1, dtype=np.int32), ends.astype(np.int32)])
    runs = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(pairs.tobytes())])
    # Code 0: no headers at all (null); an empty list is the empty byte string, a code of its own.
    return np.where(lengths < 0, 0, _codes(runs) + 1)


def _without_traceparent(lists: pa.Array, lengths: Int64s) -> tuple[pa.Array, Int64s]:
    """The flattened headers without ``traceparent``, and each record's header count after that.

    On traced records Ferryman sets ``traceparent`` at the destination (replaced in place, or appended
    when the source record had none; README, "Operations: tracing"), so a traced copy is not an altered
    one: the header is left out on both sides. A record whose only header was that one counts as a record
    without headers (-1, as null).
    """
    flat = pc.list_flatten(lists)
    if not len(flat):
        return flat, lengths
    keys = pc.struct_field(flat, [0])
    traceparent = TRACEPARENT.encode() if pa.types.is_binary(keys.type) else TRACEPARENT
    keep = np.asarray(
        pc.fill_null(pc.not_equal(keys, pa.scalar(traceparent, type=keys.type)), True).to_numpy(zero_copy_only=False),
        dtype=bool,
    )
    if keep.all():
        return flat, lengths
    parents = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), dtype=np.int64)
    counts = np.bincount(parents[keep], minlength=len(lengths)).astype(np.int64)
    kept_lengths = np.where((lengths < 0) | ((counts == 0) & (lengths > 0)), -1, counts)
    return flat.filter(pa.array(keep)), kept_lengths
