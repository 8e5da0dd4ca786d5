"""The Spark session an audit runs in, when the caller does not bring one."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The default master: every core of this machine. ``--master`` (or FERRYMAN_SPARK_MASTER) runs elsewhere.
DEFAULT_MASTER = "local[*]"


#: Partitions of an audit's shuffle; a cluster session may raise it with ``spark.sql.shuffle.partitions``.
SHUFFLE_PARTITIONS = 16


def spark_session(master: str | None = None, app_name: str = "ferryman-audit") -> SparkSession:
    """A Spark session for audits (created, or the active one).

    Python workers run the driver's interpreter unless PYSPARK_PYTHON says
    otherwise: they import this package and confluent-kafka, which the
    interpreter running the audit has. Spark's console progress bar and web UI
    are off (the CLI draws its own progress), and Spark logs errors only.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 -- the audit extra, loaded when an audit runs

    spark = (
        SparkSession.builder.appName(app_name)
        .master(master or DEFAULT_MASTER)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Partitions of the alignment shuffle (one group per source partition). Spark's 200 cost ~10 ms of
        # task start-up each, most of a small audit; adaptive execution still merges small ones.
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.sql.adaptive.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
