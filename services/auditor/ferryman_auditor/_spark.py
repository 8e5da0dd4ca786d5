"""The Spark session an audit runs in, when the caller does not bring one."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The default master: two task slots per core of this machine. A task reads its source range, destination window
#: and offset map one after the other and waits on the brokers meanwhile, so one slot per core left the cores idle:
#: 5 M x 100 B over 8 partitions on 2 cores, warm audits 440-462 k rec/s with local[*], 595-627 k with local[4]
#: (local[8] 587-661 k, more CPU per record). ``--master`` (or FERRYMAN_SPARK_MASTER) runs elsewhere.
DEFAULT_MASTER = f"local[{2 * (os.cpu_count() or 1)}]"


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
