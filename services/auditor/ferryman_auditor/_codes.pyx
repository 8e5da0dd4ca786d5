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
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy

import numpy as np

cdef struct Bin:
    const uint8_t* valid  # one byte per row (1: a value), or NULL: every row has one
    const int64_t* offs  # rows + 1 offsets into data
    const char* data


cdef struct Cols:
    Bin key
    Bin value
    const uint8_t* hvalid  # headers: one byte per record (0: null), or NULL
    const int64_t* hoffs  # records + 1 offsets into the header entries
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
    return _bytes(h, b.data + b.offs[i], b.offs[i + 1] - b.offs[i])


cdef inline bint _same_field(const Bin* a, int64_t i, const Bin* b, int64_t j) noexcept nogil:
    cdef bint va = _valid(a, i), vb = _valid(b, j)
    if va != vb:
        return False
    if not va:
        return True
    cdef int64_t n = a.offs[i + 1] - a.offs[i]
    if n != b.offs[j + 1] - b.offs[j]:
        return False
    return n == 0 or memcmp(a.data + a.offs[i], b.data + b.offs[j], n) == 0


cdef inline bint _skipped(const Cols* c, int64_t e) noexcept nogil:
    """Whether header entry e is the one left out (traceparent: set by Ferryman on traced records)."""
    cdef int64_t n = c.hname.offs[e + 1] - c.hname.offs[e]
    return n == c.skip_len and memcmp(c.hname.data + c.hname.offs[e], c.skip, n) == 0


cdef inline int _header_state(const Cols* c, int64_t i) noexcept nogil:
    """Null, empty, or some headers: a record whose only headers were left out has none (null)."""
    if c.hvalid != NULL and c.hvalid[i] == 0:
        return _NULL_HEADERS
    cdef int64_t e
    if c.hoffs[i] == c.hoffs[i + 1]:
        return _EMPTY_HEADERS
    for e in range(c.hoffs[i], c.hoffs[i + 1]):
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
        for e in range(c.hoffs[i], c.hoffs[i + 1]):
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
    cdef int64_t a = _next_kept(c, c.hoffs[i], c.hoffs[i + 1]), a_end = c.hoffs[i + 1]
    cdef int64_t b = _next_kept(c, c.hoffs[j], c.hoffs[j + 1]), b_end = c.hoffs[j + 1]
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


def content_codes(
    Py_ssize_t n,
    const uint8_t[::1] key_valid, const int64_t[::1] key_offs, const uint8_t[::1] key_data,
    const uint8_t[::1] value_valid, const int64_t[::1] value_offs, const uint8_t[::1] value_data,
    const uint8_t[::1] headers_valid, const int64_t[::1] headers_offs,
    const int64_t[::1] name_offs, const uint8_t[::1] name_data,
    const uint8_t[::1] hvalue_valid, const int64_t[::1] hvalue_offs, const uint8_t[::1] hvalue_data,
    const int64_t[::1] timestamps, const int32_t[::1] types, bytes skip_name, uint64_t hash_mask=0xFFFFFFFFFFFFFFFFULL,
):
    """Each record's code: the row number of the first record with the same content (an int64 array).

    Binary columns come as (validity bytes or None, n + 1 int64 offsets, data);
    headers as each record's validity and n + 1 offsets into the header entries,
    whose names and values are binary columns. Header entries named
    ``skip_name`` are left out. ``hash_mask`` is for tests (0: every hash equal).
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if key_offs.shape[0] != n + 1 or value_offs.shape[0] != n + 1 or headers_offs.shape[0] != n + 1:
        raise ValueError("offsets must have n + 1 entries")
    if timestamps.shape[0] != n or types.shape[0] != n:
        raise ValueError("timestamps and types must have n entries")
    cdef Cols c
    c.key.valid, c.key.offs, c.key.data = _valid_ptr(key_valid), &key_offs[0], _data_ptr(key_data)
    c.value.valid, c.value.offs, c.value.data = _valid_ptr(value_valid), &value_offs[0], _data_ptr(value_data)
    c.hvalid, c.hoffs = _valid_ptr(headers_valid), &headers_offs[0]
    c.hname.valid, c.hname.offs, c.hname.data = NULL, &name_offs[0], _data_ptr(name_data)
    c.hvalue.valid, c.hvalue.offs, c.hvalue.data = _valid_ptr(hvalue_valid), &hvalue_offs[0], _data_ptr(hvalue_data)
    c.ts, c.types = &timestamps[0], &types[0]
    c.skip, c.skip_len = skip_name, len(skip_name)
    cdef int bits = 1
    while (<int64_t>1 << bits) < 2 * n:
        bits += 1
    cdef int64_t cap = <int64_t>1 << bits, mask = cap - 1
    slots_array = np.full(cap, -1, dtype=np.int64)
    hashes_array = np.zeros(cap, dtype=np.uint64)
    codes_array = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] slots = slots_array
    cdef uint64_t[::1] hashes = hashes_array
    cdef int64_t[::1] codes = codes_array
    cdef int64_t i, j, slot
    cdef uint64_t h
    with nogil:
        for i in range(n):
            h = _hash(&c, i) & hash_mask
            slot = <int64_t>((h * _K1) >> (64 - bits))
            while True:
                j = slots[slot]
                if j < 0:
                    slots[slot] = i
                    hashes[slot] = h
                    codes[i] = i
                    break
                if hashes[slot] == h and _same(&c, j, i):
                    codes[i] = j
                    break
                slot = (slot + 1) & mask
    return codes_array
