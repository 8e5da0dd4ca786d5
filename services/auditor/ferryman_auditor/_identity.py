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

Where the compiled coder (``_codes``) is built, it replaces the Arrow kernels:
one 64-bit hash per record over the same content, equal hashes confirmed byte
for byte, so the codes are just as exact (a record's code is the row of the
first record with its content; the second column is zero). Without it (a Spark
executor with only the Python sources) the Arrow path runs; both tell the same
records apart.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from ferryman.tracing import TRACEPARENT

try:
    from ferryman_auditor import _codes
except ImportError:  # not built (no C compiler at install): the Arrow kernels code the contents
    _codes = None  # type: ignore[assignment]

Int64s = npt.NDArray[np.int64]

#: Which coder ``content_keys`` takes by default, for logs.
CODER = "compiled (_codes)" if _codes is not None else "Arrow kernels (the compiled coder is not built)"
#: Whether ``content_keys`` gives dense codes by default: each first key the row of the first record with the
#: same content (below the table's row count), each second key 0 (``_align.Rows.code_bound``).
DENSE = _codes is not None

#: Timestamp types are -1 (none), 0 (create time) and 1 (log-append time): three values.
_TYPES = 3


def content_keys(table: pa.Table, *, compiled: bool | None = None) -> tuple[Int64s, Int64s]:
    """Two int64 columns that are equal for two rows exactly when their contents are equal.

    ``table`` has the data source's ``key``, ``value``, ``headers``,
    ``timestamp`` and ``timestamp_type`` columns. ``compiled``: the compiled
    coder (True), the Arrow kernels (False), or the compiled one when built (None).
    """
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if compiled or (compiled is None and _codes is not None):
        return compiled_codes(table), np.zeros(n, dtype=np.int64)
    key = _dense_codes(table.column("key"))
    value = _dense_codes(table.column("value"))
    headers = _header_codes(table.column("headers"))
    stamps = _dense_codes(table.column("timestamp").cast(pa.int64()))
    types = table.column("timestamp_type").to_numpy().astype(np.int64) + 1
    # Codes are below n, so key and value fit in 32 bits each, and headers x timestamp x type in 63 bits
    # as long as n stays below ~1.2 billion records (a task holds one partition's audited records).
    if n >= 2**31 or (n + 2) * (n + 1) * _TYPES >= 2**63:
        raise ValueError(f"{n} records are too many for one audit task")
    first = (key << 32) | value
    second = (headers * (int(stamps.max()) + 1) + stamps) * _TYPES + types
    return first, second


def _dense_codes(column: pa.ChunkedArray | pa.Array) -> Int64s:
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
        pairs = (_dense_codes(pc.struct_field(flat, [0])) << 32) | _dense_codes(pc.struct_field(flat, [1]))
    else:
        pairs = np.zeros(0, dtype=np.int64)
    ends = np.cumsum(np.maximum(lengths, 0)) * 8
    if len(ends) and ends[-1] >= 2**31:
        raise ValueError(f"{len(pairs)} headers are too many for one audit task")
    offsets = np.concatenate([np.zeros(1, dtype=np.int32), ends.astype(np.int32)])
    runs = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(pairs.tobytes())])
    # Code 0: no headers at all (null); an empty list is the empty byte string, a code of its own.
    return np.where(lengths < 0, 0, _dense_codes(runs) + 1)


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


def compiled_codes(table: pa.Table, hash_mask: int = 2**64 - 1) -> Int64s:
    """Each row's code from the compiled coder: the first row with the same content (``hash_mask``: for tests).

    Raises:
        RuntimeError: the compiled coder is not built.
    """
    if _codes is None:
        raise RuntimeError("ferryman_auditor._codes is not built")
    n = table.num_rows
    key, value = _binary_parts(_one_array(table.column("key"))), _binary_parts(_one_array(table.column("value")))
    lists = _one_array(table.column("headers"))
    list_offsets = _offsets(lists, n)
    entries = lists.values
    names = _binary_parts(pc.struct_field(entries, [0]))
    values = _binary_parts(pc.struct_field(entries, [1]))
    stamps = np.ascontiguousarray(table.column("timestamp").cast(pa.int64()).to_numpy(), dtype=np.int64)
    types = np.ascontiguousarray(table.column("timestamp_type").to_numpy(), dtype=np.int32)
    _name_valid, name_offsets, name_data = names
    codes: Int64s = _codes.content_codes(
        n, *key, *value, _validity(lists), list_offsets, name_offsets, name_data, *values, stamps, types,
        TRACEPARENT.encode(), hash_mask,
    )  # fmt: skip
    return codes


def _validity(array: pa.Array) -> npt.NDArray[np.uint8] | None:
    """One byte per row (1: not null), or None when no row is null."""
    if array.null_count == 0:
        return None
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)


def _offsets(array: pa.Array, n: int) -> npt.NDArray[np.int32] | Int64s:
    """The n + 1 offsets of a binary, string or list array as Arrow holds them (int32 or int64), its offset applied."""
    buffer = array.buffers()[1]
    if array.type in (pa.large_binary(), pa.large_string()) or pa.types.is_large_list(array.type):
        wide: Int64s = np.zeros(n + 1, np.int64) if buffer is None else np.frombuffer(buffer, np.int64)
        return wide[array.offset : array.offset + n + 1] if buffer is not None else wide
    narrow: npt.NDArray[np.int32] = np.zeros(n + 1, np.int32) if buffer is None else np.frombuffer(buffer, np.int32)
    return narrow[array.offset : array.offset + n + 1] if buffer is not None else narrow


def _binary_parts(
    array: pa.Array,
) -> tuple[npt.NDArray[np.uint8] | None, npt.NDArray[np.int32] | Int64s, npt.NDArray[np.uint8]]:
    """(validity, offsets, data) of a binary or string array, as the compiled coder takes them."""
    data = array.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return _validity(array), _offsets(array, len(array)), raw
