# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The deduper's produce loop, compiled: records go to librdkafka without a produce() call each.

Why it exists: after the envelope codec went compiled, ``Producer.produce()``
was the deduper's largest per-record cost beyond a bare copy loop's. Each call
parses eight arguments, looks the topic up by name, and allocates a per-message
state that the delivery report then frees (confluent-kafka allocates one even
when no callback is wanted). ``produce_rows`` hands the same records to the
same librdkafka instance with ``rd_kafka_produceva()``: a topic handle taken
once per run, bytes copied straight from the column lists, no per-message
state (the delivery report callback returns at once for such a message).
What reaches the broker is what ``produce()`` would have sent: same topic,
partition, key, value, timestamp and headers, null and empty kept apart, the
payload copied (``RD_KAFKA_MSG_F_COPY``), inside the producer's open
transaction.

Where it stops: at the first row it does not take, it returns how many rows it
produced, and the caller produces that row with ``produce()``, which raises
what it always raised (``BufferError`` when the queue is full, a
``KafkaException`` when the producer is in an error state, ``TypeError`` for a
column entry of another type) or succeeds; a row is never enqueued twice,
since librdkafka enqueues nothing when it refuses one. One exception: a header
name UTF-8 cannot encode raises ``UnicodeEncodeError`` here (the rows before it
were produced), since ``produce()`` crashes the process on it.

How it reaches librdkafka: confluent-kafka keeps the ``rd_kafka_t`` pointer as
the first field of its Producer object (``Handle.rk``, unchanged since 0.9),
and loads librdkafka as a shared library without exporting its symbols. So
``resolve()`` finds the library confluent-kafka loaded (``/proc/self/maps``),
opens it again without loading anything (``RTLD_NOLOAD``), resolves the
functions ``bind()`` names, and checks that it is the very library confluent-kafka
runs (``rd_kafka_version()`` against ``confluent_kafka.libversion()``);
``adopts()`` checks a producer's handle (librdkafka calls it a producer, named
after its ``client.id``). When any check fails the caller keeps ``produce()``.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.string cimport strlen

import os

import confluent_kafka
from confluent_kafka import Producer

cdef extern from "<dlfcn.h>":
    void* dlopen(const char* path, int flags)
    void* dlsym(void* handle, const char* name)
    int RTLD_NOW
    int RTLD_NOLOAD

