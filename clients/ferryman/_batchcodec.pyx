# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled fast path of the columnar RecordBatch codec (see envelope.proto).

Why it exists: the pure-Python codec (``ferryman.envelope``) moves each column
through a Python list and a protobuf repeated field, which costs ~230 ns per
record to build and ~120 ns to read back on this machine: a quarter of what
Ferryman spends per record beyond a bare copy loop. Here one pass over the
consumed messages writes the protobuf wire format straight into the output
bytes, and one pass over those bytes makes the column lists the deduper
produces from.

It also splits the wrapper's consume() batches by partition and finds error
events in them (``partition_chunks``, ``has_error_events``), reading each
Message's fields directly where its layout allows (see "reading a Message").

What it handles, and what it leaves: the shapes the wrapper writes.
``encode_messages`` returns None for keys, values or headers of other types
than a consumed record's, and ``decode_columns`` returns None for anything but
the canonical columnar form (the row form, unpacked repeated scalars,
unexpected wire types, malformed bytes); the caller then takes the protobuf
library's path, which stays the reference for both directions. The tests hold
the two paths to the same results.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLong, PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy

from confluent_kafka import KafkaError, Message

cdef object _offset = Message.offset
cdef object _key = Message.key
cdef object _value = Message.value
cdef object _headers = Message.headers
cdef object _timestamp = Message.timestamp

# ------------------------------------------------------- reading a Message
# Calling a consumed Message's accessors costs ~50-70 ns each (timestamp()
# builds a tuple), four or five per record: most of encode_messages' time.
# The fields they return sit in the Message object itself, so when its layout
# is the one declared here the codec reads them directly, as the accessors do.
# The layout is confluent-kafka's private struct, so it is checked at import
# (_layout_matches: the type's size, then every field of probe messages against
# the accessors); when anything differs, the accessors are called as before.
cdef extern from *:
    """
    /* The Message object of confluent-kafka (struct Message in
       src/confluent_kafka/src/confluent_kafka.h, unchanged from 2.10 to 2.16). */
    typedef struct {
        PyObject_HEAD
        PyObject *topic;
        PyObject *value;
        PyObject *key;
        PyObject *headers;
        void *c_headers;
        PyObject *error;
        int32_t partition;
        int64_t offset;
        int32_t leader_epoch;
        int64_t timestamp;
        int tstype;
        int64_t latency;
        int16_t delivery_count;
    } ferryman_KafkaMessage;
    """
    ctypedef struct KafkaMessage "ferryman_KafkaMessage":
        PyObject* topic
        PyObject* value
        PyObject* key
        PyObject* headers
        void* c_headers
        PyObject* error
        int32_t partition
        int64_t offset
        int32_t leader_epoch
        int64_t timestamp
        int tstype


cdef inline object _field(PyObject* p):
    """A Message's object field as its accessor returns it (NULL is None)."""
    return <object>p if p != NULL else None


cdef bint _reads_match(object m):
    """Whether reading m's fields directly gives what its accessors return."""
    cdef KafkaMessage* c = <KafkaMessage*><PyObject*>m
    topic, key, value, headers, error = _field(c.topic), _field(c.key), _field(c.value), _field(c.headers), _field(c.error)
    stamp = (c.tstype, c.timestamp)
    epoch = c.leader_epoch if c.leader_epoch >= 0 else None  # as leader_epoch() gives it
    return (
        topic is m.topic() and key is m.key() and value is m.value() and headers is m.headers()
        and error is m.error() and c.partition == m.partition() and c.offset == m.offset()
        and epoch == m.leader_epoch() and stamp == m.timestamp()
    )


cdef bint _layout_matches():
    """Whether this confluent-kafka's Message has the layout declared above."""
    if Message.__basicsize__ != sizeof(KafkaMessage):
        return False
    probes = [
        Message(topic="ferryman-layout-probe", partition=7, offset=1234567890123, key=b"key", value=None,
                headers=[("h", b"v"), ("n", None)], timestamp=(2, 1700000000123), leader_epoch=5),
        Message(topic="t", partition=0, offset=0, key=None, value=b"value", timestamp=(1, -5), leader_epoch=0),
        Message(topic="t", partition=3, offset=42, error=KafkaError(KafkaError._PARTITION_EOF), timestamp=(0, 0)),
    ]
    return all(_reads_match(m) for m in probes)


