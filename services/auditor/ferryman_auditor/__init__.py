"""Ferryman's auditor: checks after the fact that a flow copied its source exactly once.

An audit reads a range of each source partition and the matching window of
its copy with the ``ferryman-kafka`` Spark data source (``kafka_source``),
aligns them twice (through the offset map, and by content alone), and reports
per partition what is missing, duplicated, reordered, altered, unexpected or
no longer verifiable. Results go to the flow's audit topic and to Parquet.
``AuditScheduler`` repeats a flow's incremental audit every interval.
"""

from ferryman_auditor._audit import AuditSettings, new_run_id, run_audit
from ferryman_auditor._errors import AuditCancelledError, AuditError, AuditUsageError
from ferryman_auditor._plan import AuditRange
from ferryman_auditor._report import EXACTLY_ONCE, VIOLATED, AuditReport, PartitionReport, summary_of
from ferryman_auditor._schedule import AuditScheduler, ScheduleOutcome, flow_scheduler
from ferryman_auditor._spark import spark_session
from ferryman_auditor._store import AuditStore, Checkpoint, StoredAudits

__all__ = [
    "EXACTLY_ONCE",
    "VIOLATED",
    "AuditCancelledError",
    "AuditError",
    "AuditRange",
    "AuditReport",
    "AuditScheduler",
    "AuditSettings",
    "AuditStore",
    "AuditUsageError",
    "Checkpoint",
    "PartitionReport",
    "ScheduleOutcome",
    "StoredAudits",
    "flow_scheduler",
    "new_run_id",
    "run_audit",
    "spark_session",
    "summary_of",
]
