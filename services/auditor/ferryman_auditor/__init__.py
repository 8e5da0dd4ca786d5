"""Ferryman's auditor: checks after the fact that a flow copied its source exactly once.

An audit reads a range of each source partition and the matching window of
its copy with the ``ferryman-kafka`` Spark data source (``kafka_source``),
aligns them twice (through the offset map, and by content alone), and reports
per partition what is missing, duplicated, reordered, altered, unexpected or
no longer verifiable. Results go to the flow's audit topic and to Parquet.
``AuditScheduler`` repeats a flow's incremental audit every interval; ``serve_audit_api``
serves ``AuditService`` beside it (runs started over gRPC, ``AuditRuns``, on the same session).
"""

from ferryman_auditor._api import AUDIT_SERVICE, AuditServicer, serve_audit_api
from ferryman_auditor._audit import AuditSettings, new_run_id, run_audit
from ferryman_auditor._errors import AuditCancelledError, AuditError, AuditUsageError
from ferryman_auditor._plan import AuditRange
from ferryman_auditor._report import EXACTLY_ONCE, VIOLATED, AuditReport, PartitionReport, summary_of
from ferryman_auditor._runs import AuditRuns, StartedRun
from ferryman_auditor._schedule import AuditScheduler, ScheduleOutcome, flow_scheduler
from ferryman_auditor._spark import spark_session, stop_session
from ferryman_auditor._store import AuditStore, Checkpoint, StoredAudits

__all__ = [
    "AUDIT_SERVICE",
    "EXACTLY_ONCE",
    "VIOLATED",
    "AuditCancelledError",
    "AuditError",
    "AuditRange",
    "AuditReport",
    "AuditRuns",
    "AuditScheduler",
    "AuditServicer",
    "AuditSettings",
    "AuditStore",
    "AuditUsageError",
    "Checkpoint",
    "PartitionReport",
    "ScheduleOutcome",
    "StartedRun",
    "StoredAudits",
    "flow_scheduler",
    "new_run_id",
    "run_audit",
    "serve_audit_api",
    "spark_session",
    "stop_session",
    "summary_of",
]