cdef extern from *:
    """
    /* librdkafka's produceva() argument (rd_kafka_vu_t in rdkafka.h, stable
       since 1.4): a value type, then a union padded to 64 bytes. */
    typedef struct {
        int vtype;
        union {
            void *ptr;
            int32_t i32;
            int i;
            int64_t i64;
            struct { void *ptr; size_t size; } mem;
            struct { const char *name; const void *val; ssize_t size; } header;
            char _pad[64];
        } u;
    } ferryman_rd_vu;

    enum {
        FERRYMAN_VTYPE_RKT = 2, FERRYMAN_VTYPE_PARTITION = 3, FERRYMAN_VTYPE_VALUE = 4,
        FERRYMAN_VTYPE_KEY = 5, FERRYMAN_VTYPE_MSGFLAGS = 7, FERRYMAN_VTYPE_TIMESTAMP = 8,
        FERRYMAN_VTYPE_HEADER = 9
    };

    /* The head of confluent-kafka's Handle (src/confluent_kafka/src/confluent_kafka.h). */
    typedef struct { PyObject_HEAD void *rk; } ferryman_Handle;

    typedef void *(*ferryman_produceva_t)(void *rk, const ferryman_rd_vu *vus, size_t cnt);
    typedef void (*ferryman_error_destroy_t)(void *error);
    typedef void *(*ferryman_topic_new_t)(void *rk, const char *topic, void *conf);
    typedef void (*ferryman_topic_destroy_t)(void *rkt);
    typedef const char *(*ferryman_name_t)(const void *rk);
    typedef int (*ferryman_type_t)(const void *rk);
    typedef int (*ferryman_version_t)(void);

    static inline void ferryman_vu_ptr(ferryman_rd_vu *vu, int vtype, void *p) {
        vu->vtype = vtype; vu->u.ptr = p;
    }
    static inline void ferryman_vu_i32(ferryman_rd_vu *vu, int vtype, int32_t v) {
        vu->vtype = vtype; vu->u.i32 = v;
    }
    static inline void ferryman_vu_i(ferryman_rd_vu *vu, int vtype, int v) {
        vu->vtype = vtype; vu->u.i = v;
    }
    static inline void ferryman_vu_i64(ferryman_rd_vu *vu, int vtype, int64_t v) {
        vu->vtype = vtype; vu->u.i64 = v;
    }
    static inline void ferryman_vu_mem(ferryman_rd_vu *vu, int vtype, const char *p, size_t n) {
        vu->vtype = vtype; vu->u.mem.ptr = (void *)p; vu->u.mem.size = n;
    }
    static inline void ferryman_vu_header(ferryman_rd_vu *vu, const char *name, const char *val, ssize_t n) {
        vu->vtype = FERRYMAN_VTYPE_HEADER; vu->u.header.name = name; vu->u.header.val = val;
        vu->u.header.size = n;
    }
    """
    ctypedef struct rd_vu "ferryman_rd_vu":
        pass
    ctypedef struct Handle "ferryman_Handle":
        void* rk
    ctypedef void* (*produceva_t "ferryman_produceva_t")(void* rk, const rd_vu* vus, size_t cnt) noexcept nogil
    ctypedef void (*error_destroy_t "ferryman_error_destroy_t")(void* error) noexcept nogil
    ctypedef void* (*topic_new_t "ferryman_topic_new_t")(void* rk, const char* topic, void* conf) noexcept nogil
    ctypedef void (*topic_destroy_t "ferryman_topic_destroy_t")(void* rkt) noexcept nogil
    ctypedef const char* (*name_t "ferryman_name_t")(const void* rk) noexcept nogil
    ctypedef int (*type_t "ferryman_type_t")(const void* rk) noexcept nogil
    ctypedef int (*version_t "ferryman_version_t")() noexcept nogil
    enum:
        VTYPE_RKT "FERRYMAN_VTYPE_RKT"
        VTYPE_PARTITION "FERRYMAN_VTYPE_PARTITION"
        VTYPE_VALUE "FERRYMAN_VTYPE_VALUE"
        VTYPE_KEY "FERRYMAN_VTYPE_KEY"
        VTYPE_MSGFLAGS "FERRYMAN_VTYPE_MSGFLAGS"
        VTYPE_TIMESTAMP "FERRYMAN_VTYPE_TIMESTAMP"
    void vu_ptr "ferryman_vu_ptr"(rd_vu* vu, int vtype, void* p) noexcept nogil
    void vu_i32 "ferryman_vu_i32"(rd_vu* vu, int vtype, int32_t v) noexcept nogil
    void vu_i "ferryman_vu_i"(rd_vu* vu, int vtype, int v) noexcept nogil
    void vu_i64 "ferryman_vu_i64"(rd_vu* vu, int vtype, int64_t v) noexcept nogil
    void vu_mem "ferryman_vu_mem"(rd_vu* vu, int vtype, const char* p, size_t n) noexcept nogil
    void vu_header "ferryman_vu_header"(rd_vu* vu, const char* name, const char* val, Py_ssize_t n) noexcept nogil

cdef enum:
    _MSG_F_COPY = 0x2  # RD_KAFKA_MSG_F_COPY: librdkafka copies key, value and headers
    _RD_KAFKA_PRODUCER = 0  # RD_KAFKA_PRODUCER of rd_kafka_type_t
    _FIXED_FIELDS = 6  # topic handle, partition, flags, value, key, timestamp
    _MAX_HEADERS = 58  # headers a row may carry on this path; more go through produce()

cdef produceva_t _produceva = NULL
cdef error_destroy_t _error_destroy = NULL
cdef topic_new_t _topic_new = NULL
cdef topic_destroy_t _topic_destroy = NULL
cdef name_t _name = NULL
cdef type_t _type = NULL
# The class as a C-level reference: checked once per run.
cdef object _Producer = Producer


