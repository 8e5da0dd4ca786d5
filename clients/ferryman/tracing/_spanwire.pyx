# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Compiled per-span work of the record-span batch encoders (``ferryman.tracing._file``, ``_zipkin``, ``_otlp``).

Why it exists: the export thread runs in the services' process, so its CPU
counts against the data path's. The pure-Python encoders spend ~2-4 us per
span on f-strings, time strings and small ``bytes`` objects; here each batch
is written into one C buffer and becomes one ``str`` (JSON) or ``bytes``
(OTLP) at the end.

What stays in Python: everything that JSON-escapes or is encoded once. The
encoder object passed in keeps its caches (each `SpanShape`'s encoding, the
tracestates' JSON, the resource), filled by its own methods on a miss, and
the module constants (status strings, ``_tag``, ``_key_value``, flags) are
passed by the caller; string values of per-span attributes and status
messages go through ``json.dumps`` and those helpers. So JSON escaping is
Python's, and every str copied here is ASCII (``ensure_ascii``).

What it handles, and what it leaves: the spans the services make. Each
function returns None when a span has anything else: an id or a per-span
attribute key that is not an ASCII ``str`` (or, for OTLP, not 32 or 16 hex
digits), a time before 1970 or after 2262, a status that is not 0, 1 or 2
(OTLP: 0-255), and such. The caller then encodes the batch
with the pure-Python encoder, which stays the reference (and raises what it
raises for invalid spans); the tests hold the two to the same output.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_GET_LENGTH
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy, strlen

from json import dumps

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    const char* PyUnicode_DATA_CHARS "(const char*)PyUnicode_DATA"(object o)

# Status codes, as ``ferryman.tracing._lean`` numbers them (OTLP's).
cdef enum:
    UNSET = 0
    OK = 1
    ERROR = 2

# Returned by the writers below: the span is not one this module writes (the caller falls back).
cdef enum:
    WRITTEN = 0
    OTHER = 1

# Times written here: 0 <= ns <= MAX_NS (1970 to ~2262), where ns + 500 and the difference of two
# (Zipkin's duration) stay within int64.
cdef int64_t MAX_NS = 0x7FFFFFFFFFFFFFFF - 500


# ------------------------------------------------------------------ the output buffer

cdef struct Out:
    char* data
    Py_ssize_t size
    Py_ssize_t capacity


# The buffers encodings are written in, kept from one batch to the next; the result is made at its
# exact size at the end (one copy). Writing into the result itself, allocated at an estimate and cut to
# size, measured slower: such blocks are mapped afresh for each batch (a page fault per 4 KiB written),
# where exact sizes reuse the memory freed with an earlier result, as Python's str.join does.
# A call that finds the buffers in use (another thread's call, while that one is in a Python callback)
# gets buffers of its own.
cdef Out _kept_batch
cdef Out _kept_span
cdef bint _kept_in_use = False

# Kept buffers larger than this are freed after use: a batch of 2048 spans is ~1.6 MB of file lines,
# only spans with many links make more.
cdef Py_ssize_t KEEP_BYTES = 4 << 20


cdef struct Buffers:
    Out* batch
    Out* span
    Out own_batch
    Out own_span
    bint kept


cdef void _take_buffers(Buffers* b) noexcept:
    """The kept buffers, emptied, when free; else new ones (see _kept_in_use)."""
    global _kept_in_use
    b.own_batch.data, b.own_batch.size, b.own_batch.capacity = NULL, 0, 0
    b.own_span.data, b.own_span.size, b.own_span.capacity = NULL, 0, 0
    b.kept = not _kept_in_use
    if b.kept:
        _kept_in_use = True
        b.batch, b.span = &_kept_batch, &_kept_span
        _kept_batch.size = _kept_span.size = 0
    else:
        b.batch, b.span = &b.own_batch, &b.own_span


cdef void _give_back(Out* o) noexcept:
    if o.capacity > KEEP_BYTES:
        PyMem_Free(o.data)
        o.data, o.capacity = NULL, 0
    o.size = 0


cdef void _release_buffers(Buffers* b) noexcept:
    global _kept_in_use
    if b.kept:
        _give_back(&_kept_batch)
        _give_back(&_kept_span)
        _kept_in_use = False
    PyMem_Free(b.own_batch.data)
    PyMem_Free(b.own_span.data)


cdef int _reserve(Out* o, Py_ssize_t more) except -1:
    """Room for more bytes (the capacity at least doubles, so appends are amortised O(1))."""
    cdef Py_ssize_t capacity = 2 * o.capacity
    cdef char* data
    if capacity < o.size + more:
        capacity = o.size + more
    data = <char*>PyMem_Realloc(o.data, <size_t>capacity)
    if data == NULL:
        raise MemoryError()
    o.data = data
    o.capacity = capacity
    return 0


cdef bytes _as_bytes(Out* o):
    """The buffer as bytes (every byte in it is ASCII: literals, digits and ASCII strs checked on copy)."""
    return PyBytes_FromStringAndSize(o.data, o.size)


cdef inline int _put(Out* o, const char* text, Py_ssize_t n) except -1:
    if o.size + n > o.capacity:
        _reserve(o, n)
    memcpy(o.data + o.size, text, <size_t>n)
    o.size += n
    return 0


cdef inline int _puts(Out* o, const char* literal) except -1:
    return _put(o, literal, <Py_ssize_t>strlen(literal))


cdef inline int _put_byte(Out* o, unsigned char byte) except -1:
    if o.size + 1 > o.capacity:
        _reserve(o, 1)
    o.data[o.size] = <char>byte
    o.size += 1
    return 0


cdef inline int _put_text(Out* o, object text) except -1:
    """Copy an exact ASCII str as it is; OTHER for anything else (an f-string would format it)."""
    if type(text) is not str or not PyUnicode_IS_ASCII(text):
        return OTHER
    _put(o, PyUnicode_DATA_CHARS(text), PyUnicode_GET_LENGTH(text))
    return WRITTEN


cdef inline int _put_bytes(Out* o, object data) except -1:
    if type(data) is not bytes:
        return OTHER
    _put(o, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    return WRITTEN


# "00" to "99": two digits per division.
cdef const char* PAIRS = (
    b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    b"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    b"8081828384858687888990919293949596979899"
)


cdef int _put_int(Out* o, int64_t value) except -1:
    """The decimal digits of value, as ``str(int)``."""
    cdef char digits[24]
    cdef int i = 24
    cdef uint64_t u = <uint64_t>value if value >= 0 else (<uint64_t>0) - <uint64_t>value
    cdef uint64_t pair
    while u >= 100:
        pair = u % 100
        u //= 100
        i -= 2
        digits[i] = PAIRS[2 * pair]
        digits[i + 1] = PAIRS[2 * pair + 1]
    if u >= 10:
        i -= 2
        digits[i] = PAIRS[2 * u]
        digits[i + 1] = PAIRS[2 * u + 1]
    else:
        i -= 1
        digits[i] = <char>(48 + u)
    if value < 0:
        i -= 1
        digits[i] = 45  # "-"
    return _put(o, digits + i, 24 - i)


cdef int _put_pyint(Out* o, object value) except -1:
    """An exact int's ``str``: in C when it fits int64, else Python's (its digits are ASCII)."""
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        return _put_text(o, str(value))
    return _put_int(o, v)


cdef inline bint _exact_int64(object value, int64_t* out) except -1:
    """value as int64 when it is an exact int in range, else False (no exception)."""
    cdef int overflow = 0
    if type(value) is not int:
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return not overflow


cdef inline int64_t _floor_div(int64_t a, int64_t b) noexcept nogil:
    """Python's a // b for b > 0."""
    cdef int64_t q = a / b
    if a % b != 0 and a < 0:
        q -= 1
    return q


cdef inline Py_ssize_t _str_len(object text) noexcept:
    return PyUnicode_GET_LENGTH(text)


# ------------------------------------------------------------------ the file exporter's JSON lines

cdef struct Second:
    int64_t second
    char text[19]


cdef inline void _digits(char* at, int64_t value, int width) noexcept nogil:
    while width > 0:
        width -= 1
        at[width] = <char>(48 + value % 10)
        value //= 10


cdef void _civil(Second* cached, int64_t second) noexcept nogil:
    """``YYYY-MM-DDTHH:MM:SS`` (UTC) of a second since the epoch, 0 <= second (proleptic Gregorian days).

    The days-to-date step is Howard Hinnant's ``civil_from_days``.
    """
    cdef int64_t days = second // 86400
    cdef int64_t rest = second % 86400
    cdef int64_t z = days + 719468
    cdef int64_t era = z // 146097
    cdef int64_t doe = z - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    cdef int64_t day = doy - (153 * mp + 2) // 5 + 1
    cdef int64_t month = mp + 3 if mp < 10 else mp - 9
    cdef int64_t year = yoe + era * 400 + (1 if month <= 2 else 0)
    cdef char* t = cached.text
    _digits(t, year, 4)
    t[4] = 45  # -
    _digits(t + 5, month, 2)
    t[7] = 45
    _digits(t + 8, day, 2)
    t[10] = 84  # T
    _digits(t + 11, rest // 3600, 2)
    t[13] = 58  # :
    _digits(t + 14, rest % 3600 // 60, 2)
    t[16] = 58
    _digits(t + 17, rest % 60, 2)
    cached.second = second


cdef int _put_time(Out* o, object ns, Second* cached) except -1:
    """``FileBatches._time``: ``"YYYY-MM-DDTHH:MM:SS.ffffffZ"``, rounded to the microsecond."""
    cdef int64_t value, micros, second
    cdef char text[29]
    if not _exact_int64(ns, &value) or not 0 <= value <= MAX_NS:
        return OTHER
    micros = (value + 500) // 1000
    second = micros // 1000000
    if second != cached.second:
        _civil(cached, second)
    text[0] = 34  # "
    memcpy(text + 1, cached.text, 19)
    text[20] = 46  # .
    _digits(text + 21, micros % 1000000, 6)
    text[27] = 90  # Z
    text[28] = 34
    return _put(o, text, 29)


cdef int _put_context(Out* o, object trace_id, object span_id, object state) except -1:
    """``FileBatches._context`` with the tracestate's JSON already looked up."""
    _puts(o, b'{"trace_id": "0x')
    if _put_text(o, trace_id):
        return OTHER
    _puts(o, b'", "span_id": "0x')
    if _put_text(o, span_id):
        return OTHER
    _puts(o, b'", "trace_state": ')
    if _put_text(o, state):
        return OTHER
    _put_byte(o, 125)  # }
    return WRITTEN


cdef int _file_line(
    Out* o, object s, object batches, dict heads, dict states, object no_state, object unset, object ok,
    object error, object resource, Second* cached,
) except -1:
    cdef int64_t status = 0
    cdef bint first
    shape = s.shape
    head = heads.get(shape) or batches._head(shape)
    if type(head) is not tuple or len(<tuple>head) != 3:
        return OTHER
    before, after, shape_attributes = <tuple>head
    if _put_text(o, before):
        return OTHER
    tracestate = s.tracestate
    state = states.get(tracestate) or batches._state(tracestate)
    if _put_context(o, s.trace_id, s.span_id, state) or _put_text(o, after):
        return OTHER
    parent_id = s.parent_id
    if parent_id:
        _puts(o, b'"parent_id": "0x')
        if _put_text(o, parent_id):
            return OTHER
        _puts(o, b'", ')
    else:
        _puts(o, b'"parent_id": null, ')
    _puts(o, b'"start_time": ')
    if _put_time(o, s.start_ns, cached):
        return OTHER
    _puts(o, b', "end_time": ')
    if _put_time(o, s.end_ns, cached):
        return OTHER
    _puts(o, b', "status": ')
    if not _exact_int64(s.status, &status):
        return OTHER
    if status == UNSET:
        text = unset
    elif status == OK:
        text = ok
    elif status == ERROR:
        text = error(s.message)
    else:
        return OTHER
    if _put_text(o, text):
        return OTHER
    _puts(o, b', "attributes": ')
    attributes = s.attributes
    if attributes:
        if shape_attributes:
            if _put_text(o, shape_attributes):
                return OTHER
            _puts(o, b", ")
        else:
            _put_byte(o, 123)  # {
        first = True
        for key, value in attributes:
            if not first:
                _puts(o, b", ")
            first = False
            _put_byte(o, 34)  # "
            if _put_text(o, key):
                return OTHER
            _puts(o, b'": ')
            if type(value) is int:
                _put_pyint(o, value)
            elif _put_text(o, dumps(value)):
                return OTHER
        _put_byte(o, 125)  # }
    elif shape_attributes:
        if _put_text(o, shape_attributes):
            return OTHER
        _put_byte(o, 125)
    else:
        _puts(o, b"{}")
    _puts(o, b', "events": [], "links": [')
    links = s.links
    if links:
        first = True
        for link in links:
            if not first:
                _puts(o, b", ")
            first = False
            _puts(o, b'{"context": ')
            if _put_context(o, link.trace_id, link.span_id, no_state):
                return OTHER
            _puts(o, b', "attributes": null}')
    _puts(o, b'], "resource": ')
    if _put_text(o, resource):
        return OTHER
    _puts(o, b"}\n")
    return WRITTEN


def file_lines(batches, spans, statuses, error):
    """``FileBatches.encode_bytes`` of spans, or None when a span is not one this module writes (see the module).

    Args:
        batches: the `FileBatches` whose caches (``_heads``, ``_states``, ``_resource``) and cache
            fillers (``_head``, ``_state``) are used and filled.
        spans: the `RecordSpan` batch.
        statuses: the JSON of the UNSET and OK statuses (``_file._STATUS``).
        error: the JSON of an ERROR status from its message (``_file._error``).
    """
    cdef Buffers b
    cdef Second cached
    cdef dict heads = batches._heads
    cdef dict states = batches._states
    resource = batches._resource
    unset, ok = statuses[UNSET], statuses[OK]
    no_state = states.get("") or batches._state("")
    cached.second = -1
    _take_buffers(&b)
    try:
        for s in spans:
            if _file_line(b.batch, s, batches, heads, states, no_state, unset, ok, error, resource, &cached):
                return None
        return _as_bytes(b.batch)
    finally:
        _release_buffers(&b)


# ------------------------------------------------------------------ Zipkin JSON v2

cdef int _zipkin_span(
    Out* o, object s, object batches, dict heads, object unset, object ok, object tag
) except -1:
    cdef int64_t start = 0, end = 0, status = 0
    _puts(o, b'{"traceId":"')
    if _put_text(o, s.trace_id):
        return OTHER
    _puts(o, b'","id":"')
    if _put_text(o, s.span_id):
        return OTHER
    _puts(o, b'",')
    parent_id = s.parent_id
    if parent_id:
        _puts(o, b'"parentId":"')
        if _put_text(o, parent_id):
            return OTHER
        _puts(o, b'",')
    if not _exact_int64(s.start_ns, &start) or not _exact_int64(s.end_ns, &end):
        return OTHER
    if not (0 <= start <= MAX_NS and 0 <= end <= MAX_NS):
        return OTHER
    _puts(o, b'"timestamp":')
    _put_int(o, (start + 500) // 1000)
    _puts(o, b',"duration":')
    _put_int(o, _floor_div(end - start + 500, 1000))
    _put_byte(o, 44)  # ,
    shape = s.shape
    if _put_text(o, heads.get(shape) or batches._head(shape)):
        return OTHER
    attributes = s.attributes
    if attributes:
        for key, value in attributes:
            _puts(o, b',"')
            if _put_text(o, key):
                return OTHER
            _puts(o, b'":')
            if type(value) is int:
                _put_byte(o, 34)  # "
                _put_pyint(o, value)
                _put_byte(o, 34)
            elif _put_text(o, tag(value)):
                return OTHER
    if not _exact_int64(s.status, &status):
        return OTHER
    if status == ERROR:
        _puts(o, b',"otel.status_code":"ERROR","error":')
        if _put_text(o, tag(s.message)):
            return OTHER
    elif status == UNSET:
        if _put_text(o, unset):
            return OTHER
    elif status == OK:
        if _put_text(o, ok):
            return OTHER
    else:
        return OTHER
    _puts(o, b'},"debug":true}')
    return WRITTEN


def zipkin_spans(batches, spans, status_tags, tag):
    """``ZipkinBatches.encode_bytes`` of spans, or None when a span is not one this module writes (see the module).

    Args:
        batches: the `ZipkinBatches` whose head cache (``_heads``) and filler (``_head``) are used and filled.
        spans: the `RecordSpan` batch.
        status_tags: the tags of the UNSET and OK statuses (``_zipkin._STATUS_TAGS``).
        tag: a tag value's JSON (``_zipkin._tag``), for str attribute values and ERROR messages.
    """
    cdef Buffers b
    cdef dict heads = batches._heads
    cdef bint first = True
    unset, ok = status_tags[UNSET], status_tags[OK]
    _take_buffers(&b)
    try:
        _put_byte(b.batch, 91)  # [
        for s in spans:
            if not first:
                _put_byte(b.batch, 44)  # ,
            first = False
            if _zipkin_span(b.batch, s, batches, heads, unset, ok, tag):
                return None
        _put_byte(b.batch, 93)  # ]
        return _as_bytes(b.batch)
    finally:
        _release_buffers(&b)


# ------------------------------------------------------------------ OTLP protobuf

# Field tags (field number << 3 | wire type) of trace.proto's Span, Link, Status, KeyValue and AnyValue.
cdef enum:
    SPAN_TRACE_ID = 0x0A
    SPAN_SPAN_ID = 0x12
    SPAN_TRACE_STATE = 0x1A
    SPAN_PARENT_SPAN_ID = 0x22
    SPAN_START = 0x39
    SPAN_END = 0x41
    SPAN_ATTRIBUTE = 0x4A
    SPAN_LINK = 0x6A
    SPAN_STATUS = 0x7A
    LINK_TRACE_ID = 0x0A
    LINK_SPAN_ID = 0x12
    STATUS_MESSAGE = 0x12
    STATUS_CODE = 0x18
    KEY_VALUE_KEY = 0x0A
    KEY_VALUE_VALUE = 0x12
    ANY_VALUE_INT = 0x18
    SCOPE_SPANS_SPAN = 0x12
    RESOURCE_SPANS_SCOPE_SPANS = 0x12
    REQUEST_RESOURCE_SPANS = 0x0A

# A hex digit's value, or 255: the 0-9, a-f and A-F that bytes.fromhex reads.
cdef unsigned char HEX[256]
cdef int _i
for _i in range(256):
    HEX[_i] = 255
for _i in range(10):
    HEX[ord("0") + _i] = _i
for _i in range(6):
    HEX[ord("a") + _i] = 10 + _i
    HEX[ord("A") + _i] = 10 + _i


cdef inline Py_ssize_t _varint_size(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline char* _write_varint(char* at, uint64_t v) noexcept nogil:
    """``_protowire.varint`` (an int64 as its two's complement) at at; the end of it."""
    while v >= 0x80:
        at[0] = <char>((v & 0x7F) | 0x80)
        v >>= 7
        at += 1
    at[0] = <char>v
    return at + 1


cdef int _put_varint(Out* o, uint64_t v) except -1:
    cdef char out[10]
    return _put(o, out, _write_varint(out, v) - out)


cdef int _put_field(Out* o, unsigned char tag, const char* payload, Py_ssize_t n) except -1:
    """``_protowire.len_field`` (for fields with one-byte tags)."""
    _put_byte(o, tag)
    _put_varint(o, <uint64_t>n)
    return _put(o, payload, n)


cdef int _put_id(Out* o, unsigned char tag, object hex_id, Py_ssize_t size) except -1:
    """An id field: tag, size and ``bytes.fromhex`` of the id (2 * size hex digits exactly, else OTHER)."""
    cdef const unsigned char* digits
    cdef unsigned char high, low
    cdef Py_ssize_t i
    if type(hex_id) is not str or not PyUnicode_IS_ASCII(hex_id) or _str_len(hex_id) != 2 * size:
        return OTHER
    digits = <const unsigned char*>PyUnicode_DATA_CHARS(hex_id)
    _put_byte(o, tag)
    _put_byte(o, <unsigned char>size)
    if o.size + size > o.capacity:
        _reserve(o, size)
    for i in range(size):
        high = HEX[digits[2 * i]]
        low = HEX[digits[2 * i + 1]]
        if high == 255 or low == 255:
            return OTHER
        o.data[o.size + i] = <char>(high << 4 | low)
    o.size += size
    return WRITTEN


cdef int _put_fixed64(Out* o, object ns) except -1:
    """``struct.pack("<Q", ns)``: an exact int in 0 <= ns < 2**63, else OTHER."""
    cdef int64_t value
    cdef unsigned char out[8]
    cdef int i
    if not _exact_int64(ns, &value) or value < 0:
        return OTHER
    for i in range(8):
        out[i] = <unsigned char>((<uint64_t>value >> (8 * i)) & 0xFF)
    return _put(o, <char*>out, 8)


cdef int _put_key_value(Out* o, object key, object value, object key_value) except -1:
    """``_otlp._key_value``: int64 values of ASCII keys here, the others by key_value."""
    cdef int64_t number
    cdef Py_ssize_t key_size, any_size, body
    if type(key) is str and PyUnicode_IS_ASCII(key) and type(value) is int and _exact_int64(value, &number):
        key_size = _str_len(key)
        any_size = 1 + _varint_size(<uint64_t>number)
        body = 1 + _varint_size(<uint64_t>key_size) + key_size + 1 + _varint_size(<uint64_t>any_size) + any_size
        _put_byte(o, SPAN_ATTRIBUTE)
        _put_varint(o, <uint64_t>body)
        _put_field(o, KEY_VALUE_KEY, PyUnicode_DATA_CHARS(key), key_size)
        _put_byte(o, KEY_VALUE_VALUE)
        _put_varint(o, <uint64_t>any_size)
        _put_byte(o, ANY_VALUE_INT)
        return _put_varint(o, <uint64_t>number)
    return _put_bytes(o, key_value(key, value))


cdef int _put_utf8_field(Out* o, unsigned char tag, object text) except -1:
    """``len_field(tag >> 3, text.encode())`` of an exact str, else OTHER."""
    cdef Py_ssize_t n
    cdef const char* utf8
    if type(text) is not str:
        return OTHER
    utf8 = PyUnicode_AsUTF8AndSize(text, &n)
    return _put_field(o, tag, utf8, n)


cdef int _otlp_span(
    Out* o, Out* body, object s, object batches, dict shapes, object key_value,
    object flags_local, object flags_remote, object link_flags,
) except -1:
    """One ``Span`` (ScopeSpans.spans field): written to body, then to o with its length."""
    cdef int64_t status
    cdef Py_ssize_t link_size = 2 + 16 + 2 + 8 + PyBytes_GET_SIZE(link_flags)
    cdef Py_ssize_t status_size, message_size = 0
    cdef const char* utf8 = NULL
    cdef bint has_message
    body.size = 0
    if _put_id(body, SPAN_TRACE_ID, s.trace_id, 16) or _put_id(body, SPAN_SPAN_ID, s.span_id, 8):
        return OTHER
    tracestate = s.tracestate
    if tracestate and _put_utf8_field(body, SPAN_TRACE_STATE, tracestate):
        return OTHER
    parent_id = s.parent_id
    if parent_id and _put_id(body, SPAN_PARENT_SPAN_ID, parent_id, 8):
        return OTHER
    shape = s.shape
    if _put_bytes(body, shapes.get(shape) or batches._shape(shape)):
        return OTHER
    _put_byte(body, SPAN_START)
    if _put_fixed64(body, s.start_ns):
        return OTHER
    _put_byte(body, SPAN_END)
    if _put_fixed64(body, s.end_ns):
        return OTHER
    attributes = s.attributes
    if attributes:
        for key, value in attributes:
            if _put_key_value(body, key, value, key_value):
                return OTHER
    for link in s.links:
        _put_byte(body, SPAN_LINK)
        _put_varint(body, <uint64_t>link_size)
        if _put_id(body, LINK_TRACE_ID, link.trace_id, 16) or _put_id(body, LINK_SPAN_ID, link.span_id, 8):
            return OTHER
        _put_bytes(body, link_flags)
    # Status (field 15) always, as the SDK encodes it: message = 2, code = 3.
    if not _exact_int64(s.status, &status) or not 0 <= status <= 255:
        return OTHER
    message = s.message
    has_message = bool(message)
    status_size = 2 if status else 0
    if has_message:
        if type(message) is not str:
            return OTHER
        utf8 = PyUnicode_AsUTF8AndSize(message, &message_size)
        status_size += 1 + _varint_size(<uint64_t>message_size) + message_size
    _put_byte(body, SPAN_STATUS)
    _put_varint(body, <uint64_t>status_size)
    if has_message:
        _put_field(body, STATUS_MESSAGE, utf8, message_size)
    if status:
        _put_byte(body, STATUS_CODE)
        _put_byte(body, <unsigned char>status)
    if _put_bytes(body, flags_remote if s.remote_parent else flags_local):
        return OTHER
    return _put_field(o, SCOPE_SPANS_SPAN, body.data, body.size)


def otlp_request(batches, spans, key_value, flags_local, flags_remote, link_flags):
    """``OtlpBatches.encode`` of spans, or None when a span is not one this module writes (see the module).

    Args:
        batches: the `OtlpBatches` whose caches (``_shapes``, ``_resource``, ``_scope``) and shape
            filler (``_shape``) are used and filled.
        spans: the `RecordSpan` batch.
        key_value: a ``KeyValue`` attribute field (``_otlp._key_value``), for other than int64 values.
        flags_local, flags_remote: ``Span.flags`` of a span with a local or remote parent.
        link_flags: ``Link.flags``.
    """
    cdef Buffers b
    cdef Out* o
    cdef dict shapes = batches._shapes
    cdef bytes resource = batches._resource
    cdef bytes scope = batches._scope
    cdef Py_ssize_t scope_spans, resource_spans, head
    cdef char* data
    if not (type(flags_local) is type(flags_remote) is type(link_flags) is bytes):
        return None
    _take_buffers(&b)
    o = b.batch
    try:
        for s in spans:
            if _otlp_span(o, b.span, s, batches, shapes, key_value, flags_local, flags_remote, link_flags):
                return None
        # ExportTraceServiceRequest.resource_spans = 1 { resource, ResourceSpans.scope_spans = 2 { scope, spans } }
        scope_spans = PyBytes_GET_SIZE(scope) + o.size
        resource_spans = PyBytes_GET_SIZE(resource) + 1 + _varint_size(<uint64_t>scope_spans) + scope_spans
        head = 1 + _varint_size(<uint64_t>resource_spans) + resource_spans - o.size
        request = PyBytes_FromStringAndSize(NULL, head + o.size)
        data = PyBytes_AS_STRING(request)
        data[0] = REQUEST_RESOURCE_SPANS
        data = _write_varint(data + 1, <uint64_t>resource_spans)
        memcpy(data, PyBytes_AS_STRING(resource), <size_t>PyBytes_GET_SIZE(resource))
        data += PyBytes_GET_SIZE(resource)
        data[0] = RESOURCE_SPANS_SCOPE_SPANS
        data = _write_varint(data + 1, <uint64_t>scope_spans)
        memcpy(data, PyBytes_AS_STRING(scope), <size_t>PyBytes_GET_SIZE(scope))
        data += PyBytes_GET_SIZE(scope)
        if o.size:
            memcpy(data, o.data, <size_t>o.size)
        return request
    finally:
        _release_buffers(&b)
