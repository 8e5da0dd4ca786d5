"""Prometheus collectors of the two services: their status snapshots, read at scrape time.

The services count on their hot paths exactly as before (plain integer
fields) and expose a ``status()`` snapshot, the one ``GetDeduperStatus`` and
``GetWrapperStatus`` return. A collector calls it once per scrape and turns it
into metric families: counters as ``*_total``, gauges for state and per
partition lag. So metrics cost the data path nothing, and a figure in
Prometheus is the figure the status RPC shows.

Every family has a ``flow`` label (one service process runs one flow);
per partition families add ``topic`` and ``partition``. Identities (a
wrapper id may be random per process) are only on the ``*_info`` families,
and reasons (free text) on none: join on ``instance`` to see them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ferryman.metrics._lag import LagClock
from ferryman.metrics._latency import LatencyHistogram, LatencySnapshot
from ferryman.v1 import control_pb2

DeduperStatus = Callable[[], control_pb2.GetDeduperStatusResponse]
WrapperStatus = Callable[[], control_pb2.GetWrapperStatusResponse]
Latency = Callable[[], LatencySnapshot]

_PARTITION_LABELS = ("flow", "topic", "partition")


def _version() -> str:
    try:
        return metadata.version("ferryman")
    except metadata.PackageNotFoundError:  # run from a checkout without an install
        return "unknown"


def _counter(name: str, doc: str, flow: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["flow"])
    family.add_metric([flow], value)
    return family


def _gauge(name: str, doc: str, flow: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["flow"])
    family.add_metric([flow], value)
    return family


def _partition_gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=_PARTITION_LABELS)


class _PartitionLag:
    """Per partition lag gauges (records and seconds) from log-end and next-to-replicate offsets."""

    def __init__(self, prefix: str, what: str) -> None:
        self._prefix = prefix
        self._what = what
        self._clock = LagClock()

    def families(self, flow: str, rows: Sequence[tuple[str, int, int, int]], now: float) -> list[Metric]:
        """Lag families of ``(topic, partition, log_end, next_offset)`` rows; log_end < 0: unknown, left out."""
        records = _partition_gauge(
            f"{self._prefix}_lag_records",
            f"Source records not yet {self._what}: the source log-end offset last reported minus the next offset "
            "to replicate (transaction markers count as records).",
        )
        seconds = _partition_gauge(
            f"{self._prefix}_lag_seconds",
            f"Age of the oldest source record not yet {self._what}, from the times its log-end offsets were first "
            "seen at scrapes (resolution: the scrape interval plus the age of the log-end offset).",
        )
        keys = []
        for topic, partition, log_end, next_offset in rows:
            if log_end < 0:
                continue
            key = (topic, partition)
            keys.append(key)
            labels = [flow, topic, str(partition)]
            records.add_metric(labels, max(0, log_end - next_offset))
            self._clock.observe(key, log_end, now)
            behind = self._clock.seconds_behind(key, next_offset, now)
            if behind is not None:
                seconds.add_metric(labels, behind)
        self._clock.retain(keys)
        return [records, seconds]


def _audit_families(flow: str, verdicts: Sequence[control_pb2.AuditVerdict]) -> list[Metric]:
    """The last audit verdict of each owned, audited source partition (none before the first audit)."""
    violated = _partition_gauge(
        "ferryman_deduper_audit_violated",
        "1 when the last audit of the source partition found a fault (VIOLATED), 0 when it found the copy exact "
        "(EXACTLY_ONCE); from the flow's audit topic (ferryman audit).",
    )
    finished = _partition_gauge(
        "ferryman_deduper_audit_finished_timestamp_seconds",
        "When the last audit of the source partition finished, in seconds since the epoch.",
    )
    for v in verdicts:
        labels = [flow, v.topic, str(v.partition)]
        violated.add_metric(labels, 0 if v.verdict == "EXACTLY_ONCE" else 1)
        finished.add_metric(labels, v.finished_at_ms / 1000)
    return [violated, finished]


def _latency_family(flow: str, snap: LatencySnapshot) -> Metric:
    """The end-to-end latency histogram (``ferryman.metrics._latency`` says exactly what it measures)."""
    family = HistogramMetricFamily(
        "ferryman_deduper_end_to_end_latency_seconds",
        "Per committed record: the destination commit time (the deduper's clock) minus the record's source "
        "timestamp (the source broker's append time for LogAppendTime topics, the producer's for CreateTime); "
        "counted when its transaction commits.",
        labels=["flow"],
    )
    buckets = [(str(float(b)), float(c)) for b, c in zip(snap.bounds_s, snap.cumulative, strict=False)]
    buckets.append(("+Inf", float(snap.count)))
    family.add_metric([flow], buckets, snap.sum_s)
    return family


class DeduperCollector(Collector):
    """The deduper's metrics (``ferryman_deduper_*``), read from ``Deduper.status()`` at each scrape."""

    def __init__(
        self,
        status: DeduperStatus,
        *,
        latency: Latency | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Collect from status and latency (the end-to-end histogram; default an empty one)."""
        self._status = status
        self._latency = latency or LatencyHistogram().snapshot
        self._clock = clock
        self._lag = _PartitionLag("ferryman_deduper", "committed at the destination")
        self._version = _version()

    def collect(self) -> Iterator[Metric]:
        """The families of one status snapshot."""
        st = self._status()
        flow = st.flow
        info = InfoMetricFamily("ferryman_deduper", "Identity of the deduper process.")
        info.add_metric([], {"flow": flow, "deduper_id": st.deduper_id, "version": self._version})
        yield info
        yield _gauge(
            "ferryman_deduper_serving",
            "1 while the deduper serves, 0 while it is NOT_SERVING (destination unreachable, or recovering a "
            "failed transaction; the reason is in its status and log).",
            flow,
            0 if st.unavailable_reason else 1,
        )
        yield _counter(
            "ferryman_deduper_records_written", "Records written to destination topics.", flow, st.records_written
        )
        yield _counter(
            "ferryman_deduper_duplicates_dropped",
            "Source records dropped as already replicated (replays of envelopes, at or below the watermark).",
            flow,
            st.duplicates_dropped,
        )
        yield _counter(
            "ferryman_deduper_gaps_detected",
            "Envelopes that did not follow their partition's watermark (records missing before them); a gap "
            "counts again with every envelope that arrives while it is open.",
            flow,
            st.gaps_detected,
        )
        yield _counter(
            "ferryman_deduper_gaps_healed",
            "Gaps closed by envelopes resent over the control link.",
            flow,
            st.gaps_healed,
        )
        bad = CounterMetricFamily(
            "ferryman_deduper_bad_envelopes",
            "Staging records quarantined to the flow's dead-letter topic (never written to the destination), "
            "by reason.",
            labels=["flow", "reason"],
        )
        for reason, count in sorted(st.bad_envelopes.items()):
            bad.add_metric([flow, reason], count)
        yield bad
        syncs = CounterMetricFamily(
            "ferryman_deduper_group_offset_syncs",
            "Consumer-group offset syncs at the destination (flows[].sync_group_offsets), one per group and "
            "checkpoint, by outcome: committed, unchanged, active (members at the destination), failed.",
            labels=["flow", "outcome"],
        )
        for outcome, count in sorted(st.group_offset_syncs.items()):
            syncs.add_metric([flow, outcome], count)
        yield syncs
        yield from self._loss_families(flow, st)
        transactions = CounterMetricFamily(
            "ferryman_deduper_transactions", "Kafka transactions ended, by outcome.", labels=["flow", "outcome"]
        )
        transactions.add_metric([flow, "committed"], st.transactions_committed)
        transactions.add_metric([flow, "aborted"], st.transactions_aborted)
        yield transactions
        yield self._commit_summary(flow, st)
        yield _latency_family(flow, self._latency())
        yield _counter(
            "ferryman_deduper_commit_flush_seconds",
            "Of the commits' wall time, the part spent flushing destination records before the commit.",
            flow,
            st.commit_flush_seconds_total,
        )
        yield _counter(
            "ferryman_deduper_producer_rebuilds",
            "Destination producers replaced (a fatal error, an unknown commit outcome, or a call abandoned).",
            flow,
            st.producer_rebuilds,
        )
        yield _counter(
            "ferryman_deduper_wedged_calls",
            "Blocking producer calls that overran their deadline and were abandoned with their producer.",
            flow,
            st.wedged_calls,
        )
        yield _gauge(
            "ferryman_deduper_connected_wrappers",
            "Wrappers connected over the control link.",
            flow,
            len(st.connected_wrappers),
        )
        watermarks = _partition_gauge(
            "ferryman_deduper_watermark_offset",
            "Highest source offset committed at the destination, per owned source partition (-1: none yet).",
        )
        rows = []
        for p in st.partitions:
            watermarks.add_metric([flow, p.topic, str(p.partition)], p.watermark)
            # The deduper reports lag against the log end the wrappers last sent (-1: unknown).
            log_end = p.watermark + 1 + p.lag if p.lag >= 0 else -1
            rows.append((p.topic, p.partition, log_end, p.watermark + 1))
        yield watermarks
        yield from self._lag.families(flow, rows, self._clock())
        yield from _audit_families(flow, st.audit_verdicts)

    @staticmethod
    def _loss_families(flow: str, st: control_pb2.GetDeduperStatusResponse) -> Iterator[Metric]:
        """Open gaps (lost or still awaited), staging records deleted unread, acknowledged losses."""
        gaps = _partition_gauge(
            "ferryman_deduper_gap_records",
            "Source records an open gap waits for, per source partition (the partition is held meanwhile).",
        )
        lost = _partition_gauge(
            "ferryman_deduper_gap_lost_records",
            "Of an open gap, the records the source no longer holds (deleted before they were replicated): held "
            "until acknowledged (flows[].acknowledged_losses).",
        )
        for g in st.gaps:
            gaps.add_metric([flow, g.topic, str(g.partition)], g.missing_to - g.missing_from + 1)
            lost.add_metric([flow, g.topic, str(g.partition)], max(0, g.lost_to - g.missing_from + 1))
        yield gaps
        yield lost
        refused = GaugeMetricFamily(
            "ferryman_deduper_refused_record",
            "1 while the destination refuses a record (too large, its timestamp, no key for a compacted topic) and "
            "records wait at it (its staging partition held, or the whole flow until the refusal is named); labels: "
            'destination topic and partition ("" and -1 until named), Kafka error.',
            labels=["flow", "topic", "partition", "error"],
        )
        records = [h.refused_record for h in st.held_staging_partitions]
        if st.HasField("refused_record"):
            records.append(st.refused_record)
        for labels in sorted({(r.topic, str(r.partition), r.error) for r in records}):
            refused.add_metric([flow, *labels], 1)
        yield refused
        yield _counter(
            "ferryman_deduper_staging_lost_records",
            "Staging records deleted (retention) before the deduper read them.",
            flow,
            sum(s.last_offset - s.first_offset + 1 for s in st.staging_losses),
        )
        yield _counter(
            "ferryman_deduper_acknowledged_lost_records",
            "Source records skipped because their loss was acknowledged (flows[].acknowledged_losses).",
            flow,
            st.acknowledged_lost_records,
        )

    @staticmethod
    def _commit_summary(flow: str, st: control_pb2.GetDeduperStatusResponse) -> Metric:
        """Commit wall time: count and sum since start, median and maximum of the last 256 commits."""
        name = "ferryman_deduper_commit_duration_seconds"
        summary = Metric(
            name,
            "Wall time of each transaction commit (flush, staging offsets, EndTxn): it stops the deduper's loop. "
            "Quantiles 0.5 and 1 (the maximum) are over the last 256 commits.",
            "summary",
        )
        summary.add_sample(name, {"flow": flow, "quantile": "0.5"}, st.commit_p50_ms / 1000)
        summary.add_sample(name, {"flow": flow, "quantile": "1"}, st.commit_max_ms / 1000)
        summary.add_sample(f"{name}_sum", {"flow": flow}, st.commit_seconds_total)
        summary.add_sample(f"{name}_count", {"flow": flow}, st.transactions_committed)
        return summary


class WrapperCollector(Collector):
    """The wrapper's metrics (``ferryman_wrapper_*``), read from ``Wrapper.status()`` at each scrape.

    Per partition figures come from the progress the wrapper sends over the
    control link, so they exist only while it has one (``deduper_addresses``).
    """

    def __init__(
        self, status: WrapperStatus, *, control_link: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Collect from status; control_link: whether the wrapper has a control link to report on."""
        self._status = status
        self._control_link = control_link
        self._clock = clock
        self._lag = _PartitionLag("ferryman_wrapper", "wrapped into staging")
        self._version = _version()

    def collect(self) -> Iterator[Metric]:
        """The families of one status snapshot."""
        st = self._status()
        flow = st.flow
        info = InfoMetricFamily("ferryman_wrapper", "Identity of the wrapper process.")
        info.add_metric([], {"flow": flow, "wrapper_id": st.wrapper_id, "version": self._version})
        yield info
        yield _gauge(
            "ferryman_wrapper_serving",
            "1 while the wrapper serves, 0 while it is NOT_SERVING (a cluster unreachable, or recovering; the "
            "reason is in its status and log).",
            flow,
            0 if st.unavailable_reason else 1,
        )
        yield _counter("ferryman_wrapper_records_sent", "Source records wrapped into envelopes.", flow, st.records_sent)
        yield _counter("ferryman_wrapper_envelopes_sent", "Envelopes written to staging.", flow, st.envelopes_sent)
        yield _counter(
            "ferryman_wrapper_rewinds", "Rewinds to the acknowledged source offsets (a failed send).", flow, st.rewinds
        )
        yield _counter(
            "ferryman_wrapper_resends_served",
            "Resend requests of the dedupers served over the control link.",
            flow,
            st.resends_served,
        )
        yield _counter(
            "ferryman_wrapper_producer_rebuilds",
            "Staging producers replaced (a fatal error, or a call abandoned).",
            flow,
            st.producer_rebuilds,
        )
        yield _gauge(
            "ferryman_wrapper_paused",
            "1 while a deduper's backpressure pauses reading the source.",
            flow,
            1 if st.paused else 0,
        )
        if self._control_link:
            yield _gauge(
                "ferryman_wrapper_control_connected",
                "1 while the control link to a deduper is up.",
                flow,
                1 if st.control_connected else 0,
            )
        ends = _partition_gauge(
            "ferryman_wrapper_source_end_offset", "Source log-end offset (high watermark) when last read."
        )
        wrapped = _partition_gauge(
            "ferryman_wrapper_wrapped_offset", "Last source offset wrapped into an envelope (-1: none yet)."
        )
        held = _partition_gauge(
            "ferryman_wrapper_held_offset",
            "Source offset a partition is held at: a record too large to stage (only while held).",
        )
        for h in st.held_partitions:
            held.add_metric([flow, h.topic, str(h.partition)], h.offset)
        rows = []
        for p in st.partitions:
            labels = [flow, p.topic, str(p.partition)]
            wrapped.add_metric(labels, p.last_wrapped_offset)
            if p.log_end_offset >= 0:
                ends.add_metric(labels, p.log_end_offset)
            rows.append((p.topic, p.partition, p.log_end_offset, p.last_wrapped_offset + 1))
        yield ends
        yield wrapped
        yield held
        yield from self._lag.families(flow, rows, self._clock())


def service_registry(collector: Collector) -> CollectorRegistry:
    """A registry of its own for one service: its collector and the process, platform and GC collectors.

    Not the library's global registry: a process (a test) may run more than one service.
    """
    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
