"""Measurements: CPU and peak RSS of process trees, and a watcher of the destination topic."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

#: RSS is sampled this often; peaks shorter than this can be missed.
_RSS_SAMPLE_S = 0.25


class ProcessSampler:
    """Sums CPU seconds and samples the peak RSS of some processes and their children."""

    def __init__(self, pids: list[int]) -> None:
        self._procs = [psutil.Process(p) for p in pids]
        self._cpu: dict[int, float] = {}
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[psutil.Process]:
        out: list[psutil.Process] = []
        for p in self._procs:
            try:
                out.append(p)
                out.extend(p.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return out

    def _sample(self) -> None:
        rss = 0
        for p in self._tree():
            try:
                t = p.cpu_times()
                self._cpu[p.pid] = t.user + t.system
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def _run(self) -> None:
        while not self._stop.wait(_RSS_SAMPLE_S):
            self._sample()

    def stop(self) -> float:
        """Stop sampling (call before the processes exit); return CPU seconds used."""
        self._sample()
        self._stop.set()
        self._thread.join()
        return sum(self._cpu.values())


@dataclass
class Watch:
    """What a watcher saw on the destination."""

    first_visible: float | None = None
    last_visible: float | None = None
    records: int = 0
    duplicates: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class DestinationWatcher:
    """Reads a destination topic with read_committed and counts, dedups and times records.

    Values look like ``b"<seq>:<padding>"`` with a per-partition sequence number.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, expected: int, *, latency: bool = False) -> None:
        self._bootstrap, self._topic, self._partitions = bootstrap, topic, partitions
        self.expected = expected
        self._latency = latency
        self.watch = Watch()
        self._seen: list[set[int]] = [set() for _ in range(partitions)]
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        c = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "bench-watcher",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        try:
            while not self._stop.is_set():
                md = c.list_topics(self._topic, timeout=5).topics.get(self._topic)
                if md is not None and md.error is None and len(md.partitions) >= self._partitions:
                    break
                time.sleep(0.2)  # the replicator has not created the destination topic yet
            c.assign([TopicPartition(self._topic, p, OFFSET_BEGINNING) for p in range(self._partitions)])
            w = self.watch
            while not self._stop.is_set() and w.records < self.expected:
                # A short wait: the receive time stamps latency, so it must not lag the fetch.
                msgs = c.consume(num_messages=10_000, timeout=0.01)
                now = time.time()
                for m in msgs:
                    if m.error() is not None:
                        continue
                    seq = int(m.value().split(b":", 1)[0])  # type: ignore[union-attr]
                    seen = self._seen[m.partition() or 0]
                    if seq in seen:
                        w.duplicates += 1
                        continue
                    seen.add(seq)
                    w.records += 1
                    if self._latency:
                        w.latencies_ms.append(now * 1000 - m.timestamp()[1])
                if msgs:
                    if w.first_visible is None:
                        w.first_visible = now
                    w.last_visible = now
            self._done.set()
        finally:
            c.close()

    def wait(self, timeout_s: float) -> bool:
        """Wait until every expected record was seen; False on timeout."""
        return self._done.wait(timeout_s)

    def stop(self) -> Watch:
        """Stop watching and return what was seen."""
        self._stop.set()
        self._thread.join(10)
        return self.watch


def percentile(values: list[float], q: float) -> float:
    """q-th percentile (0..100) by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))
    return s[k]
