# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Compiled per-record work of tracing on the services' data paths: spans, ids, ``traceparent``, record traces.

Why it exists: the tracing work of a traced record is small in a warm loop
(~4-5 us for both services in Python, ``python -m bench.span_cost --all``)
but at a 1 % ratio it runs once per envelope or run, between batches of a
thousand records that have evicted it from the CPU caches, and there the
same Python measured 3-10x slower (a cache-flushing micro-benchmark; in the
pipeline 1 % tracing cost ~20-35 us per traced record). So the per-record
and per-envelope steps run here as C with few Python objects: the
`RecordSpan` type (the dataclass ``_lean.RecordSpanPy``'s twin, made
without a Python ``__init__``), the wrapper's spans of a run
(`start_spans`), the deduper's spans and header column (`continue_traces`),
random ids, the ``traceparent`` check and the wrapper's ``record_traces``
suffix.

The pure-Python versions (``ferryman.tracing._lean``, ``_sampling``,
``ferryman.envelope``, the services' ``_traces`` modules) stay the fallback
and the reference: the tests hold each function here to the same output,
and the functions that take arbitrary input return None for what they do
not handle (the caller then takes the Python path).

Ids come from a xoshiro256** generator seeded from ``os.urandom`` at import
and again in a forked child (``os.register_at_fork``), as W3C Trace Context
asks of ids (random, not all zero). Every call holds the GIL, which orders the
generator's steps.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_1BYTE_DATA, PyUnicode_GET_LENGTH, PyUnicode_New
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

import os

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    const char* PyUnicode_DATA_CHARS "(const char*)PyUnicode_DATA"(object o)

# ------------------------------------------------------------------ ids

cdef uint64_t _state[4]


cdef inline uint64_t _rotl(uint64_t x, int k) noexcept:
    return (x << k) | (x >> (64 - k))


cdef inline uint64_t _next() noexcept:
    """xoshiro256** (Blackman and Vigna): 64 random bits."""
    cdef uint64_t result = _rotl(_state[1] * 5, 7) * 9
    cdef uint64_t t = _state[1] << 17
    _state[2] ^= _state[0]
    _state[3] ^= _state[1]
    _state[1] ^= _state[2]
    _state[0] ^= _state[3]
    _state[2] ^= t
    _state[3] = _rotl(_state[3], 45)
    return result


def _seed() -> None:
    """Seed the generator from the OS (at import, and in a forked child, which must not repeat its parent's ids)."""
    cdef bytes seed = os.urandom(32)
    memcpy(<void*>_state, PyBytes_AS_STRING(seed), 32)
    if not (_state[0] | _state[1] | _state[2] | _state[3]):
        _state[0] = 1  # the one state xoshiro cannot leave


_seed()
os.register_at_fork(after_in_child=_seed)

cdef const char* HEX = b"0123456789abcdef"


cdef inline void _hex64(char* out, uint64_t value) noexcept:
    cdef int i
    for i in range(15, -1, -1):
        out[i] = HEX[value & 0xF]
        value >>= 4


def span_id() -> str:
    """A random non-zero 64-bit span id: 16 lowercase hex digits."""
    cdef uint64_t value = _next()
    while value == 0:
        value = _next()
    cdef str out = PyUnicode_New(16, 127)
    _hex64(<char*>PyUnicode_1BYTE_DATA(out), value)
    return out


def trace_id() -> str:
    """A random non-zero 128-bit trace id: 32 lowercase hex digits."""
    cdef uint64_t high = _next(), low = _next()
    while high == 0 and low == 0:
        high, low = _next(), _next()
    cdef str out = PyUnicode_New(32, 127)
    cdef char* data = <char*>PyUnicode_1BYTE_DATA(out)
    _hex64(data, high)
    _hex64(data + 16, low)
    return out


# ------------------------------------------------------------------ traceparent

cdef inline bint _hex_run(const char* text, Py_ssize_t start, Py_ssize_t end, bint* all_zero) noexcept:
    """text[start:end] is lowercase hex; all_zero tells whether every digit was 0."""
    cdef Py_ssize_t i
    cdef char c
    all_zero[0] = True
    for i in range(start, end):
        c = text[i]
        if c == b"0":
            continue
        all_zero[0] = False
        if not ((b"1" <= c <= b"9") or (b"a" <= c <= b"f")):
            return False
    return True


def canonical_traceparent(value) -> object:
    """True/False: value is/is not a valid version-00 ``traceparent`` of exactly 55 characters.

    None for anything else (another length or version, a non-str): the caller
    asks ``parse_traceparent``, which handles every form. A True value is one
    ``parse_traceparent`` returns unchanged; a False one it rejects.
    """
    if type(value) is not str or PyUnicode_GET_LENGTH(value) != 55 or not PyUnicode_IS_ASCII(value):
        return None
    cdef const char* text = PyUnicode_DATA_CHARS(value)
    if text[0] != b"0" or text[1] != b"0":
        return None
    cdef bint zero_trace, zero_span, zero_flags
    if text[2] != b"-" or text[35] != b"-" or text[52] != b"-":
        return False
    if not _hex_run(text, 3, 35, &zero_trace) or not _hex_run(text, 36, 52, &zero_span):
        return False
    if not _hex_run(text, 53, 55, &zero_flags):
        return False
    return not (zero_trace or zero_span)


# ------------------------------------------------------------------ record traces

cdef inline Py_ssize_t _put_varint(char* out, uint64_t n) noexcept:
    cdef Py_ssize_t i = 0
    while n >= 0x80:
        out[i] = <char>((n & 0x7F) | 0x80)
        n >>= 7
        i += 1
    out[i] = <char>n
    return i + 1


cdef inline Py_ssize_t _varint_size(uint64_t n) noexcept:
    cdef Py_ssize_t size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


# A RecordTrace's traceparent: "00-" + 32 + "-" + 16 + "-01".
cdef enum:
    TRACEPARENT_LEN = 55


def record_traces_suffix(list spans, long long after, long long upto) -> object:
    """``envelope.record_traces_suffix`` of the spans (offset, RecordSpan) with after < offset <= upto.

    Each span's ``traceparent`` (``00-<trace_id>-<span_id>-01``) and ``tracestate``
    go into a ``RecordTrace``; the bytes are what the Python function writes.
    None when a span is not of the shape this handles (a non-int offset, an id
    that is not 32/16 ASCII characters, a non-ASCII ``tracestate``).
    """
    cdef Py_ssize_t i, n = len(spans), size = 0, at = 0, body, state_len
    cdef long long offset
    cdef int inside
    cdef object item, span
    # First pass: check the spans and size the output.
    for i in range(n):
        item = spans[i]
        inside = _offset_in(item, after, upto, &offset)
        if inside < 0:
            return None
        if not inside:
            continue
        state_len = _state_len(item[1])
        if state_len < 0:
            return None
        body = _body_size(offset, state_len)
        size += 1 + _varint_size(<uint64_t>body) + body
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef char* data = PyBytes_AS_STRING(out)
    for i in range(n):
        item = spans[i]
        if _offset_in(item, after, upto, &offset) != 1:
            continue  # outside (a non-int offset returned None in the first pass)
        span = item[1]
        state_len = _state_len(span)
        body = _body_size(offset, state_len)
        if state_len < 0 or at + 1 + _varint_size(<uint64_t>body) + body > size:
            return None  # changed since the first pass
        data[at] = <char>(11 << 3 | 2)  # Envelope.record_traces = 11
        at += 1
        at += _put_varint(data + at, <uint64_t>body)
        if offset:  # proto3: 0 is left out
            data[at] = <char>(1 << 3)  # RecordTrace.offset = 1 (varint)
            at += 1
            at += _put_varint(data + at, <uint64_t>offset)
        data[at] = <char>(2 << 3 | 2)  # RecordTrace.traceparent = 2
        data[at + 1] = TRACEPARENT_LEN
        at += 2
        memcpy(data + at, b"00-", 3)
        memcpy(data + at + 3, PyUnicode_DATA_CHARS(span.trace_id), 32)
        data[at + 35] = b"-"
        memcpy(data + at + 36, PyUnicode_DATA_CHARS(span.span_id), 16)
        memcpy(data + at + 52, b"-01", 3)
        at += TRACEPARENT_LEN
        if state_len:
            data[at] = <char>(3 << 3 | 2)  # RecordTrace.tracestate = 3
            at += 1
            at += _put_varint(data + at, <uint64_t>state_len)
            memcpy(data + at, PyUnicode_DATA_CHARS(span.tracestate), <size_t>state_len)
            at += state_len
    return out if at == size else None


cdef inline int _offset_in(object item, long long after, long long upto, long long* offset) except -2:
    """1: item is (offset, span) with after < offset <= upto (offset set); 0: outside; -1: not an int64 offset."""
    cdef int overflow = 0
    first = item[0]
    if type(first) is not int:
        return -1
    offset[0] = PyLong_AsLongLongAndOverflow(first, &overflow)
    if overflow:
        return -1
    return after < offset[0] <= upto


cdef inline Py_ssize_t _state_len(object span) except -2:
    """The span's tracestate length when its ids are 32 and 16 ASCII characters and its tracestate ASCII; else -1."""
    trace, sid, state = span.trace_id, span.span_id, span.tracestate
    if (type(trace) is not str or type(sid) is not str or type(state) is not str
            or PyUnicode_GET_LENGTH(trace) != 32 or PyUnicode_GET_LENGTH(sid) != 16
            or not PyUnicode_IS_ASCII(trace) or not PyUnicode_IS_ASCII(sid) or not PyUnicode_IS_ASCII(state)):
        return -1
    return PyUnicode_GET_LENGTH(state)


cdef inline Py_ssize_t _body_size(long long offset, Py_ssize_t state_len) noexcept:
    """A RecordTrace's size: offset (unless 0), traceparent, tracestate (unless empty)."""
    cdef Py_ssize_t size = 2 + TRACEPARENT_LEN
    if offset:
        size += 1 + _varint_size(<uint64_t>offset)
    if state_len:
        size += 1 + _varint_size(<uint64_t>state_len) + state_len
    return size


# ------------------------------------------------------------------ record spans

cdef class RecordSpan:
    """``ferryman.tracing._lean.RecordSpanPy`` as a C type: the same fields, defaults and ``traceparent``.

    The data paths below make these without a Python ``__init__`` frame: a
    traced record's spans cost a few C stores, where the dataclass's
    generated ``__init__`` ran cold in a loaded service (see the module docstring).
    """

    cdef public object shape
    cdef public object trace_id
    cdef public object span_id
    cdef public object parent_id
    cdef public object start_ns
    cdef public object remote_parent
    cdef public object tracestate
    cdef public object attributes
    cdef public object links
    cdef public object end_ns
    cdef public object status
    cdef public object message

    def __init__(self, shape, trace_id, span_id, parent_id, start_ns, remote_parent=False, tracestate="",
                 attributes=(), links=(), end_ns=0, status=0, message=""):
        self.shape = shape
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.start_ns = start_ns
        self.remote_parent = remote_parent
        self.tracestate = tracestate
        self.attributes = attributes
        self.links = links
        self.end_ns = end_ns
        self.status = status
        self.message = message

    @property
    def traceparent(self):
        """The ``traceparent`` naming this span as the parent (always sampled: only sampled spans exist)."""
        return "00-" + self.trace_id + "-" + self.span_id + "-01"

    def __repr__(self):
        return (f"RecordSpan(shape={self.shape!r}, trace_id={self.trace_id!r}, span_id={self.span_id!r}, "
                f"parent_id={self.parent_id!r}, start_ns={self.start_ns!r}, remote_parent={self.remote_parent!r}, "
                f"tracestate={self.tracestate!r}, attributes={self.attributes!r}, links={self.links!r}, "
                f"end_ns={self.end_ns!r}, status={self.status!r}, message={self.message!r})")


cdef RecordSpan _span(object shape, str trace_id, str span_id, str parent_id, object start_ns, bint remote,
                      object tracestate, object attributes):
    """A new span, as ``RecordSpan(shape, trace_id, span_id, parent_id, start_ns, remote, tracestate, attributes)``."""
    cdef RecordSpan span = RecordSpan.__new__(RecordSpan)
    span.shape = shape
    span.trace_id = trace_id
    span.span_id = span_id
    span.parent_id = parent_id
    span.start_ns = start_ns
    span.remote_parent = remote
    span.tracestate = tracestate
    span.attributes = attributes
    span.links = ()
    span.end_ns = 0
    span.status = 0
    span.message = ""
    return span


def start_spans(list decided, run, object shape, object now, str offset_key, str offset_new_key,
                str timestamp_key) -> list:
    """The wrapper's spans: ``(offset, span)`` for each ``(index, parent context or None)`` of decided.

    As ``ferryman_wrapper._traces.WrapperTraces.start`` makes them in Python: a
    record without context starts a trace, one with a sampled parent continues
    it; the span's attributes are the record's offset under both keys, then its
    timestamp when it has one.
    """
    cdef list spans = []
    cdef object offset, parent, tp, record
    for i, parent in decided:
        record = run[i]
        offset = record.offset()
        kind, timestamp = record.timestamp()
        if kind:  # not TIMESTAMP_NOT_AVAILABLE
            attributes = ((offset_key, offset), (offset_new_key, offset), (timestamp_key, timestamp))
        else:
            attributes = ((offset_key, offset), (offset_new_key, offset))
        if parent is None:
            span = _span(shape, trace_id(), span_id(), "", now, False, "", attributes)
        else:
            tp = parent.traceparent
            span = _span(shape, tp[3:35], span_id(), tp[36:52], now, True, parent.tracestate, attributes)
        spans.append((offset, span))
    return spans


cdef inline Py_ssize_t _index_in(object offsets, bint is_range, long long first_offset, Py_ssize_t n,
                                 object offset) except -2:
    """Where offset is in the run's (ascending) offsets, -1 when it is not there."""
    cdef long long o
    cdef Py_ssize_t i
    if is_range:
        o = offset
        return <Py_ssize_t>(o - first_offset) if 0 <= o - first_offset < n else -1
    i = _bisect_left(offsets, offset)
    return i if i < n and offsets[i] == offset else -1


from bisect import bisect_left as _bisect_left


def continue_traces(dict record_traces, offsets, Py_ssize_t start, headers, object process_shape,
                    object publish_shape, tuple staging, str source_offset_key, object now, list opened,
                    object parse, object with_traceparent, str traceparent_key) -> tuple:
    """The deduper's spans for the traced records of a run from ``start``, and their header column.

    As ``ferryman_deduper._traces.DeduperTraces.written`` does it in Python (see
    there): a process span (returned, to be ended now) and a publish span
    (appended to opened) per traced record with a valid ``traceparent`` (parse:
    ``parse_traceparent``, for the forms checked here as not canonical);
    the column gets the publish span's ``traceparent``.

    Returns:
        (column, process spans): column None or a copy of headers when no
        written record is traced.
    """
    cdef object first = offsets[start]
    cdef list traced = [item for item in record_traces.items() if item[0] >= first]
    cdef list processed = []
    if not traced:
        return (None if headers is None else list(headers)), processed
    traced.sort()
    cdef Py_ssize_t n = len(offsets), i, k
    cdef list column = list(headers) if headers is not None else [None] * n
    if len(column) != n:
        raise ValueError(f"a header column of {len(column)} entries for {n} records")
    cdef bint is_range = type(offsets) is range and offsets.step == 1
    cdef long long first_offset = offsets.start if is_range else 0
    cdef object offset, sent, tracestate, tp, canonical
    cdef str trace, process_id, publish_id
    cdef RecordSpan publish
    for k in range(len(traced)):
        offset, (sent, tracestate) = traced[k]
        i = _index_in(offsets, is_range, first_offset, n, offset)
        canonical = canonical_traceparent(sent)
        tp = parse(sent) if canonical is None else (sent if canonical else None)
        if i < 0 or tp is None:
            continue  # not one of the envelope's records, or no valid context: nothing to continue
        trace = tp[3:35]
        process_id = span_id()
        processed.append(
            _span(process_shape, trace, process_id, tp[36:52], now, True, tracestate,
                  staging + ((source_offset_key, offset),))
        )
        publish_id = span_id()
        publish = _span(publish_shape, trace, publish_id, process_id, now, False, tracestate, ())
        opened.append(publish)
        traceparent = "00-" + trace + "-" + publish_id + "-01"
        old = column[i]
        column[i] = [(traceparent_key, traceparent.encode())] if not old else with_traceparent(old, traceparent)
    return column, processed


# ------------------------------------------------------------------ sampling

from libc.math cimport floor, log1p

# Draws are exact integers in a double up to 2**53; a run of records is far shorter.
cdef double MAX_EXACT = 9007199254740992.0


def roots(Py_ssize_t n, double skip, double log_miss, object uniform) -> object:
    """``RecordSampler.roots`` for 0 < ratio < 1: (indexes among the next n records, the skip after them).

    skip: records to pass first (the sampler's ``_skip``); each later gap is
    ``floor(log1p(-uniform()) / log_miss)`` records, as ``RecordSampler._draw``
    draws it. None when a gap is too large to count exactly in a double (a
    ratio so small that the pure-Python sampler takes it).
    """
    cdef list out = []
    cdef double i = skip, gap
    while i < n:
        out.append(<Py_ssize_t>i)
        gap = floor(log1p(-<double>uniform()) / log_miss)
        if not 0 <= gap < MAX_EXACT:
            return None
        i += 1 + gap
    return out, i - n
