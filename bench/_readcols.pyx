# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The bench's reader, compiled: visible records as columns, without a ``Message`` each.

Why it exists: the latency phase's read_committed reader shares the machine's
two cores with the replicator it measures. Through ``Consumer.consume()`` it
cost ~1.4 us per record (a ``Message`` object, a topic ``str``, ``bytes`` key
and value per record, then the header slice and ``int()`` in Python): about a
third of a core at 260 k rec/s, more than either Ferryman service. Every row's
latency then carried queueing for CPU that the reader itself caused.

What it reads: the partitions ``attach()`` names. Their fetch queues are
forwarded to a queue of this reader's own (``rd_kafka_queue_forward``, which
marks the forward as the application's, so librdkafka's fetch start keeps it;
attach before ``assign()``). ``read()`` pops that queue with librdkafka's event
API (``rd_kafka_queue_poll``), which returns fetched messages and errors as
events and never runs a callback: confluent-kafka's callbacks expect the
thread-local state its own ``consume()`` sets up. Nothing else changes: the
consumer, its fetcher, read_committed filtering and prefetch limits are
librdkafka's own, and rebalance and error events of the consumer's queue never
reach this queue (the reader uses ``assign()``, never a group subscription).

For each record it keeps what the bench's tally and latency need: the source
partition and sequence number from the value's 16-digit header (-1 when the
value has none), runs of consecutive records of one partition, and, when asked,
the wall-clock time it became visible minus its timestamp. ``bench.readcols``
gives the same columns from ``Message`` objects when this module is missing or
cannot bind; a test holds the two equal on a real broker.

