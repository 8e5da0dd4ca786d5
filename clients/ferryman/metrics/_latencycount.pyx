# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The end-to-end latency histogram's per-record count, compiled (``ferryman.metrics._latency``).

One call per commit sorts every committed record's latency (commit time minus
the record's source timestamp) into the histogram's buckets, in C: ~2-3 ns per
record on warm data, ~7 when the timestamps have left the CPU caches (a commit
counts ~50 k records written over 100 ms), so the histogram costs the deduper's
hot path next to nothing (its write path only appends one (timestamps, start)
pair per envelope).
"""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLong, PyLong_AsLongLongAndOverflow
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

cdef enum:
    MAX_BOUNDS = 64

cdef inline long long _as_int64(object value) except? -1:
    """A timestamp int as a C integer: raises for a non-int or one beyond 64 bits.

    Not PyLong_AsLongLong: for an int of more than one 30-bit digit (a timestamp in
    milliseconds has two) CPython 3.11 takes its byte-array path, ~20 ns a call
    against ~2 here.
    """
    cdef int overflow = 0
    cdef long long out = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        raise OverflowError(f"timestamp {value} does not fit 64 bits")
    return out


def count_latencies(list runs, long long now_ms, tuple bounds_ms, list counts):
    """Add each record's latency (now_ms - its timestamp, at least 0) to counts; return their sum in ms.

    Args:
        runs: (timestamps_ms, start) pairs: the records timestamps_ms[start:] count.
        now_ms: the commit time, milliseconds since the epoch.
        bounds_ms: the buckets' upper bounds (inclusive, increasing), at most 64.
        counts: one count per bound plus one for +Inf (not cumulative), added to in place.
    """
    cdef Py_ssize_t nb = PyTuple_GET_SIZE(bounds_ms)
    cdef Py_ssize_t r, i, j, n, start
    cdef long long bounds[MAX_BOUNDS]
    cdef long long local[MAX_BOUNDS + 1]
    cdef long long lat, total = 0
    if nb > MAX_BOUNDS or PyList_GET_SIZE(counts) != nb + 1:
        raise ValueError(f"{nb} bounds (at most {MAX_BOUNDS}) need {nb + 1} counts, not {len(counts)}")
    for j in range(nb):
        bounds[j] = PyLong_AsLongLong(<object>PyTuple_GET_ITEM(bounds_ms, j))
    for j in range(nb + 1):
        local[j] = 0
    j = 0
    for r in range(PyList_GET_SIZE(runs)):
        pair = <object>PyList_GET_ITEM(runs, r)
        stamps = pair[0]
        start = pair[1]
        if type(stamps) is not list:
            stamps = list(stamps)
        n = PyList_GET_SIZE(stamps)
        for i in range(start, n):
            lat = now_ms - _as_int64(<object>PyList_GET_ITEM(stamps, i))
            if lat < 0:
                lat = 0  # the source's clock ahead of ours
            # Start from the previous record's bucket: neighbours are of about the same age, so this
            # is two comparisons per record rather than a scan from the first bucket.
            while j > 0 and lat <= bounds[j - 1]:
                j -= 1
            while j < nb and lat > bounds[j]:
                j += 1
            local[j] += 1
            total += lat
    for j in range(nb + 1):
        if local[j]:
            counts[j] += local[j]
    return total
