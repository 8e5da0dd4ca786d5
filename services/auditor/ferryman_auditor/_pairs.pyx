# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The alignments' pairings in linear time: dense codes by occurrence, offsets by merging (no sort).

Why it exists: ``_align`` pairs the k-th occurrence of a content among the
expected records with its k-th occurrence among the copies by sorting the
16-byte keys of both sides together (``np.lexsort``), about a third of
``classify``'s CPU. The compiled coder (``_codes``) gives every record a dense
code (the row of the first record with the same content, below the task's
row count), so the occurrences can be counted in arrays indexed by code
instead: one pass over each side, in their order. The pairs are exactly those
of the sorting path (a unit test holds the two equal on random inputs); they
come in left order. The offset-map alignment looks offsets up in the sorted
offsets of each side (``locate``): the map's offsets mostly ascend too, so one
merge pass finds them, where ``np.isin`` and ``np.searchsorted`` took several.
"""

from libc.stdint cimport int64_t

import numpy as np


def match(const int64_t[::1] left, const int64_t[::1] right, int64_t bound):
    """Pairs ``(i, j)``: the k-th occurrence of a code in ``left`` with its k-th occurrence in ``right``.

    Codes must lie in ``[0, bound)``. Returns two int64 arrays, ``i`` ascending.

    Raises:
        ValueError: a code outside ``[0, bound)``.
    """
    cdef Py_ssize_t n_left = left.shape[0], n_right = right.shape[0], x
    cdef int64_t c
    if bound < 0:
        raise ValueError("bound must not be negative")
    for x in range(n_left):
        if left[x] < 0 or left[x] >= bound:
            raise ValueError(f"code {left[x]} outside [0, {bound})")
    for x in range(n_right):
        if right[x] < 0 or right[x] >= bound:
            raise ValueError(f"code {right[x]} outside [0, {bound})")
    if n_left == 0 or n_right == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # Right's positions grouped by code, each group in right's order (a counting sort: starts, then fill).
    starts_array = np.zeros(bound + 1, dtype=np.int64)
    positions_array = np.empty(n_right, dtype=np.int64)
    cdef int64_t[::1] starts = starts_array
    cdef int64_t[::1] positions = positions_array
    cdef int64_t total = 0, count
    with nogil:
        for x in range(n_right):
            starts[right[x] + 1] += 1
        for c in range(bound):
            starts[c + 1] += starts[c]
        # starts[c] is where code c's group begins; filling moves it to the group's end (the next one's begin).
        for x in range(n_right):
            c = right[x]
            positions[starts[c]] = x
            starts[c] += 1
    # Code c's group is [starts[c - 1], starts[c]) now; seen counts left's occurrences of each code so far.
    seen_array = np.zeros(bound, dtype=np.int64)
    cdef int64_t[::1] seen = seen_array
    out_i_array = np.empty(min(n_left, n_right), dtype=np.int64)
    out_j_array = np.empty(min(n_left, n_right), dtype=np.int64)
    cdef int64_t[::1] out_i = out_i_array
    cdef int64_t[::1] out_j = out_j_array
    cdef int64_t begin, end
    with nogil:
        for x in range(n_left):
            c = left[x]
            end = starts[c]
            begin = starts[c - 1] if c > 0 else 0
            count = seen[c]
            if count < end - begin:
                out_i[total] = x
                out_j[total] = positions[begin + count]
                total += 1
            seen[c] = count + 1
    return out_i_array[:total], out_j_array[:total]


def locate(const int64_t[::1] haystack, const int64_t[::1] needles):
    """Each needle's position in ``haystack`` (ascending), the first equal entry's, or -1: none is equal.

    Ascending needles (offsets, mostly) are found in one merge pass; any other
    needle by binary search. The result is ``np.searchsorted``'s where the
    needle is present.
    """
    cdef Py_ssize_t n = haystack.shape[0], m = needles.shape[0], x, k = 0, lo, hi, mid
    cdef int64_t v, previous
    out_array = np.empty(m, dtype=np.int64)
    cdef int64_t[::1] out = out_array
    if m == 0:
        return out_array
    with nogil:
        previous = needles[0]
        for x in range(m):
            v = needles[x]
            if v >= previous:  # merge: move on from the last position
                while k < n and haystack[k] < v:
                    k += 1
                lo = k
            else:  # binary search for the first entry not below v
                lo, hi = 0, n
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if haystack[mid] < v:
                        lo = mid + 1
                    else:
                        hi = mid
                k = lo
            out[x] = lo if lo < n and haystack[lo] == v else -1
            previous = v
    return out_array