How it reaches librdkafka: like ``ferryman._rdproduce``, through its
``resolve()`` (the library confluent-kafka loaded, reopened with
``RTLD_NOLOAD`` and checked by its version); the ``rd_kafka_t`` pointer heads
confluent-kafka's ``Handle``.
"""

from cpython.array cimport array, clone, extend_buffer, resize
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport free, realloc

from confluent_kafka import Consumer

from ferryman._rdproduce import resolve

cdef extern from "<time.h>":
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* ts) nogil
    int CLOCK_REALTIME

cdef extern from *:
    """
    /* librdkafka's public message (rd_kafka_message_t in rdkafka.h). */
    typedef struct {
        int err;
        void *rkt;
        int32_t partition;
        const char *payload; /* void * in rdkafka.h: the same pointer, read as bytes */
        size_t len;
        void *key;
        size_t key_len;
        int64_t offset;
        void *_private;
    } ferryman_rd_message;

    /* The head of confluent-kafka's Handle (src/confluent_kafka/src/confluent_kafka.h). */
    typedef struct { PyObject_HEAD void *rk; } ferryman_reader_Handle;

    typedef void *(*ferryman_queue_new_t)(void *rk);
    typedef void *(*ferryman_queue_get_partition_t)(void *rk, const char *topic, int32_t partition);
    typedef void (*ferryman_queue_forward_t)(void *src, void *dst);
    typedef void (*ferryman_queue_destroy_t)(void *rkqu);
    typedef void *(*ferryman_queue_poll_t)(void *rkqu, int timeout_ms);
    typedef int (*ferryman_event_type_t)(const void *rkev);
    typedef const ferryman_rd_message *(*ferryman_event_message_next_t)(void *rkev);
    typedef void (*ferryman_event_destroy_t)(void *rkev);
    typedef int64_t (*ferryman_message_timestamp_t)(const ferryman_rd_message *m, int *tstype);
    typedef int (*ferryman_reader_type_t)(const void *rk);
    """
    ctypedef struct rd_message "ferryman_rd_message":
        int err
        int32_t partition
        const char* payload
        size_t len
    ctypedef struct Handle "ferryman_reader_Handle":
        void* rk
    ctypedef void* (*queue_new_t "ferryman_queue_new_t")(void* rk) noexcept nogil
    ctypedef void* (*queue_get_partition_t "ferryman_queue_get_partition_t")(
        void* rk, const char* topic, int32_t partition) noexcept nogil
    ctypedef void (*queue_forward_t "ferryman_queue_forward_t")(void* src, void* dst) noexcept nogil
    ctypedef void (*queue_destroy_t "ferryman_queue_destroy_t")(void* rkqu) noexcept nogil
    ctypedef void* (*queue_poll_t "ferryman_queue_poll_t")(void* rkqu, int timeout_ms) noexcept nogil
    ctypedef int (*event_type_t "ferryman_event_type_t")(const void* rkev) noexcept nogil
    ctypedef const rd_message* (*event_message_next_t "ferryman_event_message_next_t")(void* rkev) noexcept nogil
    ctypedef void (*event_destroy_t "ferryman_event_destroy_t")(void* rkev) noexcept nogil
    ctypedef int64_t (*message_timestamp_t "ferryman_message_timestamp_t")(
        const rd_message* m, int* tstype) noexcept nogil
    ctypedef int (*type_t "ferryman_reader_type_t")(const void* rk) noexcept nogil

cdef enum:
    _EVENT_FETCH = 0x2  # RD_KAFKA_EVENT_FETCH
    _RD_KAFKA_CONSUMER = 1  # RD_KAFKA_CONSUMER of rd_kafka_type_t
    _HEADER_BYTES = 16  # bench.records.HEADER_BYTES

cdef queue_new_t _queue_new = NULL
cdef queue_get_partition_t _queue_get_partition = NULL
cdef queue_forward_t _queue_forward = NULL
cdef queue_destroy_t _queue_destroy = NULL
cdef queue_poll_t _queue_poll = NULL
cdef event_type_t _event_type = NULL
cdef event_message_next_t _event_message_next = NULL
cdef event_destroy_t _event_destroy = NULL
cdef message_timestamp_t _message_timestamp = NULL
cdef type_t _type = NULL
cdef array _int64s = array("q")


def bind():
    """Resolve librdkafka's functions from the copy confluent-kafka runs (``ferryman._rdproduce.resolve``).

    Returns:
        None when bound, else why not (the caller reads through ``consume()``).
    """
    global _queue_new, _queue_get_partition, _queue_forward, _queue_destroy, _queue_poll
    global _event_type, _event_message_next, _event_destroy, _message_timestamp, _type
    if _queue_poll != NULL:
        return None
    if Consumer.__basicsize__ < sizeof(Handle):
        return "confluent-kafka's Consumer is smaller than its documented head"
    found = resolve((b"rd_kafka_queue_new", b"rd_kafka_queue_get_partition", b"rd_kafka_queue_forward",
                     b"rd_kafka_queue_destroy", b"rd_kafka_queue_poll", b"rd_kafka_event_type",
                     b"rd_kafka_event_message_next", b"rd_kafka_event_destroy", b"rd_kafka_message_timestamp",
                     b"rd_kafka_type"))
    if isinstance(found, str):
        return found
    _queue_new = <queue_new_t><uintptr_t>found[0]
    _queue_get_partition = <queue_get_partition_t><uintptr_t>found[1]
    _queue_forward = <queue_forward_t><uintptr_t>found[2]
    _queue_destroy = <queue_destroy_t><uintptr_t>found[3]
    _event_type = <event_type_t><uintptr_t>found[5]
    _event_message_next = <event_message_next_t><uintptr_t>found[6]
    _event_destroy = <event_destroy_t><uintptr_t>found[7]
    _message_timestamp = <message_timestamp_t><uintptr_t>found[8]
    _type = <type_t><uintptr_t>found[9]
    _queue_poll = <queue_poll_t><uintptr_t>found[4]
    return None


cdef inline int64_t _header(const rd_message* m) noexcept nogil:
    """The value's 16-digit ``PPPPSSSSSSSSSSSS`` header as a number; -1 when it has none."""
    if m.payload == NULL or m.len < _HEADER_BYTES:
        return -1
    cdef int64_t h = 0
    cdef int i
    cdef char c
    for i in range(_HEADER_BYTES):
        c = m.payload[i]
        if c < 48 or c > 57:  # not '0'..'9'
            return -1
        h = h * 10 + (c - 48)
    return h


