"""End-to-end latency of committed records: a histogram the deduper adds to once per commit.

A record's latency is the commit time of the destination transaction that
wrote it (wall clock of the deduper's host, taken when the commit returned)
minus the record's own source timestamp, which the copy keeps. What that
timestamp is depends on the source topic's ``message.timestamp.type``:

* ``LogAppendTime``: when the source broker appended the record, so the figure
  is source append -> destination commit;
* ``CreateTime`` (Kafka's default): what the producer put in the record,
  usually when it was produced, so the figure also holds the producer's
  batching and send time; a producer that sets old timestamps (a replay of
  history) shows as latency.

Both clocks are wall clocks of different hosts: their skew is in the figure
(a record that looks younger than 0 counts as 0). Every committed record is
counted once; a record of an aborted transaction is counted when its rewrite
commits. Duplicates dropped and quarantined envelopes are not counted.

The count runs in C where built (``_latencycount.pyx``); the pure-Python count
is the fallback and the reference.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Bucket upper bounds in seconds: from a caught-up flow's pipeline (transaction
#: interval 100 ms plus fetch waits and the commit: ~0.1-0.5 s) to catching up
#: after an outage (minutes to an hour).
DEFAULT_BOUNDS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

Runs = list[tuple[Sequence[int], int]]
"""(timestamps_ms, start) pairs: the records ``timestamps_ms[start:]``."""
CountLatencies = Callable[[Runs, int, tuple[int, ...], list[int]], int]

compiled_count: CountLatencies | None
"""The compiled count, or None when it is not built."""
try:
    from ferryman.metrics import _latencycount

    compiled_count = _latencycount.count_latencies
except ImportError:  # not built: the pure-Python count below
    compiled_count = None


def count_latencies_py(runs: Runs, now_ms: int, bounds_ms: tuple[int, ...], counts: list[int]) -> int:
    """The pure-Python count: as ``_latencycount.count_latencies`` (see there)."""
    total = 0
    for stamps, start in runs:
        for ts in itertools.islice(stamps, start, None):
            lat = max(0, now_ms - ts)
            counts[bisect.bisect_left(bounds_ms, lat)] += 1
            total += lat
    return total


#: The count in use: compiled when built.
count_latencies: CountLatencies = compiled_count or count_latencies_py
#: Which count is in use, for the deduper's start-up log line (the pure-Python one costs ~20x more per record).
LATENCY_COUNT = "compiled" if compiled_count is not None else "pure-Python (_latencycount not built)"


@dataclass(frozen=True)
class LatencySnapshot:
    """The histogram at one moment, as Prometheus exposes one."""

    bounds_s: tuple[float, ...]
    """Upper bounds of the buckets, seconds (``le``)."""
    cumulative: tuple[int, ...]
    """Records at or below each bound, then all of them (``+Inf``)."""
    sum_s: float
    """Sum of the latencies, seconds."""

    @property
    def count(self) -> int:
        """Records counted."""
        return self.cumulative[-1]


class LatencyHistogram:
    """Per-record end-to-end latency of committed records. ``observe`` on one thread, ``snapshot`` on any."""

    def __init__(self, bounds_s: Sequence[float] = DEFAULT_BOUNDS_S) -> None:
        bounds_ms = tuple(round(b * 1000) for b in bounds_s)
        if not bounds_ms or any(b <= a for a, b in itertools.pairwise(bounds_ms)) or bounds_ms[0] < 0:
            raise ValueError(f"bucket bounds must be increasing whole milliseconds, not {tuple(bounds_s)}")
        self._bounds_s = tuple(float(b) for b in bounds_s)
        self._bounds_ms = bounds_ms
        self._counts = [0] * (len(bounds_ms) + 1)
        self._sum_ms = 0
        self._lock = threading.Lock()

    def observe(self, runs: Runs, now_ms: int) -> None:
        """Count every record of runs as committed at now_ms (milliseconds since the epoch)."""
        if not runs:
            return
        counts = [0] * len(self._counts)
        total = count_latencies(runs, now_ms, self._bounds_ms, counts)
        with self._lock:
            for i, c in enumerate(counts):
                self._counts[i] += c
            self._sum_ms += total

    def snapshot(self) -> LatencySnapshot:
        """The counts so far, cumulative as Prometheus buckets are."""
        with self._lock:
            counts = list(self._counts)
            sum_ms = self._sum_ms
        return LatencySnapshot(self._bounds_s, tuple(itertools.accumulate(counts)), sum_ms / 1000)
