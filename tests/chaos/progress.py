"""Destination progress over time: the committed end (last stable offset) of every destination partition.

``Progress`` samples them, and each partition's high watermark, every 0.25 s on a thread of its own; the
runner asks it when every loaded partition has moved on since a moment (recovery), for the destination's
rate per second (dips), and which partitions an open transaction held during a fault (``held``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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
# A partition counts as held when its committed end stays put this long while records sit above it.
HELD_S = 5.0


@dataclass(frozen=True)
class Sample:
    """Committed ends at one moment (monotonic time); a partition that did not answer is absent."""

    at: float
    ends: dict[tuple[str, int], int]
    highs: dict[tuple[str, int], int] = field(default_factory=dict)
    """High watermarks (read_uncommitted ends): above the committed end, an open transaction's records."""


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
            partitions = [TopicPartition(t, p) for t, n in tracked.items() for p in range(n)]
            errors: set[str] = set()
            ends = self._ends(partitions, IsolationLevel.READ_COMMITTED, errors)
            highs = self._ends(partitions, IsolationLevel.READ_UNCOMMITTED, errors)
            self._failed = self._failed + 1 if errors else 0
            if self._failed and self._failed % _FRESH_AFTER == 0:
                # A client that asked before a topic existed keeps failing for it (seen here): start afresh.
                _log.info("progress: %d partitions unanswered (%s)", len(partitions) - len(ends), sorted(errors)[:3])
                self._admin = AdminClient({"bootstrap.servers": self._servers})
            self.samples.append(Sample(time.monotonic(), ends, highs))
            self._done.wait(_SAMPLE_S)

    def _ends(
        self, partitions: list[TopicPartition], isolation: IsolationLevel, errors: set[str]
    ) -> dict[tuple[str, int], int]:
        """Each partition's end (last stable offset, or high watermark read_uncommitted); errors noted."""
        # One ListOffsets request per leader for every partition; a partition whose leader is away
        # (or that is not there yet) is left out of this sample.
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # confluent-kafka's stub lacks it
        futures = self._admin.list_offsets(
            dict.fromkeys(partitions, latest), isolation_level=isolation, request_timeout=_WATERMARK_TIMEOUT_S
        )
        ends: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            # A bounded wait: the future of a topic not there yet may never resolve.
            try:
                offset = future.result(timeout=_WATERMARK_TIMEOUT_S).offset
            except (KafkaException, concurrent.futures.TimeoutError) as exc:
                errors.add(repr(exc)[:200])
                continue
            if offset < 0:
                # OFFSET_INVALID, not an error, while the leader is away: read as an end, it made the rate
                # jump by a partition's whole length when the leader came back (steps of 25-343 k/s in the
                # long run), and a recovery count a partition as moved on from a mark it was not in.
                errors.add(f"{tp.topic} [{tp.partition}]: offset {offset}")
                continue
            ends[(tp.topic, tp.partition)] = offset
        return ends

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

    def held(self, begin: float, end: float, most: int = 4) -> list[str]:
        """Partitions an open transaction held between begin and end (monotonic): the longest first.

        Held: the committed end did not move for at least HELD_S while the high watermark stood above it,
        records written but not yet committed or aborted. Each reads ``topic/partition 12.3 s (+456)``: the
        longest such stretch and the most offsets above the committed end during it.
        """
        return [f"{t}/{p} {s:.1f} s (+{gap})" for s, gap, (t, p) in held_stretches(self.samples, begin, end)[:most]]

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


def held_stretches(samples: list[Sample], begin: float, end: float) -> list[tuple[float, int, tuple[str, int]]]:
    """(seconds, most offsets above the committed end, partition) of each held partition, longest first.

    A stretch starts at the first sample where a partition's high watermark stands above its committed
    end and lasts while the committed end does not move (samples where it did not answer are skipped).
    """
    longest: dict[tuple[str, int], tuple[float, int]] = {}
    open_at: dict[tuple[str, int], tuple[float, int, int]] = {}  # since, committed end, most above it
    window = [s for s in samples if begin <= s.at <= end]
    for sample in window:
        for key, committed in sample.ends.items():
            high = sample.highs.get(key)
            started = open_at.get(key)
            if started is not None and committed != started[1]:
                del open_at[key]
                started = None
            if high is None:
                continue
            if high <= committed:  # nothing above the committed end: not held
                open_at.pop(key, None)
                continue
            if started is None:
                open_at[key] = (sample.at, committed, high - committed)
                continue
            since, _, gap = started
            gap = max(gap, high - committed)
            open_at[key] = (since, committed, gap)
            took = sample.at - since
            if took >= HELD_S and took > longest.get(key, (0.0, 0))[0]:
                longest[key] = (took, gap)
    return sorted(((s, g, k) for k, (s, g) in longest.items()), reverse=True)
