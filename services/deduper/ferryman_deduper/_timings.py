"""Recent durations of a repeated step, for status reports (thread-safe)."""

from __future__ import annotations

import statistics
import threading
from collections import deque

#: How many recent durations a RecentDurations keeps.
DEFAULT_WINDOW = 256


class RecentDurations:
    """The last ``window`` durations of a step and their running total: recorded by one thread, read by others."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self._values: deque[float] = deque(maxlen=window)
        self._total_s = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """Record one duration, in seconds."""
        with self._lock:
            self._values.append(seconds)
            self._total_s += seconds

    def total_s(self) -> float:
        """Sum of every duration recorded since start (not only the window), in seconds."""
        with self._lock:
            return self._total_s

    def median_ms(self) -> float:
        """Median of the recent durations, in milliseconds; 0 before the first."""
        with self._lock:
            values = list(self._values)
        return statistics.median(values) * 1000 if values else 0.0

    def max_ms(self) -> float:
        """Longest of the recent durations, in milliseconds; 0 before the first."""
        with self._lock:
            return max(self._values, default=0.0) * 1000
