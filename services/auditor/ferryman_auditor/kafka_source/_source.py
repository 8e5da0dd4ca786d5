"""The ``ferryman-kafka`` PySpark data source (batch reads of Kafka topics on confluent-kafka)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ferryman_auditor.kafka_source._options import NAME, SourceOptions, parse_options
from ferryman_auditor.kafka_source._planning import OffsetSpan, plan_splits, read_plan
from ferryman_auditor.kafka_source._reader import read_span

#: The rows of a read, in Spark's DDL (the Arrow form is ``_reader.ARROW_SCHEMA``).
#: Timestamp types are Kafka's numbers, as Spark's own Kafka source gives them:
#: -1 none, 0 create time, 1 log-append time.
SCHEMA_DDL = (
    "key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, topic STRING, "
    "partition INT, offset BIGINT, timestamp TIMESTAMP, timestamp_type INT"
)


@dataclass(frozen=True)
class KafkaSplit(InputPartition):
    """One input partition: an offset span, read by one task."""

    span: OffsetSpan
    """What the task reads."""

    def __init__(self, span: OffsetSpan) -> None:
        object.__setattr__(self, "span", span)
        object.__setattr__(self, "value", span)


class FerrymanKafkaDataSource(DataSource):
    """Batch reads of one Kafka topic: ``spark.read.format("ferryman-kafka").option(...).load()``.

    Options (case-insensitive): ``bootstrap.servers`` and ``topic`` (required);
    ``partitions`` (comma-separated, default all); ``startingOffsets`` and
    ``endingOffsets`` (``earliest``, ``latest``, an offset, or JSON
    ``{"0": 42, "1": "latest"}``; the end is exclusive); ``startingTimestamp`` and
    ``endingTimestamp`` (ms since the epoch: the first offset at or after that
    time); ``isolation.level`` (``read_committed`` by default);
    ``maxOffsetsPerSplit``, ``stallTimeoutMs``, ``requestTimeoutMs``; and any
    librdkafka property prefixed with ``kafka.`` (``kafka.security.protocol``,
    ``kafka.sasl.username``, ...).
    """

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return NAME

    def schema(self) -> str:
        """The fixed schema of every read."""
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader of what the options select (options are checked here, on the driver)."""
        return _Reader(parse_options(self.options))


class _Reader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        conf = {**self._options.kafka_config, "group.id": f"ferryman-kafka-planner-{uuid.uuid4().hex[:8]}"}
        consumer = Consumer(conf)
        try:
            spans = read_plan(consumer, self._options)
        finally:
            consumer.close()
        splits = plan_splits(spans, self._options.max_offsets_per_split)
        # Spark runs a read with no partition as one empty task; an empty span reads nothing.
        return [KafkaSplit(s) for s in splits] or [KafkaSplit(OffsetSpan(self._options.topic, 0, 0, 0))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        span = partition.span if isinstance(partition, KafkaSplit) else partition.value
        yield from read_span(span, self._options.kafka_config, self._options.stall_timeout_ms)