cdef bint _direct = _layout_matches()
#: Whether encode_messages reads Message fields directly (else through the accessors).
DIRECT_MESSAGE_READS = _direct
# The class as a C-level reference: _readable runs per record, and a module global is a dict lookup.
cdef object _Message = Message


cdef inline bint _readable(object m):
    return _direct and type(m) is _Message


cdef inline bint _is_error_event(KafkaMessage* c) noexcept:
    """What ``error() is not None`` says: consumed records hold None there, constructed ones NULL."""
    return c.error != NULL and c.error != <PyObject*>None


cdef inline int64_t _offset_of(object m) except? -1:
    if _readable(m) and (<KafkaMessage*><PyObject*>m).offset >= 0:
        return (<KafkaMessage*><PyObject*>m).offset
    return _offset(m)


def has_error_events(list messages):
    """Whether any of the consumed messages is an error event (``error()`` is not None)."""
    cdef Py_ssize_t i
    for i in range(PyList_GET_SIZE(messages)):
        m = <object>PyList_GET_ITEM(messages, i)
        if _is_error_event(<KafkaMessage*><PyObject*>m) if _readable(m) else m.error() is not None:
            return True
    return False


cdef inline int _has_headers(KafkaMessage* c) except -1:
    """A readable message has headers: still in C (not yet Python objects), or a non-empty list."""
    return c.c_headers != NULL or (c.headers != NULL and c.headers != <PyObject*>None and bool(<object>c.headers))


# batch_flags bits.
BATCH_ERRORS = 1
BATCH_HEADERS = 2


def batch_flags(list messages):
    """What a consumed batch holds, in one pass: ``BATCH_ERRORS`` | ``BATCH_HEADERS`` bits.

    BATCH_ERRORS: an error event (as `has_error_events`). BATCH_HEADERS: a record
    with headers, found as `header_indexes` finds them (headers not yet Python
    objects count); the tracer looks for trace context only in such batches.
    """
    cdef Py_ssize_t i
    cdef KafkaMessage* c
    cdef int flags = 0
    for i in range(PyList_GET_SIZE(messages)):
        m = <object>PyList_GET_ITEM(messages, i)
        if _readable(m):
            c = <KafkaMessage*><PyObject*>m
            if _is_error_event(c):
                flags |= BATCH_ERRORS
            elif _has_headers(c):
                flags |= BATCH_HEADERS
        elif m.error() is not None:
            flags |= BATCH_ERRORS
        elif _headers(m):
            flags |= BATCH_HEADERS
    return flags


def partition_chunks(list messages):
    """The runs of consecutive messages from one topic partition, as (topic, partition, lo, hi), or None.

    librdkafka hands out each partition's messages in contiguous chunks, so a
    consume() batch holds a few. None: a message that is an error event or
    that cannot be read directly (see _layout_matches), left to the caller's
    accessor path.
    """
    cdef Py_ssize_t i, lo = 0, n = PyList_GET_SIZE(messages)
    cdef KafkaMessage* c
    cdef int32_t partition = 0
    cdef object topic = None
    cdef list chunks = []
    for i in range(n):
        m = <object>PyList_GET_ITEM(messages, i)
        if not _readable(m):
            return None
        c = <KafkaMessage*><PyObject*>m
        if _is_error_event(c) or c.topic == NULL or c.partition < 0:
            return None
        if i == 0:
            topic, partition = <object>c.topic, c.partition
        elif c.partition != partition or (c.topic != <PyObject*>topic and <object>c.topic != topic):
            chunks.append((topic, partition, lo, i))
            topic, partition, lo = <object>c.topic, c.partition, i
    if n:
        chunks.append((topic, partition, lo, n))
    return chunks

# RecordBatch field tags (field number << 3 | wire type).
cdef enum:
    TAG_RECORDS = 0x0A
    TAG_OFFSETS = 0x12
    TAG_TIMESTAMPS = 0x1A
    TAG_TYPES = 0x22
    TAG_KEYS = 0x2A
    TAG_NULL_KEYS = 0x32
    TAG_VALUES = 0x3A
    TAG_NULL_VALUES = 0x42
    TAG_HEADERS = 0x4A
    TAG_BASE_OFFSET = 0x50

# confluent-kafka's timestamp type codes 0..2 are the proto enum's values 1..3.
cdef enum:
    TYPE_SHIFT = 1
    KNOWN_TYPE_CODES = 3