def _loaded_librdkafka():
    """Paths of the librdkafka shared objects mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return set()
    # (not parts[-1]: this module is compiled with wraparound off)
    return {parts[5] for parts in (line.split(None, 5) for line in lines)
            if len(parts) == 6 and os.path.basename(parts[5]).startswith("librdkafka")}


def resolve(names):
    """Addresses of librdkafka's functions ``names`` (bytes) in the copy confluent-kafka runs.

    The one place that finds that library: this module's ``bind()`` and the
    bench's compiled reader (``bench._readcols``) both resolve through it.

    Returns:
        The addresses (ints, in the order of ``names``), or why not (a str).
    """
    paths = _loaded_librdkafka()
    if len(paths) != 1:
        return f"found {len(paths)} librdkafka shared objects mapped, need exactly one"
    path = paths.pop().encode()
    cdef void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD)
    if lib == NULL:
        return f"cannot reopen {path.decode()}"
    cdef void* symbol = dlsym(lib, b"rd_kafka_version")
    if symbol == NULL or (<version_t>symbol)() != confluent_kafka.libversion()[1]:
        return f"{path.decode()} is not the librdkafka confluent-kafka reports"
    addresses = []
    for name in names:
        symbol = dlsym(lib, <const char*>name)
        if symbol == NULL:
            return f"{path.decode()} has no {name.decode()}"
        addresses.append(<uintptr_t>symbol)
    return tuple(addresses)


def bind():
    """Resolve librdkafka's functions from the copy confluent-kafka runs.

    Returns:
        None when bound, else why not (the caller keeps ``produce()``).
    """
    global _produceva, _error_destroy, _topic_new, _topic_destroy, _name, _type
    if _produceva != NULL:
        return None
    if Producer.__basicsize__ < sizeof(Handle):
        return "confluent-kafka's Producer is smaller than its documented head"
    found = resolve((b"rd_kafka_produceva", b"rd_kafka_error_destroy", b"rd_kafka_topic_new",
                     b"rd_kafka_topic_destroy", b"rd_kafka_name", b"rd_kafka_type"))
    if isinstance(found, str):
        return found
    _error_destroy = <error_destroy_t><uintptr_t>found[1]
    _topic_new = <topic_new_t><uintptr_t>found[2]
    _topic_destroy = <topic_destroy_t><uintptr_t>found[3]
    _name = <name_t><uintptr_t>found[4]
    _type = <type_t><uintptr_t>found[5]
    _produceva = <produceva_t><uintptr_t>found[0]
    return None


def adopts(producer, str client_id):
    """Whether ``produce_rows`` may produce through this producer.

    It must be a plain confluent-kafka Producer whose librdkafka handle is a
    producer named after ``client_id`` (what confluent-kafka's ``client.id``
    gives it): a check that the handle read from the object is the right one.
    """
    if _produceva == NULL or type(producer) is not _Producer:
        return False
    cdef void* rk = (<Handle*><PyObject*>producer).rk
    if rk == NULL or _type(rk) != _RD_KAFKA_PRODUCER:
        return False
    name = _name(rk)
    return name != NULL and name[:strlen(name)].decode("utf-8", "replace").startswith(client_id + "#producer-")


cdef inline bint _put_bytes(rd_vu* vu, int vtype, PyObject* item) noexcept:
    """A key or value entry: None is null, bytes are copied; anything else is refused."""
    if item == <PyObject*>None:
        vu_mem(vu, vtype, NULL, 0)
        return True
    if not PyBytes_CheckExact(<object>item):
        return False
    vu_mem(vu, vtype, PyBytes_AS_STRING(<object>item), <size_t>PyBytes_GET_SIZE(<object>item))
    return True


cdef Py_ssize_t _put_headers(rd_vu* vu, object headers) except -2:
    """A row's headers as HEADER entries; -1 when they are of a shape this path leaves to produce()."""
    if headers is None:
        return 0
    if type(headers) is not list or PyList_GET_SIZE(headers) > _MAX_HEADERS:
        return -1
    cdef Py_ssize_t i, n = PyList_GET_SIZE(headers), name_len
    cdef PyObject* pair
    cdef PyObject* value
    cdef const char* name
    for i in range(n):
        pair = PyList_GET_ITEM(headers, i)
        if type(<object>pair) is not tuple or PyTuple_GET_SIZE(<object>pair) != 2:
            return -1
        key = <object>PyTuple_GET_ITEM(<object>pair, 0)
        if type(key) is not str:
            return -1
        # A name UTF-8 cannot encode (a lone surrogate) raises here, not in produce(): confluent-kafka
        # 2.16.1's produce() crashes the process on one. Decoded envelopes never hold such a name.
        name = PyUnicode_AsUTF8AndSize(key, &name_len)
        if <size_t>name_len != strlen(name):
            return -1  # an embedded NUL: librdkafka reads header names as C strings
        value = PyTuple_GET_ITEM(<object>pair, 1)
        if value == <PyObject*>None:
            vu_header(&vu[i], name, NULL, 0)
        elif PyBytes_CheckExact(<object>value):
            vu_header(&vu[i], name, PyBytes_AS_STRING(<object>value), PyBytes_GET_SIZE(<object>value))
        else:
            return -1
    return n


