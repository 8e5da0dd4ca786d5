"""The audit scheduler: one flow audited every interval, since the last verified position, until stopped.

Lifecycle: ``run()`` blocks until ``shutdown()``, which is safe from a signal
handler (it only puts an item on a ``queue.SimpleQueue``, whose ``put`` is
reentrant; the thread that runs ``run()`` waits on nothing else). On shutdown:

1. a wait between runs ends at once;
2. a run in progress gets ``shutdown_timeout_s`` to finish and store its results;
3. after that (or at a second shutdown request) the run is abandoned: it is
   told to cancel (``run_audit``'s ``cancel``), and its Spark jobs are cancelled
   every ``_CANCEL_RETRY_S`` until it returns, for at most ``_ABANDON_BUDGET_S``.
   Nothing of an abandoned run is stored, and since the checkpoint is written
   last, the next run checks that range again.

Each run is done on a worker thread; its verdict (or why it could not run) is
logged. A run that cannot run (a cluster down, a failed job) is retried at the
next interval; a run refused as bad usage (the flow no longer has a topic it
was asked for) stops the scheduler, since repeating it cannot help, and so does
a failed run whose Spark session is lost (its JVM gone or its context stopped:
PySpark cannot start another in the process). Restarted, the scheduler resumes
from the last verified position.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ferryman.errors import FerrymanError

from ferryman_auditor._audit import AuditSettings, run_audit
from ferryman_auditor._errors import AuditCancelledError, AuditUsageError
from ferryman_auditor._plan import AuditRange
from ferryman_auditor._report import EXACTLY_ONCE, AuditReport
from ferryman_auditor._spark import session_lost

if TYPE_CHECKING:
    from ferryman.config import FerrymanConfig, FlowConfig
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)

#: While a run is being abandoned, its Spark jobs are cancelled again this often: with adaptive
#: execution one audit runs several jobs in turn, and a cancel reaches only those already submitted.
_CANCEL_RETRY_S = 1.0
#: How long an abandoned run may take to return once cancelled. Cancelled Spark tasks end within a
#: second or two; a run in its planning reads ends within one Kafka request budget, which this does
#: not wait out in full (the worker is a daemon thread: the process may end under it).
_ABANDON_BUDGET_S = 10.0

#: One audit: given the cancel event, audit the flow since the last verified position and return the report.
Audit = Callable[[threading.Event], AuditReport]


class _Event(Enum):
    STOP = "stop"
    DONE = "done"


@dataclass(frozen=True)
class ScheduleOutcome:
    """What a scheduler did before it stopped."""

    runs: int
    """Runs that completed and stored their results."""
    violations: int
    """Completed runs whose verdict was VIOLATED."""
    failures: int
    """Runs that could not run (a cluster unreachable, a failed job)."""
    abandoned: bool
    """The last run was abandoned on shutdown (nothing of it stored)."""
    last_failed: bool
    """The last run attempted could not run."""
    usage_error: str | None
    """Why the scheduler stopped on its own: a run was refused as bad usage (None: it was asked to stop)."""
    session_lost: str | None = None
    """Why the scheduler stopped on its own: a run failed and the Spark session is lost (its JVM, its context)."""


@dataclass
class _Tally:
    runs: int = 0
    violations: int = 0
    failures: int = 0
    abandoned: bool = False
    last_failed: bool = False
    usage_error: str | None = None
    session_lost: str | None = None

    def outcome(self) -> ScheduleOutcome:
        return ScheduleOutcome(
            self.runs,
            self.violations,
            self.failures,
            self.abandoned,
            self.last_failed,
            self.usage_error,
            self.session_lost,
        )

    def stopped_on_its_own(self) -> bool:
        return self.usage_error is not None or self.session_lost is not None


class AuditScheduler:
    """Runs ``audit`` every ``interval_s`` (start to start) until ``shutdown()``.

    Args:
        audit: one incremental audit of the flow (``run_audit`` with a since-last range).
        cancel_jobs: cancels the Spark jobs the audit has running (``SparkContext.cancelAllJobs``).
        flow: the flow's name, for the log.
        interval_s: time from the start of one run to the start of the next.
        shutdown_timeout_s: how long a run in progress may go on after shutdown() before it is abandoned.
        session_lost: asked after a failed run: why the session can run no more audits, or None
            (``session_lost`` of ``_spark``); the scheduler then stops.
    """

    def __init__(
        self,
        audit: Audit,
        cancel_jobs: Callable[[], None],
        *,
        flow: str,
        interval_s: float,
        shutdown_timeout_s: float,
        session_lost: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._audit = audit
        self._session_lost = session_lost
        self._cancel_jobs = cancel_jobs
        self._flow = flow
        self._interval_s = interval_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self._tally = _Tally()

    def shutdown(self) -> None:
        """Ask run() to stop (a second call abandons a run in progress at once). Safe from signal handlers."""
        self._events.put(_Event.STOP)

    def run_failed_elsewhere(self) -> None:
        """A run on the same session failed outside the schedule (one started over the API).

        If the session is lost, the scheduler stops as after a failed run of its own (a run in
        progress gets the shutdown timeout, and fails on the lost session anyway). Any thread.
        """
        if (lost := self._session_lost()) is None:
            return
        self._tally.session_lost = lost
        self._tally.last_failed = True
        _log.error("an audit run on the session failed and Spark's session is lost: %s; stopping", lost)
        self._events.put(_Event.STOP)

    def run(self) -> ScheduleOutcome:
        """Audit every interval until shutdown(), a usage error or a lost session; return what was done."""
        _log.info(
            "auditing flow %s every %g s (a run in progress gets %g s to finish on SIGTERM)",
            self._flow,
            self._interval_s,
            self._shutdown_timeout_s,
        )
        next_at = time.monotonic()
        while not self._stop_before(next_at):
            began = time.monotonic()
            if self._run_once() or self._tally.stopped_on_its_own():
                break
            next_at = began + self._interval_s
            _log.info("next audit of flow %s in %.1f s", self._flow, max(0.0, next_at - time.monotonic()))
        _log.info("audit scheduler of flow %s stopped after %d run(s)", self._flow, self._tally.runs)
        return self._tally.outcome()

    def _stop_before(self, at: float) -> bool:
        """Wait until ``at``; True when shutdown() came first (checked at least once, even when ``at`` is past)."""
        while True:
            try:
                event = self._events.get(timeout=max(0.0, at - time.monotonic()))
            except queue.Empty:
                return False
            if event is _Event.STOP:
                return True
            # Nothing else can be pending here (_run_once takes each run's DONE); ignored if it were.

    def _run_once(self) -> bool:
        """One run on a worker thread; True when shutdown() was asked meanwhile (the scheduler then stops)."""
        cancel = threading.Event()
        worker = threading.Thread(target=self._work, args=(cancel,), name="ferryman-audit-run", daemon=True)
        worker.start()
        if self._events.get() is _Event.DONE:
            return False
        if self._shutdown_timeout_s > 0:
            _log.info("stopping: the run in progress gets %g s to finish", self._shutdown_timeout_s)
            event = self._next_event(time.monotonic() + self._shutdown_timeout_s)
            if event is _Event.DONE:
                return True
        _log.warning("stopping: abandoning the run in progress (nothing of it is stored)")
        cancel.set()
        deadline = time.monotonic() + _ABANDON_BUDGET_S
        while time.monotonic() < deadline:
            try:
                self._cancel_jobs()
            except Exception:  # a Spark that cannot cancel (stopping, gone): the deadline still holds
                _log.exception("cancelling the audit's Spark jobs failed")
            if self._next_event(min(deadline, time.monotonic() + _CANCEL_RETRY_S)) is _Event.DONE:
                return True
        _log.error("the abandoned run did not return within %g s; stopping without it", _ABANDON_BUDGET_S)
        self._tally.abandoned = True
        return True

    def _next_event(self, deadline: float) -> _Event | None:
        """The next DONE, or STOP (a second shutdown request: stop waiting), or None at the deadline."""
        try:
            return self._events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def _work(self, cancel: threading.Event) -> None:
        """The worker: one audit, its outcome logged and counted, then DONE."""
        started = time.monotonic()
        tally = self._tally
        try:
            report = self._audit(cancel)
        except AuditCancelledError:
            tally.abandoned = True
            _log.warning("audit of flow %s abandoned on shutdown: nothing of it was stored", self._flow)
        except AuditUsageError as exc:
            tally.usage_error = str(exc)
            _log.error("audit of flow %s refused, stopping: %s", self._flow, exc)
        except Exception as exc:  # a long-running scheduler outlives one run's error; the next run retries
            tally.failures += 1
            tally.last_failed = True
            if (lost := self._session_lost()) is not None:
                tally.session_lost = lost
                _log.error(
                    "audit of flow %s could not run and Spark's session is lost: %s; stopping (restarted, "
                    "the scheduler resumes from the last verified position)",
                    self._flow,
                    lost,
                )
            elif isinstance(exc, FerrymanError):
                _log.error("audit of flow %s could not run (retried at the next interval): %s", self._flow, exc)
            else:
                _log.exception("audit of flow %s failed unexpectedly (retried at the next interval)", self._flow)
        else:
            tally.runs += 1
            tally.last_failed = False
            if report.verdict != EXACTLY_ONCE:
                tally.violations += 1
            _log_verdict(report, time.monotonic() - started)
        finally:
            self._events.put(_Event.DONE)


def flow_scheduler(
    spark: SparkSession,
    config: FerrymanConfig,
    flow: FlowConfig,
    *,
    topics: tuple[str, ...] | None = None,
    settings: AuditSettings | None = None,
    interval_s: float | None = None,
    shutdown_timeout_s: float | None = None,
    session_lock: threading.Lock | None = None,
) -> AuditScheduler:
    """A scheduler of since-last audits of flow in spark (which it then owns: it cancels its jobs on shutdown).

    ``interval_s`` and ``shutdown_timeout_s`` default to the configuration's ``auditor`` section.
    ``session_lock`` is held during each run, so that runs started over the API (`AuditRuns`) and
    scheduled runs take turns on the session.
    """
    lock = session_lock or threading.Lock()

    def audit(cancel: threading.Event) -> AuditReport:
        with lock:
            return run_audit(spark, config, flow, AuditRange(topics=topics), settings=settings, cancel=cancel)

    return AuditScheduler(
        audit,
        spark.sparkContext.cancelAllJobs,
        flow=flow.name,
        interval_s=config.auditor.interval_s if interval_s is None else interval_s,
        shutdown_timeout_s=config.auditor.shutdown_timeout_s if shutdown_timeout_s is None else shutdown_timeout_s,
        session_lost=lambda: session_lost(spark),
    )


def _log_verdict(report: AuditReport, seconds: float) -> None:
    """One line per run (INFO when exactly once, ERROR with the faulty partitions otherwise)."""
    totals = report.totals()
    counts = ", ".join(f"{k} {v}" for k, v in totals.items())
    line = (
        f"audit {report.run_id} of flow {report.flow}: {report.verdict} "
        f"({len(report.partitions)} partitions; {counts}) in {seconds:.1f} s"
    )
    if report.verdict == EXACTLY_ONCE:
        _log.info("%s", line)
        return
    faulty = [
        f"{p.topic}-{p.partition} (missing {p.missing}, duplicated {p.duplicated}, reordered {p.reordered}, "
        f"altered {p.altered}, unexpected {p.unexpected}{'' if p.alignments_agree else ', alignments disagree'})"
        for p in report.partitions
        if p.verdict != EXACTLY_ONCE
    ]
    _log.error("%s; faulty: %s", line, "; ".join(faulty))
