"""One audit task, on an executor: read one source partition's range, its copy and its mappings; align them.

Everything one partition's alignment needs is read by the task itself, so no
record crosses a Spark exchange and none is converted to Spark rows: the
source span (range and lookahead), the destination window and the offset-map
partition that holds the partition's mappings are read with the data source's
span reader (Arrow batches), their contents coded exactly (``_identity``), and
``classify`` runs on the columns. One small row per partition goes back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from ferryman.state import mapped_source_offsets
from ferryman.v1 import state_pb2

from ferryman_auditor._align import Outcome, Rows, classify, hashes
from ferryman_auditor._identity import DENSE, content_keys
from ferryman_auditor._plan import PartitionPlan
from ferryman_auditor.kafka_source._planning import OffsetSpan
from ferryman_auditor.kafka_source._reader import read_span

#: Columns kept of what the span reader yields (the rest is the same for every record of a task).
_CONTENT = ["key", "value", "headers", "offset", "timestamp", "timestamp_type"]


@dataclass(frozen=True)
class TaskConfig:
    """How a task reads: each cluster's librdkafka properties and the stall budget of a read."""

    source: Mapping[str, str]
    destination: Mapping[str, str]
    stall_timeout_ms: int


@dataclass(frozen=True)
class PartitionTask:
    """One source partition's audit: its plan and the offset-map span holding its mappings (None: no map)."""

    plan: PartitionPlan
    map_span: OffsetSpan | None


def run_task(task: PartitionTask, config: TaskConfig) -> Outcome:
    """Read and align one partition (on an executor).

    Raises:
        KafkaSourceError: a read failed (a span start no longer stored, a Kafka error, a stall).
    """
    plan = task.plan
    source = _read(OffsetSpan(plan.topic, plan.partition, plan.source_start, plan.lookahead_end), config.source, config)
    found = _read(
        OffsetSpan(plan.destination_topic, plan.partition, plan.destination_start, plan.destination_end),
        config.destination,
        config,
    )
    both = pa.concat_tables([source, found])
    first, second = content_keys(both)
    keys = hashes(first, second)
    source_offsets = np.asarray(source.column("offset").to_numpy(), dtype=np.int64)
    expected = source_offsets < plan.source_end
    n_source = len(source_offsets)
    map_source, map_destination = _mappings(task, config)
    rows = Rows(
        expected_offsets=source_offsets[expected],
        expected_hashes=keys[:n_source][expected],
        found_offsets=np.asarray(found.column("offset").to_numpy(), dtype=np.int64),
        found_hashes=keys[n_source:],
        lookahead_hashes=keys[:n_source][~expected],
        map_source=map_source,
        map_destination=map_destination,
        code_bound=both.num_rows if DENSE else None,
    )
    return classify(rows, plan.leading, plan.range_start, plan.source_end)


def _read(span: OffsetSpan, kafka: Mapping[str, str], config: TaskConfig) -> pa.Table:
    batches = [b.select(_CONTENT) for b in read_span(span, kafka, config.stall_timeout_ms)]
    if not batches:
        from ferryman_auditor.kafka_source._reader import ARROW_SCHEMA  # noqa: PLC0415 -- only for empty reads

        return pa.Table.from_batches([], schema=pa.schema([ARROW_SCHEMA.field(c) for c in _CONTENT]))
    return pa.Table.from_batches(batches)


def _mappings(task: PartitionTask, config: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """The partition's offset-map entries, sorted by source offset: (source offsets, destination offsets)."""
    if task.map_span is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    values = (
        raw
        for batch in read_span(task.map_span, config.destination, config.stall_timeout_ms)
        for raw in batch.column("value").to_pylist()  # one map record per run of records: not per record
    )
    return expand_mappings(values, task.plan.topic, task.plan.partition)


def expand_mappings(values: Iterable[bytes | None], topic: str, partition: int) -> tuple[np.ndarray, np.ndarray]:
    """One (source, destination) offset pair per record mapped by the offset-map records of one source partition."""
    sources: list[np.ndarray] = []
    destinations: list[np.ndarray] = []
    for raw in values:
        if raw is None:
            continue
        m = state_pb2.OffsetMapping.FromString(raw)
        if m.source.topic != topic or m.source.partition != partition:
            continue
        offsets = mapped_source_offsets(m)
        # Consecutive offsets (the usual form) as one arange: asarray would take the range's ints one by one.
        if isinstance(offsets, range):
            src = np.arange(offsets.start, offsets.stop, dtype=np.int64)
        else:
            src = np.asarray(offsets, dtype=np.int64)
        sources.append(src)
        destinations.append(m.first_destination_offset + np.arange(len(src), dtype=np.int64))
    if not sources:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ms, md = np.concatenate(sources), np.concatenate(destinations)
    order = np.argsort(ms, kind="stable")
    return ms[order], md[order]
