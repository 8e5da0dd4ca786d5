"""Lag in seconds from lag in offsets: when was the oldest record not yet replicated appended?

Neither service knows the append time of a record it has not read, but each
knows its source partitions' log-end offsets. Remembering when each log-end
offset was first seen gives a table from offset to time; the time of the
first record not yet replicated is read (interpolated) from it, and the lag
is the time since then. This is how kafka-lag-exporter turns consumer lag
into seconds. The table is fed at scrape time, so its resolution is the
scrape interval plus the age of the log-end offset the service reports (the
wrapper's progress interval, for the deduper); nothing of it runs on the data
path.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Iterable

#: Samples kept per partition: a record's time is known only while the sample
#: before it is kept, so this bounds how far back lag is interpolated (at a
#: 15 s scrape interval, 4 hours); older lag is reported from the oldest sample
#: kept, i.e. as a lower bound. ~100 bytes a sample.
MAX_SAMPLES = 1000


class LagClock:
    """Per partition, when each log-end offset was first seen; lag in seconds from it. Thread-safe."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples}")
        self._max = max_samples
        self._lock = threading.Lock()
        self._samples: dict[Hashable, deque[tuple[float, int]]] = {}

    def observe(self, key: Hashable, log_end: int, now: float) -> None:
        """Record that key's log ended at log_end (the next offset to be written) at time now."""
        with self._lock:
            samples = self._samples.get(key)
            if samples is None or (samples and log_end < samples[-1][1]):
                # First sight, or the log went backwards (topic re-created): start a new table.
                samples = self._samples[key] = deque(maxlen=self._max)
            if not samples or log_end > samples[-1][1]:
                samples.append((now, log_end))  # only the first time an offset is seen counts

    def seconds_behind(self, key: Hashable, next_offset: int, now: float) -> float | None:
        """Seconds since the record at next_offset was appended; 0 when caught up, None when key is unknown.

        Interpolates linearly between the last sample that did not hold the
        record yet and the first that did. When the first sample kept already
        held it, the time since that sample is returned: a lower bound.
        """
        with self._lock:
            samples = self._samples.get(key)
            if not samples:
                return None
            if next_offset >= samples[-1][1]:
                return 0.0
            # Samples before the last one not holding next_offset are not needed again: next_offset
            # only grows (a wrapper's rewind moves it back for a moment; it then reads as a lower bound).
            while len(samples) > 1 and samples[1][1] <= next_offset:
                samples.popleft()
            t0, end0 = samples[0]
            if end0 > next_offset:
                return max(0.0, now - t0)
            t1, end1 = samples[1]
            appended = t0 + (t1 - t0) * (next_offset - end0 + 1) / (end1 - end0)
            return max(0.0, now - appended)

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Forget every partition not in keys (revoked, or no longer reported)."""
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._samples if k not in wanted]:
                del self._samples[key]
