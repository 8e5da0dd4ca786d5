# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The span reader's compiled path: fetched records straight from librdkafka into Arrow column buffers.

Why it exists: through ``Consumer.consume()`` an audit task paid for a
``Message`` object per record, then the envelope codec's columns, then
``pa.array`` per column: about half of the audit's Python CPU. Here each
``rd_kafka_message_t`` is copied once, field by field, into growable buffers
laid out as Arrow's (validity bitmaps, 32-bit offsets, data), and
``_reader`` wraps them as arrays with ``pa.Array.from_buffers``: no Python
object per record.

What it reads: one partition, forwarded to a queue of this reader's own before
the consumer assigns it (``rd_kafka_queue_forward``, as ``bench._readcols``
does), popped with ``rd_kafka_consume_batch_queue``. That is the call
confluent-kafka's ``consume()`` makes, so what comes out is what ``consume()``
returns: read_committed filtering, transaction markers skipped (their offsets
stored), consumer errors (the partition's end among them) as messages with an
error code and the offset they refer to. The forwarded queue holds only that
partition's fetch operations, so no callback of confluent-kafka's ever runs
here.

How it reaches librdkafka: ``ferryman._rdproduce.resolve`` (the library
confluent-kafka loaded, checked by its version); the ``rd_kafka_t`` pointer
heads confluent-kafka's ``Handle``. ``bind()`` says why not when it cannot,
and the reader then uses ``consume()``.
"""

from cpython.bytearray cimport (
    PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE, PyByteArray_Resize,
)
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset, strlen

from confluent_kafka import Consumer

from ferryman._rdproduce import resolve

cdef extern from *:
    """
    /* librdkafka's public message (rd_kafka_message_t in rdkafka.h). */
    typedef struct {
        int err;
        void *rkt;
        int32_t partition;
        const char *payload; /* void * in rdkafka.h: the same pointer, read as bytes */
        size_t len;
        const char *key;
        size_t key_len;
        int64_t offset;
        void *_private;
    } ferryman_span_message;

    /* The head of confluent-kafka's Handle (src/confluent_kafka/src/confluent_kafka.h). */
    typedef struct { PyObject_HEAD void *rk; } ferryman_span_Handle;

    typedef void *(*ferryman_span_queue_new_t)(void *rk);
    typedef void *(*ferryman_span_queue_get_partition_t)(void *rk, const char *topic, int32_t partition);
    typedef void (*ferryman_span_queue_forward_t)(void *src, void *dst);
    typedef void (*ferryman_span_queue_destroy_t)(void *rkqu);
    typedef long (*ferryman_span_consume_batch_queue_t)(void *rkqu, int timeout_ms,
                                                        ferryman_span_message **msgs, size_t size);
    typedef void (*ferryman_span_message_destroy_t)(ferryman_span_message *m);
    typedef int64_t (*ferryman_span_message_timestamp_t)(const ferryman_span_message *m, int *tstype);
    typedef int (*ferryman_span_message_headers_t)(const ferryman_span_message *m, void **hdrs);
    typedef int (*ferryman_span_header_get_all_t)(const void *hdrs, size_t idx, const char **name,
                                                  const void **value, size_t *size);
    typedef const char *(*ferryman_span_err2str_t)(int err);
    typedef int (*ferryman_span_type_t)(const void *rk);
    """
    ctypedef struct rd_message "ferryman_span_message":
        int err
        const char* payload
        size_t len
        const char* key
        size_t key_len
        int64_t offset
    ctypedef struct Handle "ferryman_span_Handle":
        void* rk
    ctypedef void* (*queue_new_t "ferryman_span_queue_new_t")(void* rk) noexcept nogil
    ctypedef void* (*queue_get_partition_t "ferryman_span_queue_get_partition_t")(
        void* rk, const char* topic, int32_t partition) noexcept nogil
    ctypedef void (*queue_forward_t "ferryman_span_queue_forward_t")(void* src, void* dst) noexcept nogil
    ctypedef void (*queue_destroy_t "ferryman_span_queue_destroy_t")(void* rkqu) noexcept nogil
    ctypedef long (*consume_batch_queue_t "ferryman_span_consume_batch_queue_t")(
        void* rkqu, int timeout_ms, rd_message** msgs, size_t size) noexcept nogil
    ctypedef void (*message_destroy_t "ferryman_span_message_destroy_t")(rd_message* m) noexcept nogil
    ctypedef int64_t (*message_timestamp_t "ferryman_span_message_timestamp_t")(
        const rd_message* m, int* tstype) noexcept nogil
    ctypedef int (*message_headers_t "ferryman_span_message_headers_t")(const rd_message* m, void** hdrs) noexcept nogil
    ctypedef int (*header_get_all_t "ferryman_span_header_get_all_t")(
        const void* hdrs, size_t idx, const char** name, const void** value, size_t* size) noexcept nogil
    ctypedef const char* (*err2str_t "ferryman_span_err2str_t")(int err) noexcept nogil
    ctypedef int (*type_t "ferryman_span_type_t")(const void* rk) noexcept nogil

cdef enum:
    _RD_KAFKA_CONSUMER = 1  # RD_KAFKA_CONSUMER of rd_kafka_type_t
    _PARTITION_EOF = -191  # RD_KAFKA_RESP_ERR__PARTITION_EOF
    _MAX_BATCH = 1 << 20  # most messages one read() takes (the caller asks for ~10 k)

cdef queue_new_t _queue_new = NULL
cdef queue_get_partition_t _queue_get_partition = NULL
cdef queue_forward_t _queue_forward = NULL
cdef queue_destroy_t _queue_destroy = NULL
cdef consume_batch_queue_t _consume_batch_queue = NULL
cdef message_destroy_t _message_destroy = NULL
cdef message_timestamp_t _message_timestamp = NULL
cdef message_headers_t _message_headers = NULL
cdef header_get_all_t _header_get_all = NULL
cdef err2str_t _err2str = NULL
cdef type_t _type = NULL


def bind():
    """Resolve librdkafka's functions from the copy confluent-kafka runs.

    Returns:
        None when bound, else why not (the span reader then reads through ``consume()``).
    """
    global _queue_new, _queue_get_partition, _queue_forward, _queue_destroy, _consume_batch_queue
    global _message_destroy, _message_timestamp, _message_headers, _header_get_all, _err2str, _type
    if _consume_batch_queue != NULL:
        return None
    if Consumer.__basicsize__ < sizeof(Handle):
        return "confluent-kafka's Consumer is smaller than its documented head"
    found = resolve((b"rd_kafka_queue_new", b"rd_kafka_queue_get_partition", b"rd_kafka_queue_forward",
                     b"rd_kafka_queue_destroy", b"rd_kafka_consume_batch_queue", b"rd_kafka_message_destroy",
                     b"rd_kafka_message_timestamp", b"rd_kafka_message_headers", b"rd_kafka_header_get_all",
                     b"rd_kafka_err2str", b"rd_kafka_type"))
    if isinstance(found, str):
        return found
    _queue_new = <queue_new_t><uintptr_t>found[0]
    _queue_get_partition = <queue_get_partition_t><uintptr_t>found[1]
    _queue_forward = <queue_forward_t><uintptr_t>found[2]
    _queue_destroy = <queue_destroy_t><uintptr_t>found[3]
    _message_destroy = <message_destroy_t><uintptr_t>found[5]
    _message_timestamp = <message_timestamp_t><uintptr_t>found[6]
    _message_headers = <message_headers_t><uintptr_t>found[7]
    _header_get_all = <header_get_all_t><uintptr_t>found[8]
    _err2str = <err2str_t><uintptr_t>found[9]
    _type = <type_t><uintptr_t>found[10]
    _consume_batch_queue = <consume_batch_queue_t><uintptr_t>found[4]
    return None


cdef class _Grow:
    """A growable byte buffer (a bytearray with a fill mark), handed to Arrow as it is."""

    cdef bytearray data
    cdef Py_ssize_t used

    def __cinit__(self, Py_ssize_t capacity):
        self.data = bytearray(max(capacity, 64))
        self.used = 0

    cdef inline char* reserve(self, Py_ssize_t extra) except NULL:
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self.data)
        if self.used + extra > size:
            PyByteArray_Resize(self.data, max(2 * size, self.used + extra))
        return PyByteArray_AS_STRING(self.data) + self.used

    cdef inline int put(self, const char* p, Py_ssize_t n) except -1:
        cdef char* at = self.reserve(n)
        if n:
            memcpy(at, p, n)
        self.used += n
        return 0

    cdef bytearray done(self):
        PyByteArray_Resize(self.data, self.used)
        return self.data


cdef inline void _set_bit(char* bitmap, Py_ssize_t i) noexcept nogil:
    bitmap[i >> 3] = bitmap[i >> 3] | <char>(1 << (i & 7))


cdef class _Binary:
    """One binary column being filled: validity bitmap, int32 offsets, data."""

    cdef _Grow validity
    cdef _Grow offsets
    cdef _Grow data
    cdef Py_ssize_t n
    cdef Py_ssize_t nulls

    def __cinit__(self, Py_ssize_t capacity, Py_ssize_t data_capacity):
        self.validity = _Grow((capacity + 7) // 8 + 8)
        self.offsets = _Grow((capacity + 1) * 4)
        self.data = _Grow(data_capacity)
        self.n = 0
        self.nulls = 0
        cdef int32_t zero = 0
        self.offsets.put(<const char*>&zero, 4)

    cdef int append(self, const char* p, Py_ssize_t length, bint valid) except -1:
        cdef char* bits
        cdef int32_t end
        if self.n % 8 == 0:
            bits = self.validity.reserve(1)
            bits[0] = 0
            self.validity.used += 1
        bits = PyByteArray_AS_STRING(self.validity.data)
        if valid:
            _set_bit(bits, self.n)
            self.data.put(p, length)
        else:
            self.nulls += 1
        if self.data.used >= 2**31:
            raise OverflowError("more than 2 GiB in one column of one batch")
        end = <int32_t>self.data.used
        self.offsets.put(<const char*>&end, 4)
        self.n += 1
        return 0

    def parts(self):
        """(validity or None, offsets, data, null count)."""
        return (self.validity.done() if self.nulls else None), self.offsets.done(), self.data.done(), self.nulls


cdef class _Sized:
    """One binary column of a known row count and size (a batch's keys or values): written in place, no growth.

    The first pass over a batch counts the bytes, so the buffers are allocated
    once and each value is one ``memcpy`` (``_Binary.append`` checks and grows
    at every call: ~10 % of a read's CPU for two columns).
    """

    cdef bytearray validity
    cdef bytearray offsets
    cdef bytearray data
    cdef char* bits
    cdef int32_t* offs
    cdef char* bytes_
    cdef Py_ssize_t used
    cdef Py_ssize_t nulls

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t size):
        if size >= 2**31:
            raise OverflowError("more than 2 GiB in one column of one batch")
        self.validity = bytearray((rows + 7) // 8)  # zeroed: every bit is set or left null below
        self.offsets = PyByteArray_FromStringAndSize(NULL, (rows + 1) * 4)
        self.data = PyByteArray_FromStringAndSize(NULL, size)
        self.bits = PyByteArray_AS_STRING(self.validity)
        self.offs = <int32_t*>PyByteArray_AS_STRING(self.offsets)
        self.bytes_ = PyByteArray_AS_STRING(self.data)
        self.offs[0] = 0
        self.used = 0
        self.nulls = 0

    cdef inline void put(self, Py_ssize_t row, const char* p, Py_ssize_t length) noexcept nogil:
        """Row's value (p NULL: null); rows come in order, and their lengths add up to the size given."""
        if p != NULL:
            _set_bit(self.bits, row)
            if length:
                memcpy(self.bytes_ + self.used, p, length)
            self.used += length
        else:
            self.nulls += 1
        self.offs[row + 1] = <int32_t>self.used

    def parts(self):
        """(validity or None, offsets, data, null count), as ``_Binary.parts``."""
        if PyByteArray_GET_SIZE(self.data) != self.used:  # never, when the sizes given were exact
            PyByteArray_Resize(self.data, self.used)
        return (self.validity if self.nulls else None), self.offsets, self.data, self.nulls


cdef class SpanReader:
    """Reads one partition of one consumer as Arrow column buffers.

    Args:
        consumer: a plain confluent-kafka ``Consumer`` that will ``assign()`` the
            partition after this reader attached it (never ``subscribe()``).
            Close the reader before the consumer: librdkafka's destroy waits for
            the records still queued here.
        topic: the topic.
        partition: the partition.

    Raises:
        ValueError: the module is not bound, or ``consumer`` is not such a consumer.
    """

    cdef object _consumer
    cdef void* _rk
    cdef void* _queue
    cdef bytes _topic
    cdef int32_t _partition
    cdef rd_message** _msgs
    cdef Py_ssize_t _msgs_size

    def __cinit__(self, consumer, str topic, int32_t partition):
        self._queue = NULL
        self._msgs = NULL
        self._msgs_size = 0
        if _consume_batch_queue == NULL:
            raise ValueError("the span reader is not bound to librdkafka (bind() says why)")
        if type(consumer) is not Consumer:
            raise ValueError(f"not a plain confluent_kafka.Consumer: {type(consumer).__name__}")
        cdef void* rk = (<Handle*><PyObject*>consumer).rk
        if rk == NULL or _type(rk) != _RD_KAFKA_CONSUMER:
            raise ValueError("the consumer is closed, or its handle is not a consumer's")
        self._consumer = consumer
        self._rk = rk
        self._topic = topic.encode()
        self._partition = partition
        cdef void* partition_queue = _queue_get_partition(rk, self._topic, partition)
        if partition_queue == NULL:
            raise ValueError(f"no queue for {topic} [{partition}]")
        self._queue = _queue_new(rk)
        _queue_forward(partition_queue, self._queue)
        _queue_destroy(partition_queue)

    def read(self, Py_ssize_t max_records, int timeout_ms, int64_t end):
        """Records fetched now (up to ``max_records``; waits up to ``timeout_ms`` for that many), below ``end``.

        Returns:
            ``(columns, eof, past_end, error)``: ``columns`` is None when no record
            below ``end`` came, else ``(n, key, value, headers, offsets,
            timestamps_us, timestamp_types)``, where key and value are
            ``(validity or None, int32 offsets, data, nulls)``, headers
            ``(list validity or None, int32 list offsets, name offsets, name data,
            value validity or None, value offsets, value data, value nulls,
            records with headers)`` (None when no record has any), and the others
            bytearrays of int64, int64 and int32 (Kafka's timestamp types: -1
            none, 0 create time, 1 log-append time). ``eof``: the offset of the
            last partition-end event (-1: none); ``past_end``: a record at or past
            ``end`` came (the span is complete); ``error``: the first other
            consumer error as ``(code, text)``, or None.
        """
        if self._queue == NULL:
            raise ValueError("the span reader is closed")
        if (<Handle*><PyObject*>self._consumer).rk != self._rk:
            raise ValueError("the consumer was closed before the span reader")
        if max_records <= 0 or max_records > _MAX_BATCH:
            raise ValueError(f"max_records must be in 1..{_MAX_BATCH}")
        if max_records > self._msgs_size:
            free(self._msgs)
            self._msgs = <rd_message**>malloc(max_records * sizeof(rd_message*))
            if self._msgs == NULL:
                self._msgs_size = 0
                raise MemoryError()
            self._msgs_size = max_records
        cdef rd_message** msgs = self._msgs
        cdef void* queue = self._queue
        cdef long got
        cdef Py_ssize_t i
        with nogil:
            got = _consume_batch_queue(queue, timeout_ms, msgs, <size_t>max_records)
        if got < 0:
            got = 0
        try:
            return self._columns(msgs, got, end)
        finally:
            for i in range(got):
                _message_destroy(msgs[i])

    cdef tuple _columns(self, rd_message** msgs, Py_ssize_t got, int64_t end):
        cdef Py_ssize_t i, k, n = 0, h_total = 0, with_headers = 0
        cdef int64_t eof = -1
        cdef bint past_end = False
        cdef int error_code = 0
        cdef const rd_message* m
        # First pass: which messages are records below end, and the value bytes to reserve.
        cdef Py_ssize_t value_bytes = 0, key_bytes = 0
        for i in range(got):
            m = msgs[i]
            if m.err != 0:
                if m.err == _PARTITION_EOF:
                    eof = m.offset
                elif error_code == 0:
                    error_code = m.err
            elif m.offset >= end:
                past_end = True
            elif not past_end:
                n += 1
                value_bytes += m.len if m.payload != NULL else 0
                key_bytes += m.key_len if m.key != NULL else 0
        error = None
        if error_code != 0:
            error = (error_code, _err2str(error_code).decode("utf-8", "replace"))
        if n == 0:
            return None, eof, past_end, error
        # The sizes counted are exact: the same records, the same lengths, nulls counted as 0 both times.
        cdef _Sized keys = _Sized(n, key_bytes)
        cdef _Sized values = _Sized(n, value_bytes)
        offsets = _Grow(n * 8)
        stamps = _Grow(n * 8)
        types = _Grow(n * 4)
        cdef int64_t* off_p = <int64_t*>offsets.reserve(n * 8)
        cdef int64_t* ts_p = <int64_t*>stamps.reserve(n * 8)
        cdef int32_t* type_p = <int32_t*>types.reserve(n * 4)
        offsets.used, stamps.used, types.used = n * 8, n * 8, n * 4
        # Headers: list validity and offsets per record, then each header's name and value.
        hvalid = _Grow((n + 7) // 8 + 8)
        hoffs = _Grow((n + 1) * 4)
        hnames = _Binary(64, 256)
        hvalues = _Binary(64, 256)
        cdef char* hbits = hvalid.reserve((n + 7) // 8)
        memset(hbits, 0, (n + 7) // 8)
        hvalid.used = (n + 7) // 8
        cdef int32_t* hoff_p = <int32_t*>hoffs.reserve((n + 1) * 4)
        hoffs.used = (n + 1) * 4
        hoff_p[0] = 0
        cdef int tstype = 0
        cdef void* hdrs
        cdef const char* name
        cdef const void* hvalue
        cdef size_t hsize
        cdef Py_ssize_t j = 0
        for i in range(got):
            m = msgs[i]
            if m.err != 0:
                continue
            if m.offset >= end:
                break
            keys.put(j, m.key, m.key_len if m.key != NULL else 0)
            values.put(j, m.payload, m.len if m.payload != NULL else 0)
            off_p[j] = m.offset
            ts_p[j] = _message_timestamp(m, &tstype) * 1000
            type_p[j] = tstype - 1  # librdkafka's 0/1/2 as Kafka's -1/0/1
            hdrs = NULL
            if _message_headers(m, &hdrs) == 0 and hdrs != NULL:
                _set_bit(hbits, j)
                with_headers += 1
                k = 0
                while _header_get_all(hdrs, k, &name, &hvalue, &hsize) == 0:
                    hnames.append(name, strlen(name), True)
                    hvalues.append(<const char*>hvalue, hsize, hvalue != NULL)
                    k += 1
                h_total += k
                if h_total >= 2**31:
                    raise OverflowError("more than 2**31 headers in one batch")
            hoff_p[j + 1] = <int32_t>h_total
            j += 1
        header_parts = None
        if with_headers:
            key_validity, name_offsets, name_data, _ = hnames.parts()
            value_validity, value_offsets, value_data, value_nulls = hvalues.parts()
            header_parts = (
                hvalid.done() if with_headers < n else None, hoffs.done(), name_offsets, name_data,
                value_validity, value_offsets, value_data, value_nulls, with_headers,
            )
        columns = (n, keys.parts(), values.parts(), header_parts, offsets.done(), stamps.done(), types.done())
        return columns, eof, past_end, error

    def close(self):
        """Stop forwarding the partition here and free this reader's queue (before closing the consumer)."""
        if self._queue == NULL:
            return
        cdef void* partition_queue
        if (<Handle*><PyObject*>self._consumer).rk == self._rk:
            partition_queue = _queue_get_partition(self._rk, self._topic, self._partition)
            if partition_queue != NULL:
                _queue_forward(partition_queue, NULL)
                _queue_destroy(partition_queue)
            _queue_destroy(self._queue)
        self._queue = NULL

    def __dealloc__(self):
        free(self._msgs)
        if self._queue != NULL and (<Handle*><PyObject*>self._consumer).rk == self._rk:
            _queue_destroy(self._queue)
