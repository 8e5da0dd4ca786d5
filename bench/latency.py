"""End-to-end latency at a fixed offered load below the maximum.

A producer writes records at a steady rate to a source topic the replicator
already follows; a read_committed consumer of the destination stamps each record
when it becomes visible. Latency is that wall-clock time minus the record's
timestamp, which is the source broker's append time: the latency topics are
created with ``message.timestamp.type=LogAppendTime`` (``SOURCE_TOPIC_CONFIG``),
and every replicator keeps the source timestamp on its copy (the watcher checks
that each copy carries it as CreateTime). So the latency runs from the source
append to the destination's visibility, as the goal names it, and leaves out
the generator's own batching and queueing. For the exactly-once rows it includes
the wait for the transaction commit. Every visible copy is counted (an
at-least-once row's duplicates too).

The generator and the reader share the machine with the replicator and both
clusters, so the phase also records how busy the whole machine was and what the
generator and the reader cost: a latency taken on a saturated machine measures
queueing for CPU, not the replicator. The generator, which stands in for producers
that a deployment runs elsewhere, yields the CPU to the rest (``GENERATOR_NICE``).
``measure`` with the source topic as its own destination (no replicator) gives the
floor of the measurement itself.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaException

from bench.crossing import CrossTraffic
from bench.loader import LoadProducer
from bench.records import padding, split_counts
from bench.verify import LiveWatcher

#: Configs of a source topic the latency phase offers its load to: the broker stamps
#: each record with its append time, where the latency starts.
SOURCE_TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}
#: The generator's linger: librdkafka's default, as a source application would run.
#: Its batching is not in the latency (which starts at the append), and batches of
#: 5 ms instead of 1 ms spare the source broker requests.
_GENERATOR_LINGER_MS = 5
#: Pacing granularity of the offered load: records due are produced once per linger, the
#: spacing at which the producer sends each partition's batches anyway. A 1 ms tick woke
#: the generator five times as often for the same batches on the wire; with nothing
#: replicating (2 interleaved pairs each, 15 s, warm clusters) the machine went from
#: 1.54 / 1.54 to 1.40 / 1.39 cores busy at 315 k rec/s and from 1.28 / 1.25 to 1.15 /
#: 1.18 at 150 k, latency unchanged (p50 1-2 ms, p99 3-62 ms either way).
_PACING_TICK_S = _GENERATOR_LINGER_MS / 1000
#: The generator's CPU priority (a nice value): below what it measures. It stands in for the source's
#: producers, which a deployment runs on machines of their own; here it shares 2 cores with the replicator and
#: both brokers, and at half of Ferryman's bulk rate the machine is saturated (1.9+ cores busy). At the default
#: priority its paced bursts took the CPU the brokers and the replicator needed at that moment, and that
#: queueing counted as the replicator's latency. Lower, it runs in their gaps: it still offered 348.6 k of 350 k
#: rec/s, and the latency starts at the source broker's append time, so its own delays are not in it. The
#: reader, whose delays are in it, keeps the default priority. Measured at 350 k rec/s, Ferryman, 4 interleaved
#: pairs (docs/notes.md, session 18): p99 509 / 541 / 363 / 428 ms against 677 / 667 / 764 / 583 at the
#: default priority, p50 209-229 against 249-276. The lower priority is what does it: in a session of its own at
#: nice 0 it gave 543 / 560 / 852 against 376 / 430 / 527 at nice 10 (3 pairs).
GENERATOR_NICE = 10
#: Budget for the offered records to reach the source broker after the last produce().
_FLUSH_BUDGET_S = 30.0
#: After the offered load ends, records still in flight get at least this long to become visible.
DRAIN_BUDGET_S = 60.0
#: The watcher closes its consumer within this long once told to stop.
_WATCHER_STOP_BUDGET_S = 10.0


@dataclass(frozen=True)
class LatencyResult:
    """What the latency phase measured (milliseconds)."""

    offered_rate: float
    achieved_rate: float
    records: int
    visible: int
    duplicates: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    error: str | None = None
    machine_busy_cores: float = math.nan
    """Cores the whole machine kept busy on average (every process), from the first
    record visible to the last."""
    generator_cores: float = math.nan
    """Cores of the process offering the load (its producer threads included), while offering."""
    generator_priority: str = ""
    """What ``yield_cpu`` did to the generator's priority, e.g. ``"own session, autogroup nice 10, nice 10"``."""
    reader_cores: float = math.nan
    """Cores of the bench's own process from the first record visible to the last: the
    read_committed reader stamping every record, its consumer threads, the bench's samplers."""
    replicator_cpu_s: float = math.nan
    """CPU seconds of the replicator's processes over the whole phase (NaN: nothing replicated)."""
    replicator_cpu_s_by_program: Mapping[str, float] = field(default_factory=dict)
    """``replicator_cpu_s`` split by the program each process tree was launched as."""
    replicator_counters: Mapping[str, float] = field(default_factory=dict)
    """What the replicator reported about itself over the phase (``Row.counters()`` after
    minus before; empty when it reports nothing). Ferryman: its dedupers' ``commits``,
    and their wall time ``commit_s`` and destination flush time ``commit_flush_s``."""
    cross_cluster: CrossTraffic | None = None
    """What crossed between the clusters' regions over the phase, per offered record (small batches:
    more bytes per record than the bulk copy's); None for the floor, or where ``ss`` is missing."""
    started_s: float = math.nan
    """Epoch seconds when the load started (records the replicator took from then on are the phase's)."""
    stages: Mapping[str, object] = field(default_factory=dict)
    """Where the phase's traced records spent their time, stage by stage (``bench.stages``; a traced row
    only, read from its spans file once it has stopped), else empty."""

    @property
    def complete(self) -> bool:
        """Every offered record became visible."""
        return self.visible == self.records

    @property
    def replicator_cpu_s_per_m(self) -> float:
        """What keeping up cost the replicator: CPU seconds per million offered records.

        A steady state by construction (the same load in, the same load out, no start-up),
        which the bulk copy's figures are not: a two-stage replicator runs its stages
        one after the other there, partly outside the first-to-last-visible window.
        """
        return self.replicator_cpu_s / self.records * 1e6 if self.records else math.nan

    @property
    def rig_cores(self) -> float:
        """Cores the generator and the reader took from the replicator's share of the machine."""
        return self.generator_cores + self.reader_cores


