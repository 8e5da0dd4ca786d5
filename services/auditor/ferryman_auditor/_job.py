"""The Spark job of one audit: read both sides with ``ferryman-kafka``, hash, align per partition.

Reading and hashing run on the executors (the data source's reader, then
Spark's own ``xxhash64``); each source partition's rows (two hashes and an
offset per record, plus its offset-map entries) then go to one ``classify``
call (``groupBy().applyInPandas``), and only one row per partition comes back
to the driver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from ferryman.tracing import TRACEPARENT
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf

from ferryman_auditor._align import Counts, Leading, Outcome, Rows, Side, classify, hashes
from ferryman_auditor._plan import PartitionPlan
from ferryman_auditor.kafka_source import NAME, register

#: One row per record read. ``topic`` is the topic's index in the job's sorted topics: the rows are shuffled
#: and grouped by (topic, partition), and a name per row cost the exchange a string copy, hash and compare.
_ROWS_SCHEMA = "topic INT, partition INT, side INT, offset BIGINT, mapped BIGINT, h1 BIGINT, h2 BIGINT"
_COUNT_FIELDS = ("found", "missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")
_RESULT_SCHEMA = ", ".join(
    ["topic INT", "partition INT"]
    + [f"{f} BIGINT" for f in _COUNT_FIELDS]
    + ["by_map BOOLEAN"]
    + [f"map_{f} BIGINT" for f in _COUNT_FIELDS]
    + ["next_destination_offset BIGINT", "samples STRING"]
)
#: Seed-like first input of the second content hash, so the two 64-bit hashes are independent.
_SECOND_HASH_SALT = "ferryman-audit"


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
    register(spark)
    frames: list[DataFrame] = []
    by_topic: dict[str, list[PartitionPlan]] = {}
    for plan in plans:
        by_topic.setdefault(plan.topic, []).append(plan)
    topic_ids = {topic: n for n, topic in enumerate(sorted(by_topic))}
    for topic, topic_plans in sorted(by_topic.items()):
        frames.append(_source_rows(spark, topic_ids[topic], topic_plans, source))
        dest = _destination_rows(spark, topic_ids[topic], topic_plans, destination)
        if dest is not None:
            frames.append(dest)
    if offset_map is not None:
        frames.append(_map_rows(spark, offset_map, destination, topic_ids))
    rows = frames[0]
    for f in frames[1:]:
        rows = rows.unionByName(f)
    ranges = {(topic_ids[p.topic], p.partition): (p.range_start, p.source_end, int(p.leading)) for p in plans}
    result = rows.groupBy("topic", "partition").applyInPandas(_classifier(ranges), _RESULT_SCHEMA).collect()
    names = sorted(by_topic)
    out = {(names[r["topic"]], r["partition"]): _outcome(r.asDict()) for r in result}
    empty = Outcome(Counts(), None, -1, {})
    return {(p.topic, p.partition): out.get((p.topic, p.partition), empty) for p in plans}


def _read(spark: SparkSession, cluster: ClusterAccess, topic: str, starts: dict[int, int], ends: dict[int, int]) -> Any:
    reader = spark.read.format(NAME).options(**cluster.options())
    return (
        reader.option("topic", topic)
        .option("partitions", ",".join(str(p) for p in sorted(starts)))
        .option("startingOffsets", json.dumps({str(p): o for p, o in starts.items()}))
        .option("endingOffsets", json.dumps({str(p): o for p, o in ends.items()}))
        .load()
    )


def _content_hashes() -> tuple[Column, Column]:
    """Two independent 64-bit hashes of what replication must keep; nulls are told apart from empty values.

    ``traceparent`` headers are left out on both sides: on traced records Ferryman sets it at the
    destination (replaced in place, or appended when the source record had none; README, "Operations:
    tracing"), so a traced copy is not an altered one. A record whose only header was that one hashes as
    a record without headers.
    """
    kept = sf.filter("headers", lambda h: h["key"] != sf.lit(TRACEPARENT))
    kept = sf.when(sf.size(kept) > 0, kept)  # no header left: as a record without headers (null)
    headers = sf.transform(kept, lambda h: sf.struct(h["key"], sf.isnull(h["value"]), h["value"]))
    parts = [
        sf.isnull("key"),
        sf.col("key"),
        sf.isnull("value"),
        sf.col("value"),
        sf.coalesce(sf.size(kept), sf.lit(-1)),
        headers,
        sf.unix_micros("timestamp"),
        sf.col("timestamp_type"),
    ]
    return sf.xxhash64(*parts), sf.xxhash64(sf.lit(_SECOND_HASH_SALT), *parts)


def _source_rows(spark: SparkSession, topic_id: int, plans: Sequence[PartitionPlan], cluster: ClusterAccess) -> Any:
    df = _read(
        spark,
        cluster,
        plans[0].topic,
        {p.partition: p.source_start for p in plans},
        {p.partition: p.lookahead_end for p in plans},
    )
    ends = sf.create_map(*[x for p in plans for x in (sf.lit(p.partition), sf.lit(p.source_end))])
    side = sf.when(sf.col("offset") < sf.element_at(ends, sf.col("partition")), int(Side.EXPECTED)).otherwise(
        int(Side.LOOKAHEAD)
    )
    h1, h2 = _content_hashes()
    return df.select(
        sf.lit(topic_id).alias("topic"),
        "partition",
        side.cast("int").alias("side"),
        "offset",
        sf.lit(-1).cast("bigint").alias("mapped"),
        h1.alias("h1"),
        h2.alias("h2"),
    )


def _destination_rows(
    spark: SparkSession, topic_id: int, plans: Sequence[PartitionPlan], cluster: ClusterAccess
) -> Any | None:
    wanted = [p for p in plans if p.destination_end > p.destination_start]
    if not wanted:
        return None
    df = _read(
        spark,
        cluster,
        wanted[0].destination_topic,
        {p.partition: p.destination_start for p in wanted},
        {p.partition: p.destination_end for p in wanted},
    )
    h1, h2 = _content_hashes()
    return df.select(
        sf.lit(topic_id).alias("topic"),
        "partition",
        sf.lit(int(Side.FOUND)).alias("side"),
        "offset",
        sf.lit(-1).cast("bigint").alias("mapped"),
        h1.alias("h1"),
        h2.alias("h2"),
    )


def _map_rows(spark: SparkSession, offset_map: MapRead, cluster: ClusterAccess, topic_ids: Mapping[str, int]) -> Any:
    reader = spark.read.format(NAME).options(**cluster.options()).option("topic", offset_map.topic)
    if offset_map.start_offsets:
        starts = {str(p): o for p, o in offset_map.start_offsets.items()}
        reader = reader.option("startingOffsets", json.dumps(starts))
    return reader.load().select("value").mapInArrow(_map_expander(dict(topic_ids)), _ROWS_SCHEMA)


def _map_expander(topic_ids: dict[str, int]) -> Any:
    """An Arrow function from offset-map records to one row per mapped record (runs on executors)."""

    def expand(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from ferryman.state import mapped_source_offsets  # noqa: PLC0415 -- executor side
        from ferryman.v1 import state_pb2  # noqa: PLC0415

        for batch in batches:
            cols: dict[str, list[Any]] = {"topic": [], "partition": [], "offset": [], "mapped": []}
            for raw in batch.column(0).to_pylist():  # one map record per run of records: not per record
                if raw is None:
                    continue
                m = state_pb2.OffsetMapping.FromString(raw)
                topic_id = topic_ids.get(m.source.topic)
                if topic_id is None:
                    continue
                src = np.asarray(mapped_source_offsets(m), dtype=np.int64)
                cols["topic"].append(np.full(len(src), topic_id, dtype=np.int32))
                cols["partition"].append(np.full(len(src), m.source.partition, dtype=np.int32))
                cols["offset"].append(src)
                cols["mapped"].append(m.first_destination_offset + np.arange(len(src), dtype=np.int64))
            if not cols["offset"]:
                continue
            n = sum(len(c) for c in cols["offset"])
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.concatenate(cols["topic"])),
                    pa.array(np.concatenate(cols["partition"])),
                    pa.array(np.full(n, int(Side.MAPPED), dtype=np.int32)),
                    pa.array(np.concatenate(cols["offset"])),
                    pa.array(np.concatenate(cols["mapped"])),
                    pa.array(np.zeros(n, dtype=np.int64)),
                    pa.array(np.zeros(n, dtype=np.int64)),
                ],
                names=["topic", "partition", "side", "offset", "mapped", "h1", "h2"],
            )

    return expand


def _classifier(ranges: Mapping[tuple[int, int], tuple[int, int, int]]) -> Any:
    """The per-partition function of applyInPandas (pickled to the executors with ranges)."""

    def run(frame: pd.DataFrame) -> pd.DataFrame:
        topic, partition = int(frame["topic"].iloc[0]), int(frame["partition"].iloc[0])
        start, end, leading = ranges.get((topic, partition), (0, 0, int(Leading.COUNT)))
        side = frame["side"].to_numpy()

        def part(s: Side) -> pd.DataFrame:
            return frame[side == int(s)].sort_values("offset", kind="stable")

        e, f, la, m = part(Side.EXPECTED), part(Side.FOUND), part(Side.LOOKAHEAD), part(Side.MAPPED)
        rows = Rows(
            expected_offsets=e["offset"].to_numpy(np.int64),
            expected_hashes=hashes(e["h1"].to_numpy(np.int64), e["h2"].to_numpy(np.int64)),
            found_offsets=f["offset"].to_numpy(np.int64),
            found_hashes=hashes(f["h1"].to_numpy(np.int64), f["h2"].to_numpy(np.int64)),
            lookahead_hashes=hashes(la["h1"].to_numpy(np.int64), la["h2"].to_numpy(np.int64)),
            map_source=m["offset"].to_numpy(np.int64),
            map_destination=m["mapped"].to_numpy(np.int64),
        )
        outcome = classify(rows, Leading(leading), start, end)
        record: dict[str, Any] = {"topic": topic, "partition": partition, **outcome.content.as_dict()}
        record["by_map"] = outcome.by_map is not None
        record.update({f"map_{k}": v for k, v in (outcome.by_map or Counts()).as_dict().items()})
        record["next_destination_offset"] = outcome.next_destination_offset
        record["samples"] = json.dumps(outcome.samples)
        return pd.DataFrame([record])

    return run


def _outcome(r: Mapping[str, Any]) -> Outcome:
    content = Counts(**{f: int(r[f]) for f in _COUNT_FIELDS})
    by_map = Counts(**{f: int(r[f"map_{f}"]) for f in _COUNT_FIELDS}) if r["by_map"] else None
    return Outcome(content, by_map, int(r["next_destination_offset"]), json.loads(r["samples"]))
