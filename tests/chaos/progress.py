"""Destination progress over time: the committed end (last stable offset) of every destination partition.

``Progress`` samples them every 0.25 s on a thread of its own; the runner asks it when every loaded
partition has moved on since a moment (recovery) and for the destination's rate per second (dips).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

_log = logging.getLogger(__name__)
# Short enough to time a recovery to ~0.3 s; each sample is one ListOffsets round per partition.
_SAMPLE_S = 0.25
_WATERMARK_TIMEOUT_S = 2.0
# Destination ends move in bursts (a deduper transaction every 200 ms per partition, and seconds apart
# when the machine is loaded: most 1 s steps read 0 then, a median of 0/s): rates over 5 s steps.
_RATE_STEP_S = 5.0
# Consecutive samples with unanswered partitions before the client is replaced: a broker away for a
# moment is not a reason, a client stuck on stale metadata is (a new one needs a sample to warm up).
_FRESH_AFTER = 8


@dataclass(frozen=True)
class Sample:
    """Committed ends at one moment (monotonic time); a partition that did not answer is absent."""

    at: float
    ends: dict[tuple[str, int], int]


class Progress(threading.Thread):
    """Samples the committed ends of the tracked destination partitions until ``stop``."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True, name="chaos-progress")
        self._servers = bootstrap
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._failed = 0
        self._tracked: dict[str, int] = {}
        self._paused: set[str] = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.samples: list[Sample] = []

    def track(self, topic: str, partitions: int) -> None:
        """Sample partitions 0..partitions-1 of topic (again, with more partitions)."""
        with self._lock:
            self._tracked[topic] = partitions

    def quiet(self, topic: str, quiet: bool) -> None:
        """Leave a topic out of recovery checks while nothing is produced to it."""
        with self._lock:
            (self._paused.add if quiet else self._paused.discard)(topic)

    def run(self) -> None:
        while not self._done.is_set():
            with self._lock:
                tracked = dict(self._tracked)
            ends: dict[tuple[str, int], int] = {}
            # One ListOffsets request per leader for every partition; a partition whose leader is away
            # (or that is not there yet) is left out of this sample.
            latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # confluent-kafka's stub lacks it
            futures = self._admin.list_offsets(
                {TopicPartition(t, p): latest for t, n in tracked.items() for p in range(n)},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=_WATERMARK_TIMEOUT_S,
            )
            errors: set[str] = set()
            for tp, future in futures.items():
                # A bounded wait: the future of a topic not there yet may never resolve.
                try:
                    ends[(tp.topic, tp.partition)] = future.result(timeout=_WATERMARK_TIMEOUT_S).offset
                except (KafkaException, concurrent.futures.TimeoutError) as exc:
                    errors.add(repr(exc)[:200])
            self._failed = self._failed + 1 if errors else 0
            if self._failed and self._failed % _FRESH_AFTER == 0:
                # A client that asked before a topic existed keeps failing for it (seen here): start afresh.
                _log.info("progress: %d partitions unanswered (%s)", len(futures) - len(ends), sorted(errors)[:3])
                self._admin = AdminClient({"bootstrap.servers": self._servers})
            self.samples.append(Sample(time.monotonic(), ends))
            self._done.wait(_SAMPLE_S)

    def stop(self) -> None:
        """Stop sampling."""
        self._done.set()
        self.join(30)

    def latest(self) -> Sample:
        """The latest sample (an empty one before the first)."""
        return self.samples[-1] if self.samples else Sample(time.monotonic(), {})

    def lagging(self, mark: Sample) -> list[str]:
        """The loaded partitions that have not moved on since mark, with their ends then and now."""
        now = self.latest()
        with self._lock:
            wanted = [(t, p) for t, n in self._tracked.items() if t not in self._paused for p in range(n)]
        return [
            f"{t}/{p} {mark.ends.get((t, p))}->{now.ends.get((t, p))}"
            for t, p in wanted
            if now.ends.get((t, p), -1) <= mark.ends.get((t, p), 0)
        ]

    def moved_on_since(self, mark: Sample) -> bool:
        """True when every tracked, loaded partition's committed end (sampled after mark) is above its value at mark."""
        now = self.latest()
        if now.at <= mark.at:
            return False
        with self._lock:
            wanted = [(t, p) for t, n in self._tracked.items() if t not in self._paused for p in range(n)]
        # A partition absent from mark (new, or its leader away then) must hold something now.
        return all(now.ends.get(tp, -1) > mark.ends.get(tp, 0) for tp in wanted)

    def wait_moved_on(
        self, mark: Sample, timeout_s: float, give_up: Callable[[], bool] = lambda: False
    ) -> float | None:
        """Seconds from mark until every loaded partition moved on; None if that took over timeout_s.

        give_up: ends the wait at once (None) when it returns True: no progress can come (the load died).
        """
        deadline = mark.at + timeout_s
        while time.monotonic() < deadline and not give_up():
            if self.moved_on_since(mark):
                return self.latest().at - mark.at
            time.sleep(_SAMPLE_S / 2)  # waiting on the sampler thread's next sample
        return None

    def rates(self, origin: float) -> list[tuple[float, float, float]]:
        """Destination records per second, in steps of about _RATE_STEP_S: (from, to, rate), in seconds since origin.

        Args:
            origin: the monotonic time the returned times count from (the run's start, as the faults' times do).

        A sample where some partition went unanswered (its leader away) would read as a drop to 0 for it:
        such samples are skipped, so a step spans the gap and its rate is the gap's average.
        """
        if len(self.samples) < 2:
            return []
        out: list[tuple[float, float, float]] = []
        full = max(len(s.ends) for s in self.samples)
        complete = [s for s in self.samples if len(s.ends) >= full or (s.ends and len(s.ends) >= full - 2)]
        if len(complete) < 2:
            return []
        prev = complete[0]
        for s in complete[1:]:
            if s.at - prev.at >= _RATE_STEP_S:
                common = set(s.ends) & set(prev.ends)
                moved = sum(max(0, s.ends[k] - prev.ends[k]) for k in common)
                out.append((round(prev.at - origin, 2), round(s.at - origin, 2), moved / (s.at - prev.at)))
                prev = s
        return out
