"""One audit of one flow: plan the ranges, run the Spark job, report and store the results."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman.client_config import base_config
from ferryman.config import ClusterConfig, FerrymanConfig, FlowConfig
from ferryman.errors import KafkaOperationError
from ferryman.naming import FlowNames, NamingPolicy, TopicFilter
from ferryman.state import decode_watermarks, read_compacted
from ferryman.topics import cluster_id, describe_topics, list_topic_names, settled_ends, watermark_offsets

from ferryman_auditor._errors import AuditCancelledError, AuditError, AuditUsageError
from ferryman_auditor._plan import AuditRange, PartitionPlan, plan_partition
from ferryman_auditor._report import AuditReport, PartitionReport, store_parquet
from ferryman_auditor._store import AuditStore, Checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)

#: Budget of each metadata, offset or state read of the planning phase.
DEFAULT_TIMEOUT_S = 30.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AuditSettings:
    """How an audit runs (not what it checks)."""

    reports_dir: Path | None = None
    """Where Parquet reports go (``<reports_dir>/<run id>.parquet``); None: no Parquet report."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Budget of each planning read and of storing the results."""


def _kafka_conf(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    return base_config(cluster, client_id)


class _Kafka:
    """The planning reads of one audit, on one cluster (a read_committed consumer and an admin client)."""

    def __init__(self, cluster: ClusterConfig, client_id: str, timeout_s: float) -> None:
        self.conf = _kafka_conf(cluster, client_id)
        self.admin = AdminClient(self.conf)
        self._group = f"{client_id}-planner"
        self.consumer = Consumer({**self.conf, "group.id": self._group, "isolation.level": "read_committed"})
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.consumer.close()

    def partitions(self, topics: Iterable[str]) -> dict[str, int]:
        return {t: info.partitions for t, info in describe_topics(self.admin, topics, self.timeout_s).items()}

    def marks(self, topic: str, partition: int) -> tuple[int, int]:
        return watermark_offsets(self.consumer, topic, partition, budget_s=self.timeout_s)

    def settled_marks(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(low, last stable offset) of each partition once the transactions open there now have ended."""
        conf = {**self.conf, "group.id": self._group}
        return settled_ends(conf, self.consumer, partitions, time.monotonic() + self.timeout_s)

    def offsets_for_time(self, topic: str, partitions: Iterable[int], ms: int | None) -> dict[int, int]:
        if ms is None:
            return {}
        tps = [TopicPartition(topic, p, ms) for p in partitions]
        return {tp.partition: tp.offset for tp in self.consumer.offsets_for_times(tps, timeout=self.timeout_s)}


def new_run_id() -> str:
    """A run id that sorts by time: ``20260101T120000Z-1a2b3c``."""
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def run_audit(
    spark: SparkSession,
    config: FerrymanConfig,
    flow: FlowConfig,
    audit_range: AuditRange,
    *,
    settings: AuditSettings | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    run_id: str | None = None,
) -> AuditReport:
    """Audit one flow over one range; store the results and return the report.

    ``run_id`` names the run (default: a new `new_run_id`), for callers that hand it out before it starts.

    ``cancel`` stops a run before it stores anything: once set, a run that has
    not started its Spark job does not start it, and a job that then fails
    (the caller cancels it: ``SparkContext.cancelAllJobs``) is reported as
    cancelled rather than failed. A run whose job has finished stores its
    results whatever ``cancel`` says (that takes one budget at most).

    Raises:
        AuditUsageError: the range names a topic or partition the flow does not have.
        AuditCancelledError: cancel was set before the results were computed.
        AuditError: a cluster could not be read or the results not stored.
    """
    settings = settings or AuditSettings()
    say = progress or (lambda _step: None)
    started = int(time.time() * 1000)
    run_id = run_id or new_run_id()
    names = FlowNames.of(flow)
    src_cluster, dst_cluster = config.clusters[flow.source], config.clusters[flow.target]
    store = AuditStore(_kafka_conf(dst_cluster, "ferryman-auditor"), names.audit_topic, settings.timeout_s)
    src = _Kafka(src_cluster, f"ferryman-auditor.{flow.name}", settings.timeout_s)
    dst = _Kafka(dst_cluster, f"ferryman-auditor.{flow.name}", settings.timeout_s)
    try:
        say("planning")
        stored = store.load()
        checkpoint = stored.checkpoint if audit_range.kind == "since-last" else None
        plans, map_end, map_start = _plan(
            flow=flow, names=names, audit_range=audit_range, checkpoint=checkpoint, src=src, dst=dst
        )
    except (KafkaException, KafkaOperationError) as exc:
        raise AuditError(f"planning the audit of flow {flow.name}: {exc}") from exc
    finally:
        src.close()
        dst.close()
    from ferryman_auditor._job import ClusterAccess, MapRead, run_job  # noqa: PLC0415 -- pyspark, pandas

    if cancel is not None and cancel.is_set():
        raise AuditCancelledError(f"the audit of flow {flow.name} was cancelled before its Spark job")
    say("reading and aligning")
    map_read = MapRead(names.offset_map_topic, map_start) if map_end is not None else None
    try:
        outcomes = run_job(
            spark,
            plans,
            ClusterAccess(src_cluster.bootstrap_servers, src_cluster.client_config),
            ClusterAccess(dst_cluster.bootstrap_servers, dst_cluster.client_config),
            map_read,
        )
    except Exception as exc:  # Spark wraps executor errors in its own classes: translated once, here
        if cancel is not None and cancel.is_set():
            raise AuditCancelledError(f"the audit job of flow {flow.name} was cancelled") from exc
        raise AuditError(f"the audit job of flow {flow.name} failed: {_first_line(exc)}") from exc
    report = AuditReport(
        run_id=run_id,
        flow=flow.name,
        started_at_ms=started,
        finished_at_ms=int(time.time() * 1000),
        range=audit_range.describe(),
        partitions=[PartitionReport.of(p, outcomes[(p.topic, p.partition)]) for p in plans],
    )
    say("storing")
    next_checkpoint = None
    if audit_range.kind == "since-last":
        next_checkpoint = _next_checkpoint(stored.checkpoint, plans, outcomes, map_end, audit_range.topics is None)
    store.save(report, next_checkpoint)
    if settings.reports_dir is not None:
        store_parquet(report, settings.reports_dir)
    return report


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _plan(
    *,
    flow: FlowConfig,
    names: FlowNames,
    audit_range: AuditRange,
    checkpoint: Checkpoint | None,
    src: _Kafka,
    dst: _Kafka,
) -> tuple[list[PartitionPlan], dict[int, int] | None, dict[int, int]]:
    """Plans of every audited partition, the offset map's end (None without a map) and where to read it from."""
    in_flow = [t for t in list_topic_names(src.admin, src.timeout_s) if TopicFilter.of(flow).matches(t)]
    topics = sorted(in_flow)
    if audit_range.topics is not None:
        unknown = sorted(set(audit_range.topics) - set(in_flow))
        if unknown:
            raise AuditUsageError(f"flow {flow.name} replicates no source topic {', '.join(unknown)}")
        topics = sorted(audit_range.topics)
    policy = NamingPolicy(flow.source, flow.naming)
    source_partitions = src.partitions(topics)
    source_id = cluster_id(src.admin, src.timeout_s)

    # 1. The map's end, before the watermarks (see _plan's module docstring in ferryman_auditor._plan).
    map_end: dict[int, int] | None = None
    map_parts = (
        dst.partitions([names.offset_map_topic]).get(names.offset_map_topic) if flow.emit_offset_mappings else None
    )
    if map_parts:
        map_end = {p: dst.marks(names.offset_map_topic, p)[1] for p in range(map_parts)}
    # 2. The committed watermarks W1.
    state_parts = dst.partitions([names.state_topic]).get(names.state_topic)

    def watermarks() -> dict[tuple[str, int], int] | None:
        if not state_parts:
            return None
        raw = read_compacted(
            {**dst.conf, "group.id": "ferryman-auditor-state"},
            names.state_topic,
            range(state_parts),
            dst.timeout_s,
            settle=True,
        )
        merged = {k: v for part in raw.values() for k, v in part.items()}
        return {(k.topic, k.partition): st.watermark for k, st in decode_watermarks(merged, source_id).items()}

    w1 = watermarks()
    # 3. The source's and the destination's ends.
    dest_names = {t: policy.destination_topic(t) for t in topics}
    dest_partitions = dst.partitions(dest_names.values())
    source_marks = {(t, p): src.marks(t, p) for t in topics for p in range(source_partitions[t])}
    present = [(t, p) for (t, p) in source_marks if p < dest_partitions.get(dest_names[t], 0)]
    settled = dst.settled_marks([(dest_names[t], p) for t, p in present])
    dest_marks = dict.fromkeys(source_marks, (0, 0))
    dest_marks.update({(t, p): settled[(dest_names[t], p)] for t, p in present})
    # 4. The watermarks again, W2: the lookahead.
    w2 = watermarks()
    _check_partitions(audit_range, source_partitions)
    plans = []
    for t in topics:
        parts = range(source_partitions[t])
        starts = src.offsets_for_time(t, parts, audit_range.start_ms) if audit_range.kind == "time" else {}
        ends = src.offsets_for_time(t, parts, audit_range.end_ms) if audit_range.kind == "time" else {}
        for p in parts:
            low, stable = source_marks[(t, p)]
            replicated = stable if w1 is None else min(w1.get((t, p), -1) + 1, stable)
            lookahead = stable if w2 is None else max(w2.get((t, p), -1) + 1, replicated)
            plans.append(
                plan_partition(
                    topic=t,
                    partition=p,
                    destination_topic=dest_names[t],
                    audit_range=audit_range,
                    source_marks=(low, stable),
                    replicated_end=replicated,
                    lookahead_end=lookahead,
                    destination_marks=dest_marks[(t, p)],
                    checkpoint=checkpoint.partitions.get((t, p)) if checkpoint else None,
                    time_offsets=(starts.get(p, -1), ends.get(p, -1)) if audit_range.kind == "time" else None,
                )
            )
    map_start = dict(checkpoint.map_positions) if checkpoint is not None else {}
    return plans, map_end, map_start


def _check_partitions(audit_range: AuditRange, partitions: Mapping[str, int]) -> None:
    named = set(audit_range.start_offsets or {}) | set(audit_range.end_offsets or {})
    most = max(partitions.values(), default=0)
    bad = sorted(p for p in named if p >= most or p < 0)
    if bad:
        raise AuditUsageError(f"no partition {bad} in the audited topics (they have at most {most})")


def _next_checkpoint(
    previous: Checkpoint | None,
    plans: list[PartitionPlan],
    outcomes: Mapping[tuple[str, int], Any],
    map_end: dict[int, int] | None,
    whole_flow: bool,
) -> Checkpoint:
    """Where the next since-last audit starts: past this range, at both ends."""
    partitions = dict(previous.partitions) if previous else {}
    for plan in plans:
        nxt = outcomes[(plan.topic, plan.partition)].next_destination_offset
        partitions[(plan.topic, plan.partition)] = (plan.range_end, nxt if nxt >= 0 else plan.destination_end)
    # The map is shared by the flow's topics: it moves on only when all of them were audited.
    positions = dict(map_end or {}) if whole_flow else dict(previous.map_positions if previous else {})
    return Checkpoint(partitions, positions)