cdef inline Py_ssize_t _varint_size(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline unsigned char* _put_varint(unsigned char* p, uint64_t v) noexcept nogil:
    while v >= 0x80:
        p[0] = <unsigned char>((v & 0x7F) | 0x80)
        v >>= 7
        p += 1
    p[0] = <unsigned char>v
    return p + 1


cdef inline Py_ssize_t _packed_size(const int64_t* xs, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t size = 0
    cdef Py_ssize_t i
    for i in range(n):
        size += _varint_size(<uint64_t>xs[i])
    return size


cdef inline unsigned char* _put_packed(unsigned char* p, int tag, const int64_t* xs, Py_ssize_t n,
                                       Py_ssize_t body) noexcept nogil:
    cdef Py_ssize_t i
    p[0] = <unsigned char>tag
    p = _put_varint(p + 1, <uint64_t>body)
    for i in range(n):
        p = _put_varint(p, <uint64_t>xs[i])
    return p


cdef inline Py_ssize_t _field_size(Py_ssize_t body) noexcept nogil:
    """A length-delimited field's size with its one-byte tag and length prefix."""
    return 1 + _varint_size(<uint64_t>body) + body


cdef Py_ssize_t _column_size(list column, Py_ssize_t n, int64_t* nulls, Py_ssize_t* null_count) except -1:
    """Wire size of a keys/values column's entries; fills nulls with the None entries' indexes."""
    cdef Py_ssize_t size = 0
    cdef Py_ssize_t i, k = 0, length
    cdef PyObject* item
    for i in range(n):
        item = PyList_GET_ITEM(column, i)
        if item == <PyObject*>None:
            nulls[k] = i
            k += 1
            size += 2  # tag and a zero length, when written as an empty entry
        else:
            length = PyBytes_GET_SIZE(<object>item)
            size += 1 + _varint_size(<uint64_t>length) + length
    null_count[0] = k
    return size


cdef unsigned char* _put_column(unsigned char* p, int tag, list column, Py_ssize_t n):
    cdef Py_ssize_t i, length
    cdef PyObject* item
    for i in range(n):
        item = PyList_GET_ITEM(column, i)
        p[0] = <unsigned char>tag
        if item == <PyObject*>None:
            p[1] = 0
            p += 2
        else:
            length = PyBytes_GET_SIZE(<object>item)
            p = _put_varint(p + 1, <uint64_t>length)
            memcpy(p, PyBytes_AS_STRING(<object>item), length)
            p += length
    return p


cdef Py_ssize_t _header_size(object header) except -2:
    """Size of one Header message (key, value); -1 when header is not a (str, bytes or None) pair."""
    cdef Py_ssize_t key_len, size = 0
    if type(header) is not tuple or len(<tuple>header) != 2:
        return -1
    key, value = <tuple>header
    if type(key) is not str or (value is not None and type(value) is not bytes):
        return -1
    PyUnicode_AsUTF8AndSize(key, &key_len)
    if key_len:
        size += _field_size(key_len)  # proto3: an empty key is not written
    if value is not None:
        size += _field_size(PyBytes_GET_SIZE(value))  # optional: an empty value is written
    return size


cdef Py_ssize_t _record_headers_size(Py_ssize_t index, list headers) except -2:
    """Size of one RecordHeaders message body; -1 when a header is not a (str, bytes or None) pair."""
    cdef Py_ssize_t size = 1 + _varint_size(<uint64_t>index) if index else 0
    cdef Py_ssize_t h
    for header in headers:
        h = _header_size(header)
        if h < 0:
            return -1
        size += _field_size(h)
    return size


cdef unsigned char* _put_record_headers(unsigned char* p, Py_ssize_t index, list headers, Py_ssize_t body):
    cdef Py_ssize_t key_len
    cdef const char* key_utf8
    p[0] = TAG_HEADERS
    p = _put_varint(p + 1, <uint64_t>body)
    if index:
        p[0] = 0x08  # RecordHeaders.index
        p = _put_varint(p + 1, <uint64_t>index)
    for header in headers:
        key, value = <tuple>header
        p[0] = 0x12  # RecordHeaders.headers
        p = _put_varint(p + 1, <uint64_t>_header_size(header))
        key_utf8 = PyUnicode_AsUTF8AndSize(key, &key_len)
        if key_len:
            p[0] = 0x0A  # Header.key
            p = _put_varint(p + 1, <uint64_t>key_len)
            memcpy(p, key_utf8, key_len)
            p += key_len
        if value is not None:
            p[0] = 0x12  # Header.value
            p = _put_varint(p + 1, <uint64_t>PyBytes_GET_SIZE(value))
            memcpy(p, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
            p += PyBytes_GET_SIZE(value)
    return p


def encode_messages(list messages, Py_ssize_t lo, Py_ssize_t hi):
    """(serialized columnar RecordBatch of messages[lo:hi], number of headers in it), or None.

    The messages are consumed records of one partition in increasing offset
    order (no error events); keys and values are bytes or None, headers None or
    a list of (str, bytes or None) pairs. None: a key, value or headers list of
    another type, left to the pure-Python path. The result parses to the same RecordBatch the pure-Python codec
    builds, except that timestamp types are written once whenever this slice's
    are uniform.
    """
    cdef Py_ssize_t n = hi - lo
    cdef Py_ssize_t i
    cdef object m, stamp
    cdef int64_t first, last
    cdef bint consecutive
    cdef int64_t* ints = NULL
    cdef int64_t* offsets
    cdef int64_t* stamps
    cdef int64_t* types
    cdef int64_t* null_keys
    cdef int64_t* null_values
    cdef Py_ssize_t n_null_keys = 0, n_null_values = 0, n_types
    cdef Py_ssize_t offsets_body = 0, stamps_body, types_body, keys_size, values_size
    cdef Py_ssize_t null_keys_body = 0, null_values_body = 0, size
    cdef Py_ssize_t header_count = 0, rh
    cdef list with_headers = []  # (index, headers, body size) of the records that have any
    cdef int64_t code
    cdef KafkaMessage* c
    cdef bytes out
    cdef unsigned char* p
    if n <= 0 or lo < 0 or hi > PyList_GET_SIZE(messages):
        raise ValueError(f"bad slice [{lo}:{hi}] of {PyList_GET_SIZE(messages)} messages")
    first = _offset_of(<object>PyList_GET_ITEM(messages, lo))
    last = _offset_of(<object>PyList_GET_ITEM(messages, hi - 1))
    consecutive = last - first == n - 1
    keys = PyList_New(n)
    values = PyList_New(n)
    ints = <int64_t*>PyMem_Malloc(5 * n * sizeof(int64_t))
    if ints == NULL:
        raise MemoryError()
    offsets, stamps, types = ints, ints + n, ints + 2 * n
    null_keys, null_values = ints + 3 * n, ints + 4 * n
    try:
        for i in range(n):
            m = <object>PyList_GET_ITEM(messages, lo + i)
            if _readable(m):
                c = <KafkaMessage*><PyObject*>m
                # Headers not yet made Python objects (c_headers) are left to the accessor, which converts them.
                hs = _field(c.headers) if c.c_headers == NULL else _headers(m)
                k = _field(c.key)
                v = _field(c.value)
                code = c.tstype
                stamps[i] = c.timestamp
                if not consecutive:
                    offsets[i] = c.offset if c.offset >= 0 else _offset(m)  # _offset_of, m known readable
            else:
                hs = _headers(m)
                k = _key(m)
                v = _value(m)
                stamp = _timestamp(m)
                code = PyLong_AsLongLong(<object>PyTuple_GET_ITEM(stamp, 0))
                stamps[i] = PyLong_AsLongLong(<object>PyTuple_GET_ITEM(stamp, 1))
                if not consecutive:
                    offsets[i] = _offset(m)
            types[i] = code + TYPE_SHIFT if 0 <= code < KNOWN_TYPE_CODES else 0
            if hs:  # None and [] both mean no headers, as in the pure-Python path
                if type(hs) is not list:
                    return None
                rh = _record_headers_size(i, <list>hs)
                if rh < 0:
                    return None
                with_headers.append((i, hs, rh))
                header_count += len(<list>hs)
            if (k is not None and type(k) is not bytes) or (v is not None and type(v) is not bytes):
                return None  # not a consumed record's key or value: the library decides
            Py_INCREF(k)
            PyList_SET_ITEM(keys, i, k)
            Py_INCREF(v)
            PyList_SET_ITEM(values, i, v)
        n_types = 1
        for i in range(1, n):
            if types[i] != types[0]:
                n_types = n
                break
        stamps_body = _packed_size(stamps, n)
        types_body = _packed_size(types, n_types)
        size = _field_size(stamps_body) + _field_size(types_body)
        if consecutive:
            if first:
                size += 1 + _varint_size(<uint64_t>first)
        else:
            offsets_body = _packed_size(offsets, n)
            size += _field_size(offsets_body)
        keys_size = _column_size(keys, n, null_keys, &n_null_keys)
        values_size = _column_size(values, n, null_values, &n_null_values)
        if n_null_keys < n:
            size += keys_size
            if n_null_keys:
                null_keys_body = _packed_size(null_keys, n_null_keys)
                size += _field_size(null_keys_body)
        if n_null_values < n:
            size += values_size
            if n_null_values:
                null_values_body = _packed_size(null_values, n_null_values)
                size += _field_size(null_values_body)
        for _, _, rh in with_headers:
            size += _field_size(rh)
        out = PyBytes_FromStringAndSize(NULL, size)
        p = <unsigned char*>PyBytes_AS_STRING(out)
        if not consecutive:
            p = _put_packed(p, TAG_OFFSETS, offsets, n, offsets_body)
        p = _put_packed(p, TAG_TIMESTAMPS, stamps, n, stamps_body)
        p = _put_packed(p, TAG_TYPES, types, n_types, types_body)
        if n_null_keys < n:
            p = _put_column(p, TAG_KEYS, keys, n)
            if n_null_keys:
                p = _put_packed(p, TAG_NULL_KEYS, null_keys, n_null_keys, null_keys_body)
        if n_null_values < n:
            p = _put_column(p, TAG_VALUES, values, n)
            if n_null_values:
                p = _put_packed(p, TAG_NULL_VALUES, null_values, n_null_values, null_values_body)
        for i, hs, rh in with_headers:
            p = _put_record_headers(p, i, hs, rh)
        if consecutive and first:
            p[0] = TAG_BASE_OFFSET
            p = _put_varint(p + 1, <uint64_t>first)
        if p - <unsigned char*>PyBytes_AS_STRING(out) != size:
            raise AssertionError("record batch size miscounted")
        return out, header_count
    finally:
        PyMem_Free(ints)


# ------------------------------------------------------------------ decoding
cdef inline const unsigned char* _get_varint(const unsigned char* p, const unsigned char* end,
                                             uint64_t* out) noexcept nogil:
    """Read one varint; NULL when it runs past end or over 10 bytes."""
    cdef uint64_t v = 0
    cdef int shift = 0
    while p < end and shift < 64:
        v |= <uint64_t>(p[0] & 0x7F) << shift
        if not (p[0] & 0x80):
            out[0] = v
            return p + 1
        p += 1
        shift += 7
    return NULL


#: A varint_tag that matches no field (field numbers stop at 2**29 - 1).
cdef uint64_t NO_VARINT_FIELD = 0xFFFFFFFFFFFFFFFF


cdef inline const unsigned char* _get_field(const unsigned char* p, const unsigned char* end,
                                            uint64_t varint_tag, uint64_t* tag, uint64_t* value) noexcept nogil:
    """Read one field of a message: its tag, then the varint of the message's one varint field (varint_tag),
    or else a length-delimited field's length, checked against end. For the latter, value is the length and
    the result points at the body. NULL when malformed or of another wire type (the library's path)."""
    cdef const unsigned char* start = p
    p = _get_varint(p, end, tag)
    # A tag is a uint32 of at most 5 bytes with a field number from 1: protobuf refuses anything else.
    if p == NULL or p - start > 5 or tag[0] > <uint64_t>0xFFFFFFFFU or (tag[0] >> 3) == 0:
        return NULL
    if tag[0] == varint_tag:
        return _get_varint(p, end, value)
    if (tag[0] & 7) != 2:
        return NULL
    p = _get_varint(p, end, value)
    if p == NULL or value[0] > <uint64_t>(end - p):
        return NULL
    return p


cdef list _packed_ints(const unsigned char* p, const unsigned char* end, bint as_int32):
    """The varints of a packed field's body as a list of ints; None when malformed."""
    cdef Py_ssize_t count = 0, i = 0
    cdef const unsigned char* q = p
    cdef uint64_t v
    while q < end:
        if not (q[0] & 0x80):
            count += 1
        q += 1
    if p < end and ((end - 1)[0] & 0x80):
        return None  # the last varint is cut off
    cdef list out = PyList_New(count)
    while p < end:
        p = _get_varint(p, end, &v)
        if p == NULL:
            # Only an over-long varint gets here; give the list valid items before dropping it.
            while i < count:
                Py_INCREF(None)
                PyList_SET_ITEM(out, i, None)
                i += 1
            return None
        item = PyLong_FromLongLong(<int32_t>v if as_int32 else <int64_t>v)
        Py_INCREF(item)
        PyList_SET_ITEM(out, i, item)
        i += 1
    return out


cdef object _read_header(const unsigned char* p, const unsigned char* end):
    """One Header message as (key, value or None); None when it is not in the canonical form."""
    cdef uint64_t tag, length
    key = ""
    value = None
    while p < end:
        p = _get_field(p, end, NO_VARINT_FIELD, &tag, &length)
        if p == NULL:
            return None
        if tag == 0x0A:  # Header.key: UTF-8, as protobuf checks it
            try:
                key = PyUnicode_DecodeUTF8(<const char*>p, <Py_ssize_t>length, NULL)
            except UnicodeDecodeError:
                return None
        elif tag == 0x12:  # Header.value
            value = PyBytes_FromStringAndSize(<const char*>p, <Py_ssize_t>length)
        elif (tag >> 3) <= 2:
            return None
        p += length
    return (key, value)


cdef object _read_record_headers(const unsigned char* p, const unsigned char* end):
    """One RecordHeaders message as (index, [(key, value or None), ...]); None when not canonical."""
    cdef uint64_t tag, length
    cdef int32_t index = 0
    cdef list headers = []
    while p < end:
        p = _get_field(p, end, 0x08, &tag, &length)
        if p == NULL:
            return None
        if tag == 0x08:  # RecordHeaders.index
            index = <int32_t>length  # for the varint field, _get_field's value is the varint
            continue
        if tag == 0x12:  # RecordHeaders.headers
            header = _read_header(p, p + length)
            if header is None:
                return None
            headers.append(header)
        elif (tag >> 3) <= 2:
            return None
        p += length
    return (index, headers)


def decode_columns(bytes payload):
    """The columns of a serialized columnar RecordBatch, or None to leave it to the protobuf library.

    Returns (base_offset, offsets, timestamps_ms, timestamp_types, keys,
    null_keys, values, null_values, headers), each column a list as the
    RecordBatch's repeated field would list it, headers as (index, [(key,
    value or None), ...]) pairs; the caller checks them for consistency exactly
    as it checks a parsed RecordBatch.
    """
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef const unsigned char* end = p + PyBytes_GET_SIZE(payload)
    cdef const unsigned char* body
    cdef uint64_t tag, length
    cdef int64_t base_offset = 0
    cdef list offsets = [], stamps = [], types = [], keys = [], null_keys = [], values = []
    cdef list null_values = [], headers = []
    cdef list ints
    while p < end:
        # Unpacked scalars, groups and fixed-width fields come back NULL: the library's path.
        p = _get_field(p, end, TAG_BASE_OFFSET, &tag, &length)
        if p == NULL:
            return None
        if tag == TAG_BASE_OFFSET:
            base_offset = <int64_t>length  # for the varint field, _get_field's value is the varint
            continue
        body = p
        p += length
        if tag == TAG_KEYS:
            keys.append(PyBytes_FromStringAndSize(<const char*>body, <Py_ssize_t>length))
        elif tag == TAG_VALUES:
            values.append(PyBytes_FromStringAndSize(<const char*>body, <Py_ssize_t>length))
        elif tag == TAG_HEADERS:
            record_headers = _read_record_headers(body, p)
            if record_headers is None:
                return None
            headers.append(record_headers)
        elif tag == TAG_TIMESTAMPS or tag == TAG_OFFSETS or tag == TAG_TYPES or tag == TAG_NULL_KEYS \
                or tag == TAG_NULL_VALUES:
            ints = _packed_ints(body, p, tag != TAG_TIMESTAMPS and tag != TAG_OFFSETS)
            if ints is None:
                return None
            if tag == TAG_TIMESTAMPS:
                stamps.extend(ints)
            elif tag == TAG_OFFSETS:
                offsets.extend(ints)
            elif tag == TAG_TYPES:
                types.extend(ints)
            elif tag == TAG_NULL_KEYS:
                null_keys.extend(ints)
            else:
                null_values.extend(ints)
        elif tag == TAG_RECORDS or (tag >> 3) <= 10:
            return None  # the row form, or a known field in an unexpected shape
        # else: an unknown length-delimited field, skipped as protobuf readers do
    return (base_offset, offsets, stamps, types, keys, null_keys, values, null_values, headers)


def header_indexes(list messages):
    """Indexes of the messages that have headers, in order: where the tracer looks for trace context.

    One pass over the messages' fields, no Python object made for a message
    without headers (the tracer's per-batch decision must cost close to
    nothing for them). A message whose headers are not yet Python objects
    counts as having some; a message that cannot be read directly is asked
    through its accessor.
    """
    cdef Py_ssize_t i, n = PyList_GET_SIZE(messages)
    cdef KafkaMessage* c
    cdef list out = []
    for i in range(n):
        m = <object>PyList_GET_ITEM(messages, i)
        if _readable(m):
            c = <KafkaMessage*><PyObject*>m
            if _has_headers(c):
                out.append(i)
        elif _headers(m):
            out.append(i)
    return out


cdef const unsigned char* _skip_field(const unsigned char* p, const unsigned char* end, uint64_t tag) noexcept nogil:
    """Past the value of a field whose tag was read; NULL when malformed or a group (the library's path)."""
    cdef uint64_t v
    cdef int wire = tag & 7
    if wire == 0:
        return _get_varint(p, end, &v)
    if wire == 1:
        return p + 8 if end - p >= 8 else NULL
    if wire == 5:
        return p + 4 if end - p >= 4 else NULL
    if wire == 2:
        p = _get_varint(p, end, &v)
        return p + v if p != NULL and v <= <uint64_t>(end - p) else NULL
    return NULL


cdef object _read_record_trace(const unsigned char* p, const unsigned char* end):
    """One RecordTrace message as (offset, traceparent, tracestate); None when not in a form read here."""
    cdef uint64_t tag, value
    cdef int64_t offset = 0
    traceparent = ""
    tracestate = ""
    while p < end:
        p = _get_varint(p, end, &tag)
        if p == NULL:
            return None
        if tag == 0x08:  # RecordTrace.offset (int64)
            p = _get_varint(p, end, &value)
            if p == NULL:
                return None
            offset = <int64_t>value
            continue
        if (tag >> 3) <= 3 and tag != 0x12 and tag != 0x1A:
            return None  # a known field in an unexpected shape
        if tag == 0x12 or tag == 0x1A:  # traceparent, tracestate: UTF-8, as protobuf checks it
            p = _get_varint(p, end, &value)
            if p == NULL or value > <uint64_t>(end - p):
                return None
            try:
                text = PyUnicode_DecodeUTF8(<const char*>p, <Py_ssize_t>value, NULL)
            except UnicodeDecodeError:
                return None
            if tag == 0x12:
                traceparent = text
            else:
                tracestate = text
            p += value
            continue
        p = _skip_field(p, end, tag)  # an unknown field, skipped as protobuf readers do
        if p == NULL:
            return None
    return offset, traceparent, tracestate


def record_traces(bytes envelope):
    """An envelope's record traces as ``verify`` gives them ({offset: (traceparent, tracestate)}), read from its bytes.

    The protobuf library has parsed the envelope already; reading its repeated
    ``record_traces`` back makes a Python object per trace and per field, which
    the deduper did for every traced envelope. Here the top-level fields are
    skipped by their lengths and field 11's messages read straight into the
    dict (later traces of an offset win, as in a dict built in field order).
    None when the bytes hold anything not read here (groups, a known field in
    another shape, malformed bytes): the caller reads the parsed message.
    """
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(envelope)
    cdef const unsigned char* end = p + PyBytes_GET_SIZE(envelope)
    cdef const unsigned char* body
    cdef uint64_t tag, length
    cdef dict out = {}
    while p < end:
        p = _get_varint(p, end, &tag)
        if p == NULL:
            return None
        if tag != 0x5A:  # not Envelope.record_traces (11, length-delimited)
            if (tag >> 3) == 11:
                return None
            p = _skip_field(p, end, tag)
            if p == NULL:
                return None
            continue
        p = _get_varint(p, end, &length)
        if p == NULL or length > <uint64_t>(end - p):
            return None
        body = p
        p += length
        trace = _read_record_trace(body, p)
        if trace is None:
            return None
        out[trace[0]] = (trace[1], trace[2])
    return out
