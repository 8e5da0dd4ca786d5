"""Audit runs started over the API: one at a time, on the scheduler's Spark session, followed as they go.

The scheduler and these runs share one lock on the session (`AuditRuns.session_lock`): a run
started while a scheduled run holds it waits, QUEUED, and the next scheduled run waits for it.
Only one started run may be queued or running at a time; another start meanwhile is refused
(`BusyError`, FAILED_PRECONDITION) rather than queued behind it, so that a caller never waits
an unbounded time for runs it did not start, and a retried start cannot pile up duplicate runs.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ferryman.errors import BusyError, FerrymanError

from ferryman_auditor._audit import AuditSettings, new_run_id, run_audit
from ferryman_auditor._plan import AuditRange
from ferryman_auditor._report import AuditReport

if TYPE_CHECKING:
    from ferryman.config import FerrymanConfig, FlowConfig
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)

#: Started runs remembered in memory (their results are in the audit topic; this keeps the
#: failed ones, which are stored nowhere, readable for a while without growing for ever).
_KEPT_RUNS = 100

#: How long a cancelled run may take to return at shutdown (as the scheduler's abandon budget: cancelled
#: Spark tasks end within a second or two; planning reads within one Kafka budget, not waited out in full).
_ABANDON_BUDGET_S = 10.0

QUEUED, RUNNING, FINISHED, FAILED = "QUEUED", "RUNNING", "FINISHED", "FAILED"


@dataclass
class StartedRun:
    """One run started over the API; its fields change under `AuditRuns`' condition."""

    run_id: str
    flow: str
    range: AuditRange
    state: str = QUEUED
    step: str = "waiting for the Spark session"
    started_at_ms: int = 0
    report: AuditReport | None = None
    error: str = ""
    version: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        """FINISHED or FAILED."""
        return self.state in (FINISHED, FAILED)


#: Runs one audit: (spark, config, flow, range, run id, progress, cancel) -> report.
Runner = Callable[..., AuditReport]


class AuditRuns:
    """The runs started over the API on one Spark session.

    Args:
        spark: the session (the scheduler's).
        config: the configuration the flows come from.
        settings: audit settings (reports directory, Kafka budget).
        session_lock: the lock every user of the session holds while it audits (new one by default).
        on_failure: called (on the run's thread) after a started run failed: the scheduler's
            ``run_failed_elsewhere``, which stops it if the session is lost.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: FerrymanConfig,
        *,
        settings: AuditSettings | None = None,
        session_lock: threading.Lock | None = None,
        runner: Runner = run_audit,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.settings = settings or AuditSettings()
        self.session_lock = session_lock or threading.Lock()
        self._runner = runner
        self._on_failure = on_failure
        self._changed = threading.Condition()
        self._runs: OrderedDict[str, StartedRun] = OrderedDict()
        self._active: StartedRun | None = None

    def start(self, flow: FlowConfig, audit_range: AuditRange) -> StartedRun:
        """Queue a run of flow over audit_range on a worker thread; return it (QUEUED).

        Raises:
            BusyError: a started run is still queued or running (its id in ``details["run_id"]``).
        """
        with self._changed:
            if self._active is not None:
                active = self._active
                raise BusyError(
                    f"audit {active.run_id} of flow {active.flow} is {active.state.lower()}; "
                    "start another once it is done (follow it with FollowAudit)",
                    {"run_id": active.run_id, "flow": active.flow},
                )
            run = StartedRun(run_id=new_run_id(), flow=flow.name, range=audit_range)
            self._active = run
            self._runs[run.run_id] = run
            while len(self._runs) > _KEPT_RUNS:
                self._runs.popitem(last=False)
        threading.Thread(target=self._work, args=(run, flow), name=f"audit-api-{run.run_id}", daemon=True).start()
        return run

    def get(self, run_id: str) -> StartedRun | None:
        """A run started here (None: not started here, or long forgotten)."""
        with self._changed:
            return self._runs.get(run_id)

    def of_flow(self, flow: str) -> list[StartedRun]:
        """The runs of flow started here, oldest first."""
        with self._changed:
            return [r for r in self._runs.values() if r.flow == flow]

    def wait_change(self, run: StartedRun, seen: int, timeout_s: float) -> int:
        """Wait until run's version passes seen (or timeout_s); return its version."""
        with self._changed:
            self._changed.wait_for(lambda: run.version != seen, timeout=timeout_s)
            return run.version

    def shutdown(self, timeout_s: float) -> None:
        """Let a started run in progress finish within timeout_s, then cancel it (nothing of it stored).

        As the scheduler treats its own run on SIGTERM: cancelled, the run's Spark jobs are cancelled
        too, and it is waited for at most `_ABANDON_BUDGET_S` more. Idempotent.
        """
        with self._changed:
            if self._changed.wait_for(lambda: self._active is None, timeout=timeout_s):
                return
            active = self._active
        if active is None:
            return
        _log.warning("stopping: abandoning audit %s started over the API (nothing of it is stored)", active.run_id)
        active.cancel.set()
        try:
            self.spark.sparkContext.cancelAllJobs()
        except Exception:  # a Spark that cannot cancel (stopping, gone): the budget still holds
            _log.exception("cancelling the Spark jobs of audit %s failed", active.run_id)
        with self._changed:
            self._changed.wait_for(lambda: self._active is None, timeout=_ABANDON_BUDGET_S)

    def _update(self, run: StartedRun, **changes: object) -> None:
        with self._changed:
            for name, value in changes.items():
                setattr(run, name, value)
            run.version += 1
            if run.done and self._active is run:
                self._active = None
            self._changed.notify_all()

    def _work(self, run: StartedRun, flow: FlowConfig) -> None:
        try:
            with self.session_lock:
                if run.cancel.is_set():
                    raise FerrymanError("cancelled: the scheduler is stopping")
                self._update(run, state=RUNNING, step="starting")
                report = self._runner(
                    self.spark,
                    self.config,
                    flow,
                    run.range,
                    settings=self.settings,
                    progress=lambda step: self._update(run, step=step),
                    cancel=run.cancel,
                    run_id=run.run_id,
                )
        except Exception as exc:  # a run's failure is its result, reported to whoever follows it
            if not isinstance(exc, FerrymanError):
                _log.exception("audit %s of flow %s failed unexpectedly", run.run_id, run.flow)
            self._update(run, state=FAILED, step="failed", error=str(exc) or type(exc).__name__)
            _log.error("audit %s of flow %s (started over the API) could not run: %s", run.run_id, run.flow, exc)
            self._on_failure()
            return
        self._update(run, state=FINISHED, step="done", report=report, started_at_ms=report.started_at_ms)
        _log.info("audit %s of flow %s (started over the API): %s", run.run_id, run.flow, report.verdict)
