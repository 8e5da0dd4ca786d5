"""``ferryman-kafka``: a PySpark data source that reads Kafka topics in batch, on confluent-kafka.

Spark's own Kafka connector is a JVM package; this one needs only this Python
package on the executors. Register it once per session::

    from ferryman_auditor.kafka_source import register
    register(spark)
    df = (spark.read.format("ferryman-kafka")
          .option("bootstrap.servers", "kafka:9092").option("topic", "orders").load())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferryman_auditor.kafka_source._errors import KafkaSourceError
from ferryman_auditor.kafka_source._options import NAME, BoundSpec, SourceOptions, parse_options
from ferryman_auditor.kafka_source._planning import OffsetSpan, Watermarks, plan_splits, resolve_spans, split_span
from ferryman_auditor.kafka_source._reader import ARROW_SCHEMA, read_span

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the ``ferryman-kafka`` format with a session (idempotent)."""
    from ferryman_auditor.kafka_source._source import FerrymanKafkaDataSource  # noqa: PLC0415 -- imports pyspark

    spark.dataSource.register(FerrymanKafkaDataSource)


__all__ = [
    "ARROW_SCHEMA",
    "NAME",
    "BoundSpec",
    "KafkaSourceError",
    "OffsetSpan",
    "SourceOptions",
    "Watermarks",
    "parse_options",
    "plan_splits",
    "read_span",
    "register",
    "resolve_spans",
    "split_span",
]