def produce_rows(producer, str topic, int32_t partition, list values, list keys, list timestamps,
                 list headers, Py_ssize_t start, Py_ssize_t n):
    """Produce rows start..start+n-1 of the columns to topic's partition; how many were produced.

    ``headers`` is None or one entry per row (None: no headers, else a list of
    (str, bytes | None)). Fewer than n back means the next row was not
    produced: the caller produces it with ``produce()`` (see the module's
    docstring) and calls again for the rest. Call only with a producer
    ``adopts()`` accepted.
    """
    if (start < 0 or n < 0 or start + n > PyList_GET_SIZE(values) or start + n > PyList_GET_SIZE(keys)
            or start + n > PyList_GET_SIZE(timestamps) or (headers is not None and start + n > PyList_GET_SIZE(headers))):
        raise IndexError("rows out of the columns' range")
    if n == 0 or _produceva == NULL or type(producer) is not _Producer:
        return 0
    cdef void* rk = (<Handle*><PyObject*>producer).rk
    if rk == NULL:
        return 0  # closed: produce() says so
    topic_utf8 = topic.encode()
    cdef void* rkt = _topic_new(rk, topic_utf8, NULL)
    if rkt == NULL:
        return 0
    cdef rd_vu vus[_FIXED_FIELDS + _MAX_HEADERS]
    cdef Py_ssize_t i, h, done = 0
    cdef long long stamp
    cdef int overflow = 0
    cdef void* error
    vu_ptr(&vus[0], VTYPE_RKT, rkt)
    vu_i32(&vus[1], VTYPE_PARTITION, partition)
    vu_i(&vus[2], VTYPE_MSGFLAGS, _MSG_F_COPY)
    try:
        for i in range(start, start + n):
            if not _put_bytes(&vus[3], VTYPE_VALUE, PyList_GET_ITEM(values, i)):
                break
            if not _put_bytes(&vus[4], VTYPE_KEY, PyList_GET_ITEM(keys, i)):
                break
            stamp_item = <object>PyList_GET_ITEM(timestamps, i)
            if type(stamp_item) is not int:
                break
            stamp = PyLong_AsLongLongAndOverflow(stamp_item, &overflow)
            if overflow:
                break
            vu_i64(&vus[5], VTYPE_TIMESTAMP, stamp)
            h = 0 if headers is None else _put_headers(&vus[_FIXED_FIELDS], <object>PyList_GET_ITEM(headers, i))
            if h < 0:
                break
            error = _produceva(rk, vus, _FIXED_FIELDS + h)
            if error != NULL:
                _error_destroy(error)  # produce() meets the same refusal and reports it
                break
            done += 1
    finally:
        _topic_destroy(rkt)
    return done
