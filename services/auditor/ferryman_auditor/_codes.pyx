# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Exact content codes of records in one pass: a 64-bit hash per record, confirmed byte for byte.

Why it exists: ``_identity``'s Arrow path dictionary-encodes five columns and
the headers' runs apart (about a fifth of an audit's Python CPU). Here each
record's content (key, value, headers without ``traceparent``, timestamp,
timestamp type; null told apart from empty) is hashed once, straight from the
Arrow buffers, and looked up in an open-addressing table of the contents seen
so far. A record gets the code of the first record with equal content
(that record's row number), or its own row number. Equal hashes are never
trusted: the two records are compared field by field, and a collision only
costs a probe. So codes are exactly as the Arrow path's: equal exactly when
contents are (``hash_mask`` exists so that a test can make every hash collide
and see the codes stay exact).

The table is probed in a pass of its own after the hashes, each slot (row and
hash side by side: one cache line) prefetched a few records ahead: a task's
table is tens of megabytes, and waiting for each probe's cache miss was most of
the coder's time. Offsets are read as Arrow stores them (32 or 64 bits), not
converted.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy

import numpy as np

cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil


cdef struct Offsets:
    const int32_t* narrow  # rows + 1 offsets as Arrow's binary arrays hold them, or NULL: see wide
    const int64_t* wide  # as large_binary arrays hold them


cdef struct Bin:
    const uint8_t* valid  # one byte per row (1: a value), or NULL: every row has one
    Offsets offs  # rows + 1 offsets into data
    const char* data


cdef struct Slot:
    int64_t row  # the first record with this slot's content, or -1: free
    uint64_t hash


cdef struct Cols:
    Bin key
    Bin value
    const uint8_t* hvalid  # headers: one byte per record (0: null), or NULL
    Offsets hoffs  # records + 1 offsets into the header entries
    Bin hname
    Bin hvalue
    const int64_t* ts
    const int32_t* types
    const char* skip  # the header name left out (traceparent)
    int64_t skip_len


cdef enum:
    _NULL_HEADERS = 0
    _EMPTY_HEADERS = 1
    _SOME_HEADERS = 2

cdef uint64_t _K1 = 0x9E3779B97F4A7C15ULL
cdef uint64_t _K2 = 0xC2B2AE3D27D4EB4FULL
cdef uint64_t _K3 = 0x165667B19E3779F9ULL

#: Records between a slot's prefetch and its probe: enough to cover a cache miss (~100 ns) with the
#: probes in between, few enough that the prefetched lines are still in L1/L2 when probed.
cdef enum:
    _PREFETCH_AHEAD = 16


cdef inline int64_t _at(const Offsets* o, int64_t i) noexcept nogil:
    return o.wide[i] if o.narrow == NULL else o.narrow[i]


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    """splitmix64's finalizer: every input bit reaches every output bit."""
    h ^= h >> 30
    h *= 0xBF58476D1CE4E5B9ULL
    h ^= h >> 27
    h *= 0x94D049BB133111EBULL
    return h ^ (h >> 31)


cdef inline uint64_t _rotl(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t _bytes(uint64_t h, const char* p, int64_t n) noexcept nogil:
    """h extended by n bytes at p (eight at a time), and their count."""
    cdef uint64_t w
    h = _mix(h ^ (<uint64_t>n * _K3))
    while n >= 8:
        memcpy(&w, p, 8)
        h = _rotl(h ^ (w * _K1), 31) * _K2
        p += 8
        n -= 8
    if n > 0:
        w = 0
        memcpy(&w, p, n)
        h = _rotl(h ^ (w * _K1), 31) * _K2
    return h


cdef inline bint _valid(const Bin* b, int64_t i) noexcept nogil:
    return b.valid == NULL or b.valid[i] != 0


cdef inline uint64_t _field(uint64_t h, const Bin* b, int64_t i) noexcept nogil:
    if not _valid(b, i):
        return _mix(h ^ _K2)  # null: not the empty value, whose count (0) goes through _bytes
    cdef int64_t start = _at(&b.offs, i)
    return _bytes(h, b.data + start, _at(&b.offs, i + 1) - start)


cdef inline bint _same_field(const Bin* a, int64_t i, const Bin* b, int64_t j) noexcept nogil:
    cdef bint va = _valid(a, i), vb = _valid(b, j)
    if va != vb:
        return False
    if not va:
        return True
    cdef int64_t ai = _at(&a.offs, i), bj = _at(&b.offs, j)
    cdef int64_t n = _at(&a.offs, i + 1) - ai
    if n != _at(&b.offs, j + 1) - bj:
        return False
    return n == 0 or memcmp(a.data + ai, b.data + bj, n) == 0


cdef inline bint _skipped(const Cols* c, int64_t e) noexcept nogil:
    """Whether header entry e is the one left out (traceparent: set by Ferryman on traced records)."""
    cdef int64_t start = _at(&c.hname.offs, e)
    cdef int64_t n = _at(&c.hname.offs, e + 1) - start
    return n == c.skip_len and memcmp(c.hname.data + start, c.skip, n) == 0


cdef inline int _header_state(const Cols* c, int64_t i) noexcept nogil:
    """Null, empty, or some headers: a record whose only headers were left out has none (null)."""
    if c.hvalid != NULL and c.hvalid[i] == 0:
        return _NULL_HEADERS
    cdef int64_t e, first = _at(&c.hoffs, i), end = _at(&c.hoffs, i + 1)
    if first == end:
        return _EMPTY_HEADERS
    for e in range(first, end):
        if not _skipped(c, e):
            return _SOME_HEADERS
    return _NULL_HEADERS


cdef uint64_t _hash(const Cols* c, int64_t i) noexcept nogil:
    cdef uint64_t h = _K1
    cdef int64_t e
    h = _field(h, &c.key, i)
    h = _field(h, &c.value, i)
    h = _mix(h ^ (<uint64_t>c.ts[i] * _K2) ^ (<uint64_t>(c.types[i] + 2) << 1))
    cdef int state = _header_state(c, i)
    h = _mix(h ^ <uint64_t>(state + 1))
    if state == _SOME_HEADERS:
        for e in range(_at(&c.hoffs, i), _at(&c.hoffs, i + 1)):
            if not _skipped(c, e):
                h = _field(h, &c.hname, e)
                h = _field(h, &c.hvalue, e)
    return _mix(h)


cdef inline int64_t _next_kept(const Cols* c, int64_t e, int64_t end) noexcept nogil:
    while e < end and _skipped(c, e):
        e += 1
    return e


cdef bint _same(const Cols* c, int64_t i, int64_t j) noexcept nogil:
    """Whether records i and j have the same content (the exact check behind every equal hash)."""
    if c.ts[i] != c.ts[j] or c.types[i] != c.types[j]:
        return False
    if not _same_field(&c.key, i, &c.key, j) or not _same_field(&c.value, i, &c.value, j):
        return False
    cdef int state = _header_state(c, i)
    if state != _header_state(c, j):
        return False
    if state != _SOME_HEADERS:
        return True
    cdef int64_t a_end = _at(&c.hoffs, i + 1), b_end = _at(&c.hoffs, j + 1)
    cdef int64_t a = _next_kept(c, _at(&c.hoffs, i), a_end)
    cdef int64_t b = _next_kept(c, _at(&c.hoffs, j), b_end)
    while a < a_end and b < b_end:
        if not _same_field(&c.hname, a, &c.hname, b) or not _same_field(&c.hvalue, a, &c.hvalue, b):
            return False
        a = _next_kept(c, a + 1, a_end)
        b = _next_kept(c, b + 1, b_end)
    return a == a_end and b == b_end


cdef inline const uint8_t* _valid_ptr(const uint8_t[::1] valid):
    return NULL if valid is None or valid.shape[0] == 0 else &valid[0]


cdef inline const char* _data_ptr(const uint8_t[::1] data):
    return <const char*>"" if data is None or data.shape[0] == 0 else <const char*>&data[0]


cdef int _offsets(Offsets* out, object array, Py_ssize_t rows, str name, bint exact=True) except -1:
    """Point out at array's rows + 1 offsets (int32 or int64: Arrow's binary or large_binary; more if not exact)."""
    cdef const int32_t[::1] narrow
    cdef const int64_t[::1] wide
    cdef Py_ssize_t size
    if array.dtype == np.int32:
        narrow = array
        size = narrow.shape[0]
        out.narrow, out.wide = (&narrow[0] if size else NULL), NULL
    elif array.dtype == np.int64:
        wide = array
        size = wide.shape[0]
        out.narrow, out.wide = NULL, (&wide[0] if size else NULL)
    else:
        raise ValueError(f"{name} must be int32 or int64, not {array.dtype}")
    if size < rows + 1 or (exact and size != rows + 1):
        raise ValueError(f"{name} must have {rows + 1} entries, not {size}")
    return 0


def content_codes(
    Py_ssize_t n,
    const uint8_t[::1] key_valid, key_offs, const uint8_t[::1] key_data,
    const uint8_t[::1] value_valid, value_offs, const uint8_t[::1] value_data,
    const uint8_t[::1] headers_valid, headers_offs,
    name_offs, const uint8_t[::1] name_data,
    const uint8_t[::1] hvalue_valid, hvalue_offs, const uint8_t[::1] hvalue_data,
    const int64_t[::1] timestamps, const int32_t[::1] types, bytes skip_name, uint64_t hash_mask=0xFFFFFFFFFFFFFFFFULL,
):
    """Each record's code: the row number of the first record with the same content (an int64 array).

    Binary columns come as (validity bytes or None, n + 1 offsets, data);
    headers as each record's validity and n + 1 offsets into the header entries,
    whose names and values are binary columns. Offsets are contiguous int32 or
    int64 arrays, which must outlive the call (the coder reads them in place).
    Header entries named ``skip_name`` are left out. ``hash_mask`` is for tests
    (0: every hash equal).
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if timestamps.shape[0] != n or types.shape[0] != n:
        raise ValueError("timestamps and types must have n entries")
    cdef Cols c
    _offsets(&c.key.offs, key_offs, n, "key offsets")
    _offsets(&c.value.offs, value_offs, n, "value offsets")
    _offsets(&c.hoffs, headers_offs, n, "header offsets")
    cdef Py_ssize_t entries = _at(&c.hoffs, n)
    # Header entries: the list offsets index them (a sliced list's entries may extend past the last one).
    _offsets(&c.hname.offs, name_offs, entries, "header name offsets", False)
    _offsets(&c.hvalue.offs, hvalue_offs, entries, "header value offsets", False)
    c.key.valid, c.key.data = _valid_ptr(key_valid), _data_ptr(key_data)
    c.value.valid, c.value.data = _valid_ptr(value_valid), _data_ptr(value_data)
    c.hvalid = _valid_ptr(headers_valid)
    c.hname.valid, c.hname.data = NULL, _data_ptr(name_data)
    c.hvalue.valid, c.hvalue.data = _valid_ptr(hvalue_valid), _data_ptr(hvalue_data)
    c.ts, c.types = &timestamps[0], &types[0]
    c.skip, c.skip_len = skip_name, len(skip_name)
    cdef int bits = 1
    while (<int64_t>1 << bits) < 2 * n:
        bits += 1
    cdef int64_t cap = <int64_t>1 << bits, mask = cap - 1
    # Slots as (row, hash) pairs of int64: -1 rows mark free slots.
    table_array = np.full(2 * cap, -1, dtype=np.int64)
    hashes_array = np.empty(n, dtype=np.uint64)
    codes_array = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] table_view = table_array
    cdef Slot* table = <Slot*>&table_view[0]
    cdef uint64_t[::1] hashes = hashes_array
    cdef int64_t[::1] codes = codes_array
    cdef int64_t i, j, slot
    cdef uint64_t h
    cdef int shift = 64 - bits
    with nogil:
        for i in range(n):
            hashes[i] = _hash(&c, i) & hash_mask
        for i in range(min(n, _PREFETCH_AHEAD)):
            __builtin_prefetch(&table[(hashes[i] * _K1) >> shift])
        for i in range(n):
            if i + _PREFETCH_AHEAD < n:
                __builtin_prefetch(&table[(hashes[i + _PREFETCH_AHEAD] * _K1) >> shift])
            h = hashes[i]
            slot = <int64_t>((h * _K1) >> shift)
            while True:
                j = table[slot].row
                if j < 0:
                    table[slot].row = i
                    table[slot].hash = h
                    codes[i] = i
                    break
                if table[slot].hash == h and _same(&c, j, i):
                    codes[i] = j
                    break
                slot = (slot + 1) & mask
    return codes_array
