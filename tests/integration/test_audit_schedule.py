"""``ferryman audit schedule`` as a process on real clusters: runs every interval, incrementally, stops on SIGTERM.

The scheduler is started the way an operator starts it, next to a running flow
(wrapper and deduper as processes) or a copy the test planted a fault in, and
observed only from outside: ``ferryman audit list --output json``, its log and
its exit status.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from ferryman_local import reserve_port

from tests.helpers.audit import produce_copy
from tests.helpers.audit_cli import (
    FIRST,
    MORE,
    PARTITIONS,
    POLL_S,
    RUNS_BUDGET_S,
    STOP_BUDGET_S,
    at_least,
    copied_flow,
    ferryman,
    scheduler,
    stored_runs,
)
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import running_flow

pytestmark = pytest.mark.integration


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
        with scheduler(flow.config, log, "--interval-s", "1", "--listen-address", api) as proc:
            runs = wait_until(lambda: at_least(2, stored_runs(flow.config)), RUNS_BUDGET_S, POLL_S, "two runs")
            assert runs[0]["expected"] == PARTITIONS * FIRST  # the first run checks everything replicated
            assert all(r["expected"] == 0 for r in runs[1:]), runs  # then nothing new: nothing checked

            # The scheduler serves the audit API: the same runs, read through it (no Spark in that process).
            through_api = ferryman("audit", "list", "--server", api, "--output", "json", "--limit", "0")
            assert through_api.returncode == 0, through_api.stderr
            api_runs = [r["run_id"] for r in json.loads(through_api.stdout)]
            assert api_runs[:2] == [r["run_id"] for r in runs[:2]]

            # More data while the flow and the scheduler run: later runs check it, and only it (each run ends
            # at the flow's committed watermark, so a record is checked once its copy is committed).
            produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, MORE, start=FIRST)
            wait_until(
                lambda: sum(r["expected"] for r in stored_runs(flow.config)) >= PARTITIONS * (FIRST + MORE),
                RUNS_BUDGET_S,
                POLL_S,
                "runs of the new data",
            )
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(STOP_BUDGET_S)
        stored = stored_runs(flow.config)
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
    topic, dest, config = copied_flow(source_cluster, destination_cluster, unique_name, tmp_path)
    # A duplicate of one copy: the first run is a violation.
    copy = read_all(destination_cluster.bootstrap_servers, dest, expected=PARTITIONS * FIRST)
    producer = Producer({"bootstrap.servers": destination_cluster.bootstrap_servers})
    produce_copy(producer, dest, copy[1][-1])
    assert producer.flush(30) == 0
    log = tmp_path / "schedule.log"
    # An hour's interval: one run, then the scheduler waits; SIGTERM ends the wait at once.
    with scheduler(config, log, "--interval-s", "3600", "--shutdown-timeout-s", "0") as proc:
        runs = wait_until(lambda: stored_runs(config), RUNS_BUDGET_S, POLL_S, "the first run")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(STOP_BUDGET_S)
    output = log.read_text(errors="replace")
    assert [r["verdict"] for r in runs] == ["VIOLATED"]
    assert runs[0]["duplicated"] == 1
    assert code == 1, output[-4000:]
    assert f"ERROR ferryman-audit ferryman_auditor._schedule: audit {runs[0]['run_id']}" in output
    assert f"{topic}-1 (missing 0, duplicated 1" in output
