"""The audit scheduler's gRPC API on loopback: start an audit, follow it to its verdict, read it back.

The server is the one ``ferryman audit schedule`` starts (`serve_audit_api` over `AuditRuns`, with the
project's interceptors and a bearer token), on the shared real Spark session, auditing a real copy
on real brokers; the CLI reads it back as a subprocess with ``--server``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator

import grpc
import pytest
from ferryman.admin import AdminError, AuthenticationError, FerrymanAdmin
from ferryman.config import FerrymanConfig, RpcConfig, validated
from ferryman.v1 import audit_pb2
from ferryman_auditor import AuditRuns, serve_audit_api
from pyspark.sql import SparkSession

from tests.helpers.audit import audit_config, copy_topic, load
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences
from tests.helpers.services import BIN

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 1500  # 3 k records: enough for a Spark job with a task per partition, small for CI
TOKEN = "audit-api-test-token"


@pytest.fixture
def flow_config(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> tuple[FerrymanConfig, str]:
    """A flow over a transactional source topic and its clean copy (``src.<topic>``), and the topic."""
    topic = unique_name("api")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(
        source_cluster.bootstrap_servers,
        topic,
        PARTITIONS,
        PER_PARTITION,
        transactional=True,
        records_per_transaction=300,
    )
    copy_topic(source_cluster, topic, destination_cluster, f"src.{topic}", PARTITIONS)
    data = audit_config(source_cluster, destination_cluster, unique_name("flow"), [topic])
    data["rpc"] = {"auth_token": TOKEN}
    return load(data), topic


@pytest.fixture
def server(spark: SparkSession, flow_config: tuple[FerrymanConfig, str]) -> Iterator[str]:
    """The audit API on a free loopback port; its address."""
    config, _ = flow_config
    runs = AuditRuns(spark, config)
    with serve_audit_api(runs, config.flows[0].name, listen_address="127.0.0.1:0", rpc=config.rpc) as rpc_server:
        yield f"127.0.0.1:{rpc_server.port}"


def _client_rpc() -> RpcConfig:
    return validated(RpcConfig, {"auth_token": TOKEN})


def test_an_audit_started_over_the_api_is_followed_to_its_verdict_and_read_back(
    server: str, flow_config: tuple[FerrymanConfig, str]
) -> None:
    config, topic = flow_config
    flow = config.flows[0].name
    with FerrymanAdmin(server, _client_rpc()) as admin:
        started = admin.start_audit()  # the scheduler's flow, since the last verified position
        assert started.flow == flow
        assert started.state in (audit_pb2.AUDIT_STATE_QUEUED, audit_pb2.AUDIT_STATE_RUNNING)
        assert started.range.WhichOneof("kind") is None

        with pytest.raises(AdminError) as busy:  # one started run at a time
            admin.start_audit(flow)
        assert busy.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert busy.value.metadata["run_id"] == started.run_id

        events = list(admin.follow_audit(started.run_id, flow))
        progress = [e.progress for e in events[:-1]]
        assert progress and all(e.HasField("progress") for e in events[:-1])
        # Followed from just after the start: the Spark job (seconds) is seen, with its tasks counted.
        assert "reading and aligning" in {p.step for p in progress}
        result = events[-1].result
        assert result.run_id == started.run_id
        assert result.state == audit_pb2.AUDIT_STATE_FINISHED
        assert result.verdict == audit_pb2.VERDICT_EXACTLY_ONCE
        assert sorted((p.topic, p.partition) for p in result.partitions) == [(topic, p) for p in range(PARTITIONS)]
        assert result.totals.expected == result.totals.found == PARTITIONS * PER_PARTITION
        assert result.totals.missing == result.totals.duplicated == result.totals.unexpected == 0

        assert admin.get_audit(started.run_id, flow) == result
        listed = admin.list_audits(flow)
        assert [(r.run_id, r.verdict, r.partition_count) for r in listed] == [
            (started.run_id, audit_pb2.VERDICT_EXACTLY_ONCE, PARTITIONS)
        ]
        # A finished run is followed to its result alone.
        assert [e.WhichOneof("event") for e in admin.follow_audit(started.run_id, flow)] == ["result"]

        # An explicit offset range, through the same API: checks exactly that much.
        ranged = admin.start_audit(flow, start_offsets={0: 0, 1: 0}, end_offsets={0: 100, 1: 100})
        ranged_result = list(admin.follow_audit(ranged.run_id, flow))[-1].result
        assert ranged_result.verdict == audit_pb2.VERDICT_EXACTLY_ONCE
        assert ranged_result.range.offsets.end_offsets[1] == 100
        assert [p.source_range.to_offset for p in ranged_result.partitions] == [100, 100]

    # The CLI as a user runs it, through the API (no Spark in that process).
    cli = subprocess.run(
        [str(BIN / "ferryman"), "audit", "list", "--server", server, "--token", TOKEN, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    rows = json.loads(cli.stdout)
    assert [(r["run_id"], r["verdict"], r["partitions"]) for r in rows] == [
        (started.run_id, "EXACTLY_ONCE", PARTITIONS),
        (ranged.run_id, "EXACTLY_ONCE", PARTITIONS),
    ]
    assert rows[0]["expected"] == PARTITIONS * PER_PARTITION


def test_audit_run_through_the_api_and_a_fresh_server_reads_it_from_the_audit_topic(
    spark: SparkSession, server: str, flow_config: tuple[FerrymanConfig, str]
) -> None:
    config, topic = flow_config
    # Started and followed by the CLI as a user runs it: the scheduler's Spark does the work.
    ran = subprocess.run(
        [str(BIN / "ferryman"), "audit", "run", "--server", server, "--token", TOKEN, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["verdict"] == "EXACTLY_ONCE" and report["range"] == {"kind": "since-last"}
    assert [(p["topic"], p["partition"], p["expected"], p["found"]) for p in report["partitions"]] == [
        (topic, p, PER_PARTITION, PER_PARTITION) for p in range(PARTITIONS)
    ]
    # Another server (a restarted scheduler) knows the run only from the flow's audit topic.
    with (
        serve_audit_api(
            AuditRuns(spark, config), config.flows[0].name, listen_address="127.0.0.1:0", rpc=config.rpc
        ) as fresh,
        FerrymanAdmin(f"127.0.0.1:{fresh.port}", _client_rpc()) as admin,
    ):
        stored = admin.get_audit(report["run_id"])
        assert stored.verdict == audit_pb2.VERDICT_EXACTLY_ONCE and len(stored.partitions) == PARTITIONS
        assert admin.get_audit().run_id == report["run_id"]  # the latest stored run
        shown = subprocess.run(
            [str(BIN / "ferryman"), "audit", "show", "--server", f"127.0.0.1:{fresh.port}", "--output", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "FERRYMAN_TOKEN": TOKEN},
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == report  # the same JSON as audit run printed


def test_bad_requests_get_precise_codes(server: str) -> None:
    with FerrymanAdmin(server, _client_rpc()) as admin:
        with pytest.raises(AdminError) as unknown:
            admin.start_audit("no-such-flow")
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND and "no-such-flow" in str(unknown.value)

        with pytest.raises(AdminError) as window:
            admin.start_audit(start_ms=2_000, end_ms=1_000)
        assert window.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "range.time_window.end_ms" in str(window.value)

        with pytest.raises(AdminError) as offsets:
            admin.start_audit(start_offsets={0: 50}, end_offsets={0: 10})
        assert offsets.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "range.offsets.end_offsets[0]" in str(offsets.value)

        with pytest.raises(AdminError) as run:
            admin.get_audit("20000101T000000Z-000000")
        assert run.value.code == grpc.StatusCode.NOT_FOUND

    with FerrymanAdmin(server) as anonymous, pytest.raises(AuthenticationError):
        anonymous.list_audits()
