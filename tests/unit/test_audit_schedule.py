"""The audit scheduler's lifecycle with a stand-in audit (ferryman_auditor._schedule; no Kafka, no Spark).

The real scheduler runs as ``ferryman audit schedule`` against real clusters in
tests/integration/test_audit_schedule.py; here each path of its shutdown is forced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from ferryman_auditor import AuditError, AuditReport, AuditScheduler, AuditUsageError
from ferryman_auditor._errors import AuditCancelledError
from ferryman_auditor._schedule import ScheduleOutcome

from tests.helpers.audit import one_partition_report
from tests.helpers.kafka import wait_until

#: Every wait of these tests is on a condition; this is only how long before one fails the test.
_BUDGET_S = 10.0


def _report(run: int, *, missing: int = 0) -> AuditReport:
    return one_partition_report(f"run-{run}", missing=missing)


class _Audits:
    """A stand-in audit: each call is counted and does what ``behave(n, cancel)`` does for the n-th call."""

    def __init__(self, behave: Callable[[int, threading.Event], AuditReport]) -> None:
        self.calls = 0
        self.cancels = 0
        self._behave = behave

    def __call__(self, cancel: threading.Event) -> AuditReport:
        self.calls += 1
        return self._behave(self.calls, cancel)

    def cancel_jobs(self) -> None:
        self.cancels += 1


@contextmanager
def _running(
    audits: _Audits, *, interval_s: float = 3600.0, shutdown_timeout_s: float = 30.0
) -> Iterator[tuple[AuditScheduler, list[ScheduleOutcome]]]:
    """The scheduler running on a thread; on exit it has been stopped and its outcome is in the list.

    The exit asks it to stop (again, if the test did: a second request abandons a run in progress).
    """
    scheduler = AuditScheduler(
        audits, audits.cancel_jobs, flow="f", interval_s=interval_s, shutdown_timeout_s=shutdown_timeout_s
    )
    outcome: list[ScheduleOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(scheduler.run()), daemon=True)
    thread.start()
    try:
        yield scheduler, outcome
    finally:
        scheduler.shutdown()
        thread.join(_BUDGET_S)
        assert not thread.is_alive(), "the scheduler did not stop"


def test_audits_every_interval_until_shutdown_then_stops_between_runs() -> None:
    audits = _Audits(lambda n, _cancel: _report(n))
    with _running(audits, interval_s=0.05) as (_scheduler, outcome):
        wait_until(lambda: audits.calls >= 3, _BUDGET_S, message="three runs")
    done = outcome[0]
    assert done.runs == audits.calls >= 3
    assert (done.violations, done.failures, done.abandoned, done.last_failed, done.usage_error) == (
        0,
        0,
        False,
        False,
        None,
    )


def test_the_first_run_starts_at_once_and_a_wait_ends_at_shutdown() -> None:
    audits = _Audits(lambda n, _cancel: _report(n))
    with _running(audits) as (_scheduler, outcome):  # an hour's interval: only shutdown ends the wait
        wait_until(lambda: audits.calls == 1, _BUDGET_S, message="the first run")
    assert outcome[0].runs == 1


def test_a_run_in_progress_finishes_and_is_stored_when_it_ends_within_the_shutdown_timeout() -> None:
    started, release = threading.Event(), threading.Event()

    def slow(n: int, _cancel: threading.Event) -> AuditReport:
        started.set()
        assert release.wait(_BUDGET_S)
        return _report(n)

    audits = _Audits(slow)
    with _running(audits) as (scheduler, outcome):
        assert started.wait(_BUDGET_S)
        scheduler.shutdown()
        release.set()
        wait_until(lambda: outcome, _BUDGET_S, message="the scheduler's return")  # before a second stop request
    assert (outcome[0].runs, outcome[0].abandoned) == (1, False)
    assert audits.cancels == 0


def _until_cancelled(started: threading.Event) -> Callable[[int, threading.Event], AuditReport]:
    def run(_n: int, cancel: threading.Event) -> AuditReport:
        started.set()
        assert cancel.wait(_BUDGET_S)
        raise AuditCancelledError("cancelled")

    return run


def test_a_run_that_outlasts_the_shutdown_timeout_is_cancelled_and_abandoned() -> None:
    started = threading.Event()
    audits = _Audits(_until_cancelled(started))
    with _running(audits, shutdown_timeout_s=0.1) as (scheduler, outcome):
        assert started.wait(_BUDGET_S)
        scheduler.shutdown()
        wait_until(lambda: outcome, _BUDGET_S, message="the scheduler's return")
    assert (outcome[0].runs, outcome[0].abandoned) == (0, True)
    assert audits.cancels >= 1  # its Spark jobs were cancelled


def test_a_second_stop_request_abandons_the_run_at_once() -> None:
    started = threading.Event()
    audits = _Audits(_until_cancelled(started))
    with _running(audits) as (scheduler, outcome):  # 30 s to finish, unless asked twice
        assert started.wait(_BUDGET_S)
        scheduler.shutdown()
        scheduler.shutdown()
        wait_until(lambda: outcome, _BUDGET_S, message="the scheduler's return")
    assert outcome[0].abandoned


def test_a_run_that_cannot_run_is_retried_at_the_next_interval() -> None:
    def flaky(n: int, _cancel: threading.Event) -> AuditReport:
        if n == 1:
            raise AuditError("cluster unreachable")
        if n == 2:
            raise RuntimeError("an unexpected error")
        return _report(n)

    audits = _Audits(flaky)
    with _running(audits, interval_s=0.05) as (_scheduler, outcome):
        wait_until(lambda: audits.calls >= 3, _BUDGET_S, message="a run after two failures")
    assert outcome[0].failures == 2
    assert outcome[0].runs == audits.calls - 2
    assert not outcome[0].last_failed


def test_the_last_run_failing_is_reported() -> None:
    audits = _Audits(lambda _n, _cancel: (_ for _ in ()).throw(AuditError("down")))
    with _running(audits) as (_scheduler, outcome):
        wait_until(lambda: audits.calls == 1, _BUDGET_S, message="the first run")
    assert (outcome[0].runs, outcome[0].failures, outcome[0].last_failed) == (0, 1, True)


def test_violations_are_counted_and_runs_go_on() -> None:
    audits = _Audits(lambda n, _cancel: _report(n, missing=1 if n == 1 else 0))
    with _running(audits, interval_s=0.05) as (_scheduler, outcome):
        wait_until(lambda: audits.calls >= 2, _BUDGET_S, message="a run after the violation")
    assert outcome[0].violations == 1
    assert outcome[0].runs == audits.calls


def test_a_usage_error_stops_the_scheduler_on_its_own() -> None:
    audits = _Audits(lambda _n, _cancel: (_ for _ in ()).throw(AuditUsageError("no topic x")))
    scheduler = AuditScheduler(audits, audits.cancel_jobs, flow="f", interval_s=0.01, shutdown_timeout_s=1)
    outcome = scheduler.run()  # returns without shutdown()
    assert outcome.usage_error == "no topic x"
    assert audits.calls == 1


def test_a_failed_run_with_the_spark_session_lost_stops_the_scheduler_on_its_own() -> None:
    audits = _Audits(lambda _n, _cancel: (_ for _ in ()).throw(RuntimeError("Answer from Java side is empty")))
    asked: list[int] = []

    def lost() -> str:
        asked.append(audits.calls)
        return "its JVM does not answer"

    scheduler = AuditScheduler(
        audits, audits.cancel_jobs, flow="f", interval_s=0.01, shutdown_timeout_s=1, session_lost=lost
    )
    outcome = scheduler.run()  # returns without shutdown()
    assert (outcome.session_lost, outcome.failures, outcome.last_failed) == ("its JVM does not answer", 1, True)
    assert audits.calls == 1
    assert asked == [1]  # asked once the run failed, not before


def test_the_session_is_asked_only_after_a_failure_and_a_live_one_lets_runs_go_on() -> None:
    asked: list[int] = []
    audits = _Audits(lambda n, _cancel: _report(n) if n > 1 else (_ for _ in ()).throw(AuditError("down")))

    def alive() -> None:
        asked.append(audits.calls)

    scheduler = AuditScheduler(
        audits, audits.cancel_jobs, flow="f", interval_s=0.01, shutdown_timeout_s=1, session_lost=alive
    )
    outcome: list[ScheduleOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(scheduler.run()), daemon=True)
    thread.start()
    wait_until(lambda: audits.calls >= 3, _BUDGET_S, message="runs after the failure")
    scheduler.shutdown()
    thread.join(_BUDGET_S)
    assert asked == [1]
    assert outcome[0].session_lost is None and outcome[0].failures == 1 and outcome[0].runs >= 2


@pytest.mark.parametrize("lost", [None, "its context was stopped"])
def test_a_run_failed_elsewhere_stops_the_scheduler_only_when_the_session_is_lost(lost: str | None) -> None:
    audits = _Audits(lambda n, _cancel: _report(n))
    scheduler = AuditScheduler(
        audits, audits.cancel_jobs, flow="f", interval_s=3600, shutdown_timeout_s=1, session_lost=lambda: lost
    )
    outcome: list[ScheduleOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(scheduler.run()), daemon=True)
    thread.start()
    wait_until(lambda: audits.calls == 1, _BUDGET_S, message="the first run")
    scheduler.run_failed_elsewhere()  # as a run started over the API that failed
    thread.join(0.5 if lost is None else _BUDGET_S)
    assert thread.is_alive() == (lost is None)  # a live session: the scheduler waits for its next run
    scheduler.shutdown()
    thread.join(_BUDGET_S)
    assert (outcome[0].session_lost, outcome[0].last_failed) == (lost, lost is not None)


def test_a_stop_requested_before_run_means_no_audit() -> None:
    audits = _Audits(lambda n, _cancel: _report(n))
    scheduler = AuditScheduler(audits, audits.cancel_jobs, flow="f", interval_s=1, shutdown_timeout_s=1)
    scheduler.shutdown()  # as a SIGTERM during Spark's start-up
    assert scheduler.run().runs == 0
    assert audits.calls == 0


@pytest.mark.parametrize("signals", [1, 2])
def test_stop_signals_reach_the_target_exactly_once_each(signals: int) -> None:
    from ferryman.cli._common import StopSignals  # noqa: PLC0415

    got: list[int] = []
    stop = StopSignals()
    for _ in range(signals):  # before the target exists (Spark still starting)
        stop._on_signal(15)
    stop.forward_to(lambda: got.append(1))
    assert len(got) == signals
    stop._on_signal(15)
    assert len(got) == signals + 1


@pytest.mark.parametrize(
    ("violations", "last_failed", "status"),
    [(0, False, 0), (1, False, 1), (1, True, 1), (0, True, 3)],
    ids=["clean", "violation", "violation-then-failure", "last-failed"],
)
def test_the_schedule_exit_status_ranks_a_violation_first(violations: int, last_failed: bool, status: int) -> None:
    from ferryman.cli._audit import schedule_exit_status  # noqa: PLC0415

    outcome = ScheduleOutcome(
        runs=3,
        violations=violations,
        failures=int(last_failed),
        abandoned=False,
        last_failed=last_failed,
        usage_error=None,
    )
    assert schedule_exit_status(outcome) == status