cdef class Reader:
    """Reads the records of the attached partitions of one consumer as columns.

    Args:
        consumer: a plain confluent-kafka ``Consumer`` that will ``assign()`` the
            partitions (never ``subscribe()``). The reader keeps it alive. Close
            the reader before the consumer: closing the consumer first blocks in
            librdkafka's destroy, which waits for the references the records
            queued here hold.

    Raises:
        ValueError: the module is not bound, or ``consumer`` is not such a consumer.
    """

    cdef object _consumer
    cdef void* _rk
    cdef void* _queue
    cdef list _attached
    cdef double* _lat  # one read's latencies before they join the caller's array
    cdef Py_ssize_t _lat_size

    def __cinit__(self, consumer):
        self._queue = NULL
        self._lat = NULL
        self._lat_size = 0
        self._attached = []
        if _queue_poll == NULL:
            raise ValueError("bench._readcols is not bound to librdkafka (bind() says why)")
        if type(consumer) is not Consumer:
            raise ValueError(f"not a plain confluent_kafka.Consumer: {type(consumer).__name__}")
        cdef void* rk = (<Handle*><PyObject*>consumer).rk
        if rk == NULL or _type(rk) != _RD_KAFKA_CONSUMER:
            raise ValueError("the consumer is closed, or its handle is not a consumer's")
        self._consumer = consumer
        self._rk = rk
        self._queue = _queue_new(rk)

    cdef bint _open(self) except False:
        if self._queue == NULL:
            raise ValueError("the reader is closed")
        if (<Handle*><PyObject*>self._consumer).rk != self._rk:
            raise ValueError("the consumer was closed before the reader")
        return True

    def attach(self, str topic, int32_t partition):
        """Forward ``topic``'s ``partition`` to this reader (before the consumer assigns it)."""
        self._open()
        name = topic.encode()
        cdef void* partition_queue = _queue_get_partition(self._rk, name, partition)
        if partition_queue == NULL:
            raise ValueError(f"no queue for {topic} [{partition}]")
        _queue_forward(partition_queue, self._queue)
        _queue_destroy(partition_queue)
        self._attached.append((name, partition))

    def read(self, Py_ssize_t max_records, int timeout_ms, int latency_type, array latencies):
        """Up to ``max_records`` records visible now (waiting up to ``timeout_ms`` for the first).

        Args:
            max_records: most records returned.
            timeout_ms: longest wait for the first event.
            latency_type: with 0 or more, append each record's visible time minus its
                timestamp (ms) to ``latencies`` while its timestamp type
                (``confluent_kafka.TIMESTAMP_*``) is this one; -1: no latencies.
            latencies: an ``array('d')`` (or None with ``latency_type`` -1).

        Returns:
            ``(headers, runs, events, other_type)``: the header of each record
            (``array('q')``, -1 for a value without one); ``(partition, start,
            stop, consecutive)`` for each stretch of records of one partition,
            ``consecutive`` when every header there is the one before plus one;
            how many error events were skipped; the first timestamp type other
            than ``latency_type`` (-1: none), after which no latency is appended.
        """
        self._open()
        if latency_type >= 0 and (latencies is None or latencies.typecode != "d"):
            raise ValueError("latencies need an array('d') with a latency type")
        cdef double* grown
        if latency_type >= 0 and max_records > self._lat_size:  # kept for the next read
            grown = <double*>realloc(self._lat, max_records * sizeof(double))
            if grown == NULL:
                raise MemoryError()
            self._lat, self._lat_size = grown, max_records
        headers = clone(_int64s, max(max_records, 0), False)  # written in place, cut to n at the end
        cdef int64_t* heads = <int64_t*>headers.data.as_longlongs
        cdef double* lat = self._lat
        cdef Py_ssize_t n = 0, n_lat = 0, run_start = 0
        cdef int32_t run_partition = -1
        cdef bint consecutive = True
        cdef int events = 0, other_type = -1, tstype = 0
        cdef int64_t ts, h
        cdef double now_ms = 0.0
        cdef timespec clock
        cdef void* event
        cdef const rd_message* m
        cdef void* queue = self._queue
        runs = []
        with nogil:
            event = _queue_poll(queue, timeout_ms) if max_records > 0 else NULL
        if event != NULL:
            clock_gettime(CLOCK_REALTIME, &clock)
            now_ms = clock.tv_sec * 1000.0 + clock.tv_nsec / 1e6
        while event != NULL:
            m = _event_message_next(event) if _event_type(event) == _EVENT_FETCH else NULL
            if m == NULL or m.err != 0:
                events += 1
            else:
                if m.partition != run_partition:
                    if n > run_start:
                        runs.append((run_partition, run_start, n, consecutive))
                    run_partition, run_start, consecutive = m.partition, n, True
                h = _header(m)
                if h < 0 or (n > run_start and h != heads[n - 1] + 1):
                    consecutive = False
                heads[n] = h
                n += 1
                if latency_type >= 0 and other_type < 0:
                    ts = _message_timestamp(m, &tstype)
                    if tstype == latency_type:
                        lat[n_lat] = now_ms - ts
                        n_lat += 1
                    else:
                        other_type = tstype
            _event_destroy(event)
            if n >= max_records:
                break
            event = _queue_poll(queue, 0)
        if n > run_start:
            runs.append((run_partition, run_start, n, consecutive))
        resize(headers, n)
        if n_lat:
            extend_buffer(latencies, <char*>lat, n_lat)
        return headers, runs, events, other_type

    def close(self):
        """Stop forwarding the attached partitions here and free this reader's queue.

        If the consumer's handle is gone (closed first, which blocks unless this
        queue was empty), nothing is touched (the queue's few bytes are not freed).
        """
        if self._queue == NULL:
            return
        cdef void* partition_queue
        if (<Handle*><PyObject*>self._consumer).rk == self._rk:
            for name, partition in self._attached:
                partition_queue = _queue_get_partition(self._rk, <const char*>name, <int32_t>partition)
                if partition_queue != NULL:
                    _queue_forward(partition_queue, NULL)
                    _queue_destroy(partition_queue)
            _queue_destroy(self._queue)
        self._queue = NULL
        self._attached = []

    def __dealloc__(self):
        free(self._lat)
        if self._queue != NULL and (<Handle*><PyObject*>self._consumer).rk == self._rk:
            _queue_destroy(self._queue)
