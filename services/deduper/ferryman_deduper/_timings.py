"""Recent durations of a repeated step, for status reports (thread-safe); the steps of a slow operation, named."""

from __future__ import annotations

import logging
import statistics
import threading
import time
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


class SlowSteps:
    """Times the steps of one operation; if the whole was slow, one WARNING names how long each took."""

    def __init__(self, log: logging.Logger, slow_s: float) -> None:
        self._log = log
        self._slow_s = slow_s
        self._start = self._at = time.monotonic()
        self._took: list[tuple[str, float]] = []

    def done(self, step: str) -> None:
        """The step just ended (it began where the previous one ended)."""
        now = time.monotonic()
        self._took.append((step, now - self._at))
        self._at = now

    def report(self, what: str) -> None:
        """Log the steps at WARNING if they took slow_s or more in all."""
        total = self._at - self._start
        if total >= self._slow_s:
            steps = ", ".join(f"{step} {took:.1f} s" for step, took in self._took)
            self._log.warning("%s took %.1f s: %s", what, total, steps)