@dataclass(frozen=True)
class _Usage:
    """A sample of the machine's busy CPU seconds and the bench process's CPU seconds."""

    at: float
    machine_s: float
    own_s: float

    @classmethod
    def now(cls) -> _Usage:
        return cls(time.monotonic(), _busy_cpu_s(psutil.cpu_times()), time.process_time())


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN when there are no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _busy_cpu_s(times: Any) -> float:
    """Busy CPU seconds of a ``psutil.cpu_times()`` sample: user, nice, system and interrupts.

    Not idle or I/O wait, nor steal (another VM ran); guest time is already in user.
    """
    return float(sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq")))


def yield_cpu(nice: int = GENERATOR_NICE) -> str:
    """Lower this process's CPU priority by ``nice``; returns what was done, for the record.

    With the kernel's autogroup scheduling (``kernel.sched_autogroup_enabled``, on here), CPU is
    shared between sessions first, and a thread's nice value counts only inside its own session:
    so the process starts a session of its own and sets that session's nice value
    (``/proc/self/autogroup``; a new session's starts at 0). Its threads' nice value is raised as
    well, for kernels without autogroup. Threads inherit it, so call this before any starts
    (librdkafka's, here). Raising a nice value needs no privilege; a step that is refused is
    skipped and the result says so.

    A session of its own is also out of reach of the terminal: a ^C during a latency phase stops
    the bench, whose executor then waits for the generator to finish its load (at most the phase's
    length and its flush budget).
    """
    done: list[str] = []
    try:
        os.setsid()
        done.append("own session")
    except OSError as exc:  # a process group leader cannot: its session is shared, so leave it alone
        done.append(f"shared session ({exc.strerror})")
    else:
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(str(nice))
            done.append(f"autogroup nice {nice}")
        except OSError as exc:  # no CONFIG_SCHED_AUTOGROUP
            done.append(f"no autogroup ({exc.strerror})")
    done.append(f"nice {os.nice(nice)}")
    return ", ".join(done)


def offer(
    bootstrap: str, topic: str, partitions: int, records: int, rate: float, value_bytes: int
) -> tuple[float, float, str]:
    """Produce ``records`` to ``topic`` round-robin over partitions at ``rate`` per second.

    Runs in a process of its own, at a lower priority than what it measures (``yield_cpu``).

    Returns:
        The rate achieved (lower than ``rate`` if this process could not keep up), this
        process's CPU seconds (all its threads) while offering, and its priority (``yield_cpu``).

    Raises:
        KafkaException: a record was not delivered.
    """
    priority = yield_cpu()
    load = LoadProducer(
        bootstrap,
        # High offered rates: room for a second of records while the broker catches up.
        {"linger.ms": _GENERATOR_LINGER_MS, "queue.buffering.max.messages": 1_000_000},
        direct=True,  # half the CPU per record: the machine is shared with what is measured
    )
    producer = load.producer
    # Connection and metadata first: the first records must not carry the producer's start-up.
    producer.list_topics(topic, timeout=_FLUSH_BUDGET_S)
    pad = padding(value_bytes)
    sent = [0] * partitions  # next sequence number of each partition
    total = 0
    cpu_start = time.process_time()
    start = time.monotonic()
    while total < records:
        # Round-robin: of the first `due` records, partition p holds ceil((due - p) / partitions)
        # (split_counts(due, partitions)[p]; with due == records, all of that partition's records).
        due = min(records, int((time.monotonic() - start) * rate) + 1)
        for p in range(partitions):
            upto = (due - p + partitions - 1) // partitions
            if upto > sent[p]:
                # A full queue (the broker is behind) stops the run early; the rest goes out on a
                # later tick, and the achieved rate (returned) shows the load offered was lower.
                queued = load.produce_run(topic, p, range(sent[p], upto), pad)
                sent[p] += queued
                total += queued
        producer.poll(_PACING_TICK_S)  # pacing of the offered load, not synchronisation
    elapsed = time.monotonic() - start
    load.finish(_FLUSH_BUDGET_S)
    return (records / elapsed if elapsed > 0 else math.inf), time.process_time() - cpu_start, priority


def measure(
    source: str,
    destination: str,
    source_topic: str,
    destination_topic: str,
    *,
    partitions: int,
    rate: float,
    seconds: float,
    value_bytes: int,
    drain_budget_s: float = DRAIN_BUDGET_S,
) -> LatencyResult:
    """Offer ``rate`` records/s for ``seconds`` and measure their end-to-end latency.

    ``drain_budget_s``: how long records still in flight after the load ends get to
    become visible before the phase gives up (a replicator slower than the offered
    load works through its backlog then).

    The machine's load is taken from the first record visible until the reader stops
    (right after the last is visible), so neither the generator's start-up nor the
    replicator's idle time before the load counts.

    The replicator must already follow ``source_topic`` (which must be empty and
    created with ``SOURCE_TOPIC_CONFIG``) and be caught up, so that only the offered
    records are in flight. With ``destination`` and ``destination_topic`` naming the
    source itself, nothing replicates: the latency measured is that of the source
    broker and the reader, with the generator beside them on the machine.
    """
    started_s = time.time()
    records = max(1, int(rate * seconds))
    counts = split_counts(records, partitions)
    deadline = time.monotonic() + seconds + _FLUSH_BUDGET_S + drain_budget_s
    first: list[_Usage] = []
    floor = (destination, destination_topic) == (source, source_topic)
    watcher = LiveWatcher(
        destination,
        [destination_topic],
        counts,
        deadline,
        # The source's append time: as stamped there (the floor), or kept by the replicator as the copy's CreateTime.
        latency=TIMESTAMP_LOG_APPEND_TIME if floor else TIMESTAMP_CREATE_TIME,
        on_first=lambda: first.append(_Usage.now()),
    )
    error: str | None = None
    achieved = generator_cpu_s = math.nan
    priority = ""
    try:
        # The load comes from its own process, so the watcher never waits for the GIL.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            offered = pool.submit(offer, source, source_topic, partitions, records, rate, value_bytes)
            achieved, generator_cpu_s, priority = offered.result()
        watcher.done.wait(max(0.0, deadline - time.monotonic()))
    except KafkaException as exc:
        error = f"offered load: {exc}"
    finally:
        watcher.stop(_WATCHER_STOP_BUDGET_S)
    last = _Usage.now()
    window = last.at - first[0].at if first else 0.0
    lat = watcher.latencies_ms
    return LatencyResult(
        offered_rate=rate,
        achieved_rate=achieved,
        records=records,
        visible=watcher.tally.unique,
        duplicates=watcher.tally.duplicates,
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        max_ms=max(lat) if lat else math.nan,
        error=error or watcher.error,
        machine_busy_cores=(last.machine_s - first[0].machine_s) / window if window > 0 else math.nan,
        generator_cores=generator_cpu_s * achieved / records,
        generator_priority=priority,
        reader_cores=(last.own_s - first[0].own_s) / window if window > 0 else math.nan,
        started_s=started_s,
    )
