"""Audits compare content without the traceparent header Ferryman sets on traced records."""

from __future__ import annotations

import datetime
from typing import Any

from ferryman_auditor._job import _content_hashes
from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType, TimestampType

_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
        StructField("timestamp", TimestampType()),
        StructField("timestamp_type", IntegerType()),
    ]
)


def _hash(spark: SparkSession, headers: list[tuple[str, bytes | None]] | None) -> Any:
    row = (b"k", b"v", headers, datetime.datetime(2026, 1, 1), 0)
    h1, h2 = _content_hashes()
    return tuple(spark.createDataFrame([row], _SCHEMA).select(h1, h2).first())  # type: ignore[arg-type]


def test_traceparent_is_left_out_of_the_content_hash(spark: SparkSession) -> None:
    tp = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    other = b"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
    assert _hash(spark, None) == _hash(spark, [("traceparent", tp)])  # appended to a record without headers
    assert _hash(spark, [("a", b"1")]) == _hash(spark, [("a", b"1"), ("traceparent", tp)])  # appended
    assert _hash(spark, [("traceparent", tp), ("a", b"1")]) == _hash(spark, [("traceparent", other), ("a", b"1")])
    # Every other header still counts: value, null value, order.
    assert _hash(spark, [("a", b"1")]) != _hash(spark, [("a", b"2")])
    assert _hash(spark, [("a", b"")]) != _hash(spark, [("a", None)])
    assert _hash(spark, [("a", b"1"), ("b", b"2")]) != _hash(spark, [("b", b"2"), ("a", b"1")])
    assert _hash(spark, None) != _hash(spark, [("a", b"1")])
