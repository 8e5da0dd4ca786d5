"""The Spark job of one audit: one task per source partition, reading and aligning that partition in place.

Spark places the tasks and collects one outcome per partition; it never sees a
record. Each task (``_task.run_task``, on an executor) reads the partition's
source range and lookahead, its destination window and the offset-map
partition holding its mappings with the ``ferryman-kafka`` span reader, codes
contents exactly and aligns both ways. This replaced a job that read both sides
as Spark DataFrames, hashed them in the JVM and grouped them by partition: the
Arrow-to-row conversion and the shuffle cost about half of its CPU (see the
report of issue 27 for the figures).

The tasks are an RDD's partitions (``parallelize(...).mapPartitions``), not a
DataFrame's (``mapInArrow``): nothing of Spark SQL is needed to hand a task
number to a Python function and collect its outcome, and the SQL path paid,
per run, the query's planning and generated code, compiled by the JVM each
time (JVM CPU of a warm 1 M audit ~2-2.9 s against ~1.3-1.7, a cold one ~11-14
against ~2.4). The outcomes come back pickled.

The driver plans the offset map's spans (where each map partition ends, read
committed) before the tasks start, so a task reads what the plan saw.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer
from ferryman.envelope import staging_partition
from pyspark.sql import SparkSession

from ferryman_auditor._align import Outcome
from ferryman_auditor._plan import PartitionPlan
from ferryman_auditor._task import PartitionTask, TaskConfig, run_task
from ferryman_auditor.kafka_source import OffsetSpan, SourceOptions, parse_options
from ferryman_auditor.kafka_source._planning import read_plan


@dataclass(frozen=True)
class ClusterAccess:
    """How the executors reach one cluster: bootstrap servers and extra librdkafka properties."""

    bootstrap_servers: str
    client_config: Mapping[str, str | int | float | bool]

    def options(self) -> dict[str, str]:
        """Data source options for this cluster."""
        out = {"bootstrap.servers": self.bootstrap_servers}
        out.update({f"kafka.{k}": _librdkafka_text(v) for k, v in self.client_config.items()})
        return out

    def read_options(self, topic: str, **extra: str) -> SourceOptions:
        """The parsed options of a read of topic on this cluster (read_committed, the data source's defaults)."""
        return parse_options({**self.options(), "topic": topic, **extra})


@dataclass(frozen=True)
class MapRead:
    """Where the flow's offset map is read from."""

    topic: str
    start_offsets: Mapping[int, int]
    """First offset to read per partition of the map topic (absent partitions: from the beginning)."""


def _librdkafka_text(value: str | int | float | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def run_job(
    spark: SparkSession,
    plans: Sequence[PartitionPlan],
    source: ClusterAccess,
    destination: ClusterAccess,
    offset_map: MapRead | None,
) -> dict[tuple[str, int], Outcome]:
    """Align every planned partition both ways; return each partition's outcome."""
    if not plans:
        return {}
    map_spans = _map_spans(destination, offset_map) if offset_map is not None else {}
    tasks = [PartitionTask(p, _map_span_of(p, map_spans)) for p in plans]
    src_options = source.read_options(plans[0].topic)
    config = TaskConfig(
        source=dict(src_options.kafka_config),
        destination=dict(destination.read_options(plans[0].destination_topic).kafka_config),
        stall_timeout_ms=src_options.stall_timeout_ms,
    )
    # One task number per Spark partition: Spark runs each task where it has a core, nothing is exchanged.
    ids = spark.sparkContext.parallelize(range(len(tasks)), len(tasks))
    out = dict(ids.mapPartitions(_runner(tasks, config)).collect())
    return {(p.topic, p.partition): out[n] for n, p in enumerate(plans)}


def _map_spans(destination: ClusterAccess, offset_map: MapRead) -> dict[int, OffsetSpan]:
    """Each offset-map partition's span, from the run's start positions to its last stable offset now."""
    extra = {}
    if offset_map.start_offsets:
        extra["startingOffsets"] = json.dumps({str(p): o for p, o in offset_map.start_offsets.items()})
    options = destination.read_options(offset_map.topic, **extra)
    consumer = Consumer({**options.kafka_config, "group.id": f"ferryman-audit-planner-{uuid.uuid4().hex[:8]}"})
    try:
        return {s.partition: s for s in read_plan(consumer, options)}
    finally:
        consumer.close()


def _map_span_of(plan: PartitionPlan, spans: Mapping[int, OffsetSpan]) -> OffsetSpan | None:
    """The map span holding plan's mappings: the deduper writes them where it writes the partition's envelopes."""
    if not spans:
        return None
    return spans.get(staging_partition(plan.topic, plan.partition, len(spans)))


def _runner(
    tasks: Sequence[PartitionTask], config: TaskConfig
) -> Callable[[Iterable[int]], Iterator[tuple[int, Outcome]]]:
    """The function of mapPartitions (pickled to the executors with the tasks)."""

    def run(numbers: Iterable[int]) -> Iterator[tuple[int, Outcome]]:
        for n in numbers:
            yield n, run_task(tasks[n], config)

    return run
