"""``ferryman audit schedule`` as a process on real clusters: runs every interval, incrementally, stops on SIGTERM.

The scheduler is started the way an operator starts it, next to a running flow
(wrapper and deduper as processes) or a copy the test planted a fault in, and
observed only from outside: ``ferryman audit list --output json``, its log and
its exit status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Producer
from ferryman_local import reserve_port

from tests.helpers.audit import audit_config, copy_topic, produce_copy, write_audit_config
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import BIN, flow_config, running_flow

pytestmark = pytest.mark.integration

PARTITIONS = 2
FIRST = 300  # per partition, before the scheduler starts
MORE = 50  # per partition, while it runs
#: A run here takes a few seconds (local[1]); the first also pays Spark's start and its Python workers' (~15-30 s
#: on 2 cores; 2 min seen with other suites running real brokers beside it).
_RUNS_BUDGET_S = 300.0
#: SIGTERM to exit: the run in progress finishes (seconds), then Spark stops.
_STOP_BUDGET_S = 90.0


def _ferryman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ferryman"), *args], capture_output=True, text=True, timeout=120, check=False)


#: How often the tests ask ``audit list`` (a process of its own, ~1 CPU s): less often, it takes less of the 2 cores
#: the scheduler runs on.
_POLL_S = 2.0


def _runs(config: Path) -> list[dict[str, Any]]:
    listed = _ferryman("audit", "list", "--config", str(config), "--output", "json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    runs: list[dict[str, Any]] = json.loads(listed.stdout)
    return runs


def _at_least(n: int, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return runs if len(runs) >= n else []


@contextmanager
def _scheduler(config: Path, log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``ferryman audit schedule`` with its stderr in log; killed if the test leaves it running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "ferryman"), "audit", "schedule", "--config", str(config), "--master", "local[1]", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the signals the test sends, and only those
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _setup(
    source: KafkaCluster, destination: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> tuple[str, str, Path]:
    topic, dest = unique_name("scheduled"), unique_name("scheduled-copy")
    create_topic(source.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(source.bootstrap_servers, topic, PARTITIONS, FIRST)
    copy_topic(source, topic, destination, dest, PARTITIONS)
    data = audit_config(source, destination, unique_name("flow"), [topic])
    data["flows"][0]["naming"] = {"policy": "prefix", "rename": {topic: dest}}
    return topic, dest, write_audit_config(tmp_path / "flow.yaml", data)


def test_scheduler_audits_a_running_flow_every_interval_only_new_data_and_exits_0_on_sigterm(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("scheduled")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, FIRST)
    dest = f"src.{topic}"
    log = tmp_path / "schedule.log"
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as flow:
        read_all(destination_cluster.bootstrap_servers, dest, expected=PARTITIONS * FIRST, timeout_s=120)
        api = f"127.0.0.1:{reserve_port()}"
        with _scheduler(flow.config, log, "--interval-s", "1", "--listen-address", api) as proc:
            runs = wait_until(lambda: _at_least(2, _runs(flow.config)), _RUNS_BUDGET_S, _POLL_S, "two runs")
            assert runs[0]["expected"] == PARTITIONS * FIRST  # the first run checks everything replicated
            assert all(r["expected"] == 0 for r in runs[1:]), runs  # then nothing new: nothing checked

            # The scheduler serves the audit API: the same runs, read through it (no Spark in that process).
            through_api = _ferryman("audit", "list", "--server", api, "--output", "json", "--limit", "0")
            assert through_api.returncode == 0, through_api.stderr
            api_runs = [r["run_id"] for r in json.loads(through_api.stdout)]
            assert api_runs[:2] == [r["run_id"] for r in runs[:2]]

            # More data while the flow and the scheduler run: later runs check it, and only it (each run ends
            # at the flow's committed watermark, so a record is checked once its copy is committed).
            produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, MORE, start=FIRST)
            wait_until(
                lambda: sum(r["expected"] for r in _runs(flow.config)) >= PARTITIONS * (FIRST + MORE),
                _RUNS_BUDGET_S,
                _POLL_S,
                "runs of the new data",
            )
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(_STOP_BUDGET_S)
        stored = _runs(flow.config)
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]
    assert all(r["verdict"] == "EXACTLY_ONCE" for r in stored), stored
    assert sum(r["expected"] for r in stored) == PARTITIONS * (FIRST + MORE)  # no record checked twice
    assert all(r["found"] == r["expected"] for r in stored)
    # Every stored run's verdict was logged, and the stop was orderly.
    for r in stored:
        assert f"audit {r['run_id']} of flow" in output
    assert "received SIGTERM: stopping" in output
    assert f"stopped after {len(stored)} run(s)" in output, output[-4000:]
    assert "Traceback" not in output


@pytest.mark.nightly  # a second Spark start in CI (~30-50 s); the exit status rule is unit-tested
def test_scheduler_logs_a_violation_and_exits_1_on_sigterm_as_audit_run_would(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, dest, config = _setup(source_cluster, destination_cluster, unique_name, tmp_path)
    # A duplicate of one copy: the first run is a violation.
    copy = read_all(destination_cluster.bootstrap_servers, dest, expected=PARTITIONS * FIRST)
    producer = Producer({"bootstrap.servers": destination_cluster.bootstrap_servers})
    produce_copy(producer, dest, copy[1][-1])
    assert producer.flush(30) == 0
    log = tmp_path / "schedule.log"
    # An hour's interval: one run, then the scheduler waits; SIGTERM ends the wait at once.
    with _scheduler(config, log, "--interval-s", "3600", "--shutdown-timeout-s", "0") as proc:
        runs = wait_until(lambda: _runs(config), _RUNS_BUDGET_S, _POLL_S, "the first run")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(_STOP_BUDGET_S)
    output = log.read_text(errors="replace")
    assert [r["verdict"] for r in runs] == ["VIOLATED"]
    assert runs[0]["duplicated"] == 1
    assert code == 1, output[-4000:]
    assert f"ERROR ferryman-audit ferryman_auditor._schedule: audit {runs[0]['run_id']}" in output
    assert f"{topic}-1 (missing 0, duplicated 1" in output


def _spark_jvm(scheduler: subprocess.Popen[bytes]) -> psutil.Process:
    """The JVM that PySpark started for the scheduler (a java process below it)."""
    jvms = [p for p in psutil.Process(scheduler.pid).children(recursive=True) if p.name() == "java"]
    assert len(jvms) == 1, [p.cmdline() for p in jvms]
    return jvms[0]


@pytest.mark.parametrize("noticed_by", ["scheduled run", "run started over the API"])
def test_scheduler_whose_spark_jvm_is_killed_exits_3_at_the_next_run_with_the_reason(
    noticed_by: str,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """kill -9 of Spark's JVM (as the OOM killer would): PySpark cannot start another in the process, so the
    scheduler must not go on failing every run while it looks alive; it exits for its supervisor to restart it,
    at the next scheduled run or at a run started over its API, whichever fails first."""
    _topic, _dest, config = _setup(source_cluster, destination_cluster, unique_name, tmp_path)
    log = tmp_path / "schedule.log"
    api = f"127.0.0.1:{reserve_port()}"
    over_api = noticed_by == "run started over the API"
    interval = "3600" if over_api else "2"  # over the API: no scheduled run comes before the started one
    with _scheduler(config, log, "--interval-s", interval, "--listen-address", api) as proc:
        first = wait_until(lambda: _runs(config), _RUNS_BUDGET_S, _POLL_S, "the first run")
        _spark_jvm(proc).kill()
        if over_api:
            started = _ferryman("audit", "run", "--server", api, "--output", "json")
            assert started.returncode == 3, started.stdout + started.stderr
        code = proc.wait(_RUNS_BUDGET_S)
        stored = _runs(config)
    output = log.read_text(errors="replace")
    assert code == 3, output[-4000:]
    assert first and all(r["verdict"] == "EXACTLY_ONCE" for r in first), first
    assert "Spark's session is lost" in output and "exiting to be restarted" in output, output[-4000:]
    lost = (
        "an audit run on the session failed and Spark's session is lost: its JVM does not answer"
        if over_api
        else "could not run and Spark's session is lost: its JVM does not answer"
    )
    assert lost in output, output[-4000:]
    assert all(r["verdict"] == "EXACTLY_ONCE" for r in stored)  # nothing of a failed run is stored
    # No stop tried on the dead JVM (PySpark's own threads may still print a traceback as the JVM goes).
    assert "did not stop cleanly" not in output, output[-4000:]


def _offline(
    command: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ferryman audit COMMAND`` on a flow whose clusters are never reached (what is checked comes first)."""
    data = flow_config(source_bootstrap="127.0.0.1:1", destination_bootstrap="127.0.0.1:2", flow="f", topics=["t"])
    config = write_audit_config(tmp_path / "flow.yaml", data)
    return subprocess.run(
        [str(BIN / "ferryman"), "audit", command, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | (env or {}),
    )


@pytest.mark.parametrize("command", ["run", "schedule"])
def test_spark_that_does_not_start_is_an_audit_that_could_not_run_exit_3_not_a_finding(
    command: str, tmp_path: Path
) -> None:
    """No Java (JAVA_HOME wrong): exit 3 (could not run: a CronJob retries it) with the reason, never 1 (a
    violation, which fails the Job) or a traceback. Spark starts before the clusters are asked."""
    done = _offline(command, tmp_path, env={"JAVA_HOME": str(tmp_path / "no-java")})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ferryman: Spark did not start: [JAVA_GATEWAY_EXITED]" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["run", "schedule"])
def test_a_reports_dir_that_cannot_be_written_is_bad_usage_before_spark_starts(command: str, tmp_path: Path) -> None:
    """Not after the run: its verdict would be stored and then hidden behind the error (or a traceback)."""
    (tmp_path / "a-file").write_text("")
    done = _offline(command, tmp_path, "--reports-dir", str(tmp_path / "a-file" / "reports"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ferryman: --reports-dir (FERRYMAN_AUDIT_REPORTS_DIR)" in done.stderr, done.stderr
    assert "cannot write reports there: Not a directory" in done.stderr
    assert "Spark" not in done.stderr and "Traceback" not in done.stderr
