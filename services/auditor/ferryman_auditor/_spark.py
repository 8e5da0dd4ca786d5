"""The Spark session an audit runs in, when the caller does not bring one."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING

from ferryman_auditor._errors import AuditError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)

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

    Raises:
        AuditError: Spark did not start (no Java, a bad master URL, a cluster that refused the application):
            an audit that could not run, never mistaken for a finding.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 -- the audit extra, loaded when an audit runs

    try:
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
    except Exception as exc:  # PySpark raises its own classes (the JVM did not start, a bad master URL)
        raise AuditError(f"Spark did not start: {' '.join(str(exc).split()) or type(exc).__name__}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def session_lost(spark: SparkSession) -> str | None:
    """Why ``spark`` can run no more jobs (its JVM gone, its context stopped), or None while it can.

    PySpark keeps the gateway to its JVM in class state and cannot start another
    in the same process once that JVM is gone (killed, say, by the OOM killer), and a
    context a cluster master stopped stays stopped: either way every later audit would
    fail, so the scheduler stops on it and leaves the restart to its supervisor.
    """
    from py4j.protocol import Py4JError  # noqa: PLC0415 -- PySpark's own dependency, loaded with it

    try:
        jsc = spark.sparkContext._jsc  # None once stopped from Python
        if jsc is None:
            return "its context was stopped"
        if jsc.sc().isStopped():
            return "its context was stopped (by Spark: a cluster master, a fatal error)"
    except (Py4JError, OSError) as exc:
        return f"its JVM does not answer ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    return None


def stop_session(spark: SparkSession) -> None:
    """Stop ``spark``; one whose JVM is gone is only let go (stopping asks that JVM, which raises, and warns)."""
    from py4j.protocol import Py4JError  # noqa: PLC0415 -- PySpark's own dependency, loaded with it

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "Unable to cleanly shutdown Spark JVM process"
            spark.stop()
    except (Py4JError, OSError) as exc:
        _log.warning("Spark's session did not stop cleanly (its JVM is gone): %s", type(exc).__name__)
