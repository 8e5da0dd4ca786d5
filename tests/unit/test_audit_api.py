"""The audit API's pure parts: ranges checked field by field, reports converted, started runs one at a time.

The API itself (server, client, CLI) runs against real brokers and Spark in tests/integration/test_audit_api.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from ferryman.admin import audit_range
from ferryman.errors import BusyError, ConfigError
from ferryman.v1 import audit_pb2
from ferryman_auditor import AuditRange, AuditReport, AuditRuns
from ferryman_auditor._convert import range_from_proto, range_to_proto, run_of_report
from ferryman_auditor._errors import AuditError
from ferryman_auditor._runs import FAILED, FINISHED

from tests.helpers.audit import load, one_partition_report
from tests.helpers.kafka import wait_until
from tests.helpers.services import flow_config


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (audit_range(start_offsets={0: -1}), "range.offsets.start_offsets[0]"),
        (audit_range(end_offsets={-2: 5}), "range.offsets.end_offsets[-2]"),
        (audit_range(start_offsets={1: 9}, end_offsets={1: 3}), "range.offsets.end_offsets[1]"),
        (audit_range(start_ms=-5), "range.time_window.start_ms"),
        (audit_range(start_ms=10, end_ms=9), "range.time_window.end_ms"),
        (audit_range(topics=("t", "")), "range.topics[1]"),
    ],
)
def test_a_bad_range_is_refused_naming_its_field(message: audit_pb2.AuditRange, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        range_from_proto(message)


def test_the_client_refuses_offsets_and_a_window_together() -> None:
    with pytest.raises(ConfigError, match="not both"):
        audit_range(start_offsets={0: 1}, start_ms=5)


@pytest.mark.parametrize(
    "wanted",
    [
        AuditRange(),
        AuditRange(topics=("a", "b")),
        AuditRange(kind="offsets", start_offsets={0: 5}, end_offsets={0: 9, 1: 4}),
        AuditRange(kind="offsets", end_offsets={2: 7}),
        AuditRange(kind="time", start_ms=0, end_ms=10),
        AuditRange(kind="time", start_ms=1000, topics=("a",)),
    ],
)
def test_ranges_travel_both_ways(wanted: AuditRange) -> None:
    message = range_to_proto(wanted.describe())
    assert range_from_proto(message) == wanted


def _report(run_id: str = "r1", missing: int = 0) -> AuditReport:
    return one_partition_report(run_id, missing=missing, unverifiable=2)


def test_a_report_converts_with_its_verdicts_and_counts() -> None:
    run = run_of_report(_report(missing=1))
    assert (run.state, run.verdict, run.partition_count) == (
        audit_pb2.AUDIT_STATE_FINISHED,
        audit_pb2.VERDICT_VIOLATED,
        1,
    )
    p = run.partitions[0]
    assert (p.counts.missing, p.counts.unverifiable, p.verdict) == (1, 2, audit_pb2.VERDICT_VIOLATED)
    assert [(r.from_offset, r.to_offset) for r in p.unverifiable_ranges] == [(0, 2)]
    assert not p.HasField("offset_map_counts")
    assert not run_of_report(_report(), with_partitions=False).partitions


def _runs(runner: Any) -> AuditRuns:
    unused = "127.0.0.1:9"  # never connected to: the runner stands in for the audit
    config = load(flow_config(source_bootstrap=unused, destination_bootstrap=unused, flow="f", topics=["t"]))
    return AuditRuns(spark=None, config=config, runner=runner)  # type: ignore[arg-type]  # never touched


def test_one_started_run_at_a_time_then_the_next() -> None:
    release = threading.Event()

    def runner(*_args: Any, run_id: str, progress: Any, **_kwargs: Any) -> AuditReport:
        progress("planning")
        release.wait(10)
        return _report(run_id)

    runs = _runs(runner)
    flow = runs.config.flows[0]
    first = runs.start(flow, AuditRange())
    with pytest.raises(BusyError) as busy:
        runs.start(flow, AuditRange())
    assert busy.value.details["run_id"] == first.run_id
    release.set()
    wait_until(lambda: first.done, 10, 0.01, "the first run")
    assert first.state == FINISHED and first.report is not None and first.report.run_id == first.run_id
    second = runs.start(flow, AuditRange())  # the first is done: accepted
    wait_until(lambda: second.done, 10, 0.01, "the second run")
    assert [r.run_id for r in runs.of_flow("f")] == [first.run_id, second.run_id]


def test_a_run_that_cannot_run_is_failed_with_its_reason_and_frees_the_slot() -> None:
    def runner(*_args: Any, **_kwargs: Any) -> AuditReport:
        raise AuditError("the destination is unreachable")

    runs = _runs(runner)
    flow = runs.config.flows[0]
    run = runs.start(flow, AuditRange())
    wait_until(lambda: run.done, 10, 0.01, "the run")
    assert (run.state, run.error) == (FAILED, "the destination is unreachable")
    runs.start(flow, AuditRange())  # not busy


def test_a_started_run_waits_for_the_session_lock() -> None:
    ran = threading.Event()

    def runner(*_args: Any, run_id: str, **_kwargs: Any) -> AuditReport:
        ran.set()
        return _report(run_id)

    runs = _runs(runner)
    with runs.session_lock:  # a scheduled run holds the session
        run = runs.start(runs.config.flows[0], AuditRange())
        assert not ran.wait(0.2) and run.state == "QUEUED"
    wait_until(lambda: run.done, 10, 0.01, "the run")
    assert run.state == FINISHED


class _Context:
    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancelAllJobs(self) -> None:  # noqa: N802 -- SparkContext's name
        self.cancelled.set()


class _Spark:
    def __init__(self) -> None:
        self.sparkContext = _Context()


def test_shutdown_lets_a_run_finish_within_its_timeout_then_cancels_it_and_its_jobs() -> None:
    spark = _Spark()

    def runner(*_args: Any, cancel: threading.Event, **_kwargs: Any) -> AuditReport:
        spark.sparkContext.cancelled.wait(10)  # a Spark job, until its jobs are cancelled
        assert cancel.is_set()
        raise AuditError("the audit job was cancelled")

    runs = _runs(runner)
    runs.spark = spark  # type: ignore[assignment]
    run = runs.start(runs.config.flows[0], AuditRange())
    runs.shutdown(0.1)
    assert run.done and run.state == FAILED
    assert spark.sparkContext.cancelled.is_set()
