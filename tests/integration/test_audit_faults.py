"""Audits on real clusters and a real Spark session: each planted fault is reported exactly, where it is.

The source is written transactionally (sparse offsets: markers) with an
aborted transaction in the middle, and carries headers; each test copies it
to a destination topic of its own, planting one fault in partition 1, and
audits the copy by content (no offset map: the copy was not written by a flow).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from ferryman_auditor import AuditRange, AuditSettings, run_audit
from pyspark.sql import SparkSession

from tests.helpers import kafka as kafka_helpers
from tests.helpers.audit import Planter, audit_config, copy_topic, load, write_audit_config
from tests.helpers.kafka import ConsumedRecord, KafkaCluster, create_topic, recent_create_time_ms
from tests.helpers.services import BIN

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 200
FAULTY = 1
COUNTS = ("missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")


@pytest.fixture(scope="module")
def source_topic(source_cluster: KafkaCluster) -> str:
    """A transactional source with headers on every record and one aborted transaction in the middle."""
    topic = kafka_helpers.unique_name("audit-faults", "src")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(30)
    stamp = recent_create_time_ms()
    for i in range(PER_PARTITION):
        if i % 50 == 0:
            producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(
                topic,
                key=f"{p}:{i}".encode(),
                value=kafka_helpers.sequence_value(topic, p, i),
                headers=[("seq", str(i).encode()), ("empty", None)],
                partition=p,
                timestamp=stamp + i,
            )
        if i == 100:  # an aborted transaction: its records must never be expected
            producer.commit_transaction(30)
            producer.begin_transaction()
            for p in range(PARTITIONS):
                producer.produce(topic, value=b"aborted", partition=p)
            producer.flush(30)
            producer.abort_transaction(30)
            producer.begin_transaction()
        if i % 50 == 49:
            producer.commit_transaction(30)
    return topic


def _insert(at: int, record: Callable[[list[ConsumedRecord]], ConsumedRecord]) -> Planter:
    return lambda rs: [*rs[:at], record(rs), *rs[at:]]


FAULTS: dict[str, tuple[Planter, str]] = {
    "duplicate": (_insert(21, lambda rs: rs[20]), "duplicated"),
    "missing": (lambda rs: rs[:30] + rs[31:], "missing"),
    "altered-value": (lambda rs: [*rs[:40], replace(rs[40], value=b"altered"), *rs[41:]], "altered"),
    "changed-header": (
        lambda rs: [*rs[:45], replace(rs[45], headers=(("seq", b"changed"), ("empty", None))), *rs[46:]],
        "altered",
    ),
    "reordered-pair": (lambda rs: [*rs[:50], rs[51], rs[50], *rs[52:]], "reordered"),
    "foreign-record": (
        _insert(60, lambda rs: replace(rs[0], key=b"foreign", value=b"not from the source")),
        "unexpected",
    ),
}


def _copy_and_config(
    source: KafkaCluster, destination: KafkaCluster, topic: str, name: str, plant: dict[int, Planter]
) -> dict[str, Any]:
    dest = kafka_helpers.unique_name(name, "dst")
    copy_topic(source, topic, destination, dest, PARTITIONS, plant)
    data = audit_config(source, destination, kafka_helpers.unique_name(name, "flow"), [topic])
    data["flows"][0]["naming"] = {"policy": "prefix", "rename": {topic: dest}}
    return data


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_planted_fault_is_reported_exactly_in_its_partition(
    spark: SparkSession,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    source_topic: str,
    tmp_path: Path,
    fault: str,
) -> None:
    planter, field = FAULTS[fault]
    data = _copy_and_config(source_cluster, destination_cluster, source_topic, fault, {FAULTY: planter})
    config = load(data)
    report = run_audit(spark, config, config.flows[0], AuditRange(), settings=AuditSettings(reports_dir=tmp_path))
    assert report.verdict == "VIOLATED"
    by_partition = {p.partition: p for p in report.partitions}
    assert sorted(by_partition) == list(range(PARTITIONS))
    for p, part in by_partition.items():
        assert part.expected == PER_PARTITION, part  # the aborted records are not expected
        want = {c: 0 for c in COUNTS}
        if p == FAULTY:
            want[field] = 1
        assert {c: getattr(part, c) for c in COUNTS} == want, part
        assert part.offset_map is None  # no flow wrote this copy: content alignment only
    assert (tmp_path / f"{report.run_id}.parquet").exists()


def test_a_faithful_copy_audits_clean_then_incrementally(
    spark: SparkSession,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    source_topic: str,
) -> None:
    data = _copy_and_config(source_cluster, destination_cluster, source_topic, "clean", {})
    config = load(data)
    first = run_audit(spark, config, config.flows[0], AuditRange())
    assert first.verdict == "EXACTLY_ONCE", first.as_dict()
    assert first.totals()["expected"] == first.totals()["found"] == PARTITIONS * PER_PARTITION
    again = run_audit(spark, config, config.flows[0], AuditRange())
    assert again.verdict == "EXACTLY_ONCE"
    assert again.totals()["expected"] == 0  # since the last verified position: nothing new


def test_cli_reports_a_violation_as_json_with_exit_status_1(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, source_topic: str, tmp_path: Path
) -> None:
    planter, _ = FAULTS["missing"]
    data = _copy_and_config(source_cluster, destination_cluster, source_topic, "cli", {FAULTY: planter})
    path = write_audit_config(tmp_path / "flow.yaml", data)
    ferryman = str(BIN / "ferryman")
    run = subprocess.run(
        [ferryman, "audit", "run", "--config", str(path), "--output", "json", "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["verdict"] == "VIOLATED"
    faulty = [p for p in report["partitions"] if p["missing"]]
    assert [(p["topic"], p["partition"], p["missing"]) for p in faulty] == [(source_topic, FAULTY, 1)]
    for p in report["partitions"]:
        assert set(p) >= {"topic", "partition", "expected", "found", "missing", "duplicated", "reordered"}
        assert set(p) >= {"altered", "unexpected", "unverifiable"}

    listed = subprocess.run(
        [ferryman, "audit", "list", "--config", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [report["run_id"]]
    shown = subprocess.run(
        [ferryman, "audit", "show", report["run_id"], "--config", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 1 and json.loads(shown.stdout)["run_id"] == report["run_id"]


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "run", "--start-offsets", "zero"],
        ["audit", "run", "--no-such-flag"],
        ["audit", "run", "--output", "yaml"],
        ["audit", "show", "no-such-run"],
    ],
    ids=["bad-offsets", "unknown-flag", "bad-output", "unknown-run"],
)
def test_cli_bad_usage_is_one_line_and_exit_status_2(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, tmp_path: Path, args: list[str]
) -> None:
    data = audit_config(source_cluster, destination_cluster, "usage", ["nothing"])
    path = write_audit_config(tmp_path / "flow.yaml", data)
    run = subprocess.run(
        [str(BIN / "ferryman"), *args, "--config", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("ferryman: ")


# Explicit ranges through the CLI: records [RANGE_FROM, RANGE_TO) of every partition (or [RANGE_FROM, WINDOW_TO)),
# with one fault planted before the range, one inside and one after: only the one inside is reported, where it is.
RANGE_FROM, RANGE_TO = 20, 100
# A time window ends inside the first transaction (records 0-49): its commit marker is stamped when it was written,
# after these back-dated records, and Kafka's offsets for a time count markers too, so a window past it would end
# at the marker (as it would for Spark's own Kafka source). docs/notes.md, Pitfalls.
WINDOW_TO = 40


def _faults_around_the_range(records: list[ConsumedRecord]) -> list[ConsumedRecord]:
    out = []
    for i, r in enumerate(records):
        if i == 30:
            continue  # missing, inside the range
        out.append(replace(r, value=b"altered") if i == 10 else r)  # altered, before the range
        if i == 150:
            out.append(r)  # duplicated, after the range
    return out


def _audit_range_as_json(
    source: KafkaCluster,
    destination: KafkaCluster,
    topic: str,
    tmp_path: Path,
    name: str,
    range_args: list[str],
    expected: int,
) -> dict[str, Any]:
    data = _copy_and_config(source, destination, topic, name, {FAULTY: _faults_around_the_range})
    path = write_audit_config(tmp_path / "flow.yaml", data)
    argv = [str(BIN / "ferryman"), "audit", "run", "--config", str(path), "--output", "json", "--master", "local[1]"]
    run = subprocess.run(
        [*argv, *range_args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1, run.stderr[-3000:]  # the fault inside the range is a violation
    report: dict[str, Any] = json.loads(run.stdout)
    assert report["verdict"] == "VIOLATED"
    for p in report["partitions"]:
        assert p["expected"] == expected, p
        want = {c: 0 for c in COUNTS}
        if p["partition"] == FAULTY:
            want["missing"] = 1
        assert {c: p[c] for c in COUNTS} == want, p
    return report


def test_cli_audits_explicit_source_offsets_only(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, source_topic: str, tmp_path: Path
) -> None:
    src = kafka_helpers.read_all(source_cluster.bootstrap_servers, source_topic)
    # Offsets are sparse (transaction markers, an aborted transaction): each partition's bounds are looked up.
    starts = ",".join(f"{p}={records[RANGE_FROM].offset}" for p, records in sorted(src.items()))
    ends = ",".join(f"{p}={records[RANGE_TO].offset}" for p, records in sorted(src.items()))
    args = ["--start-offsets", starts, "--end-offsets", ends]
    report = _audit_range_as_json(
        source_cluster, destination_cluster, source_topic, tmp_path, "offsets", args, RANGE_TO - RANGE_FROM
    )
    assert report["range"]["kind"] == "offsets"
    missing = [p["samples"]["missing"] for p in report["partitions"] if p["partition"] == FAULTY]
    assert missing == [[src[FAULTY][30].offset]]


def test_cli_audits_a_time_window_only(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, source_topic: str, tmp_path: Path
) -> None:
    src = kafka_helpers.read_all(source_cluster.bootstrap_servers, source_topic)
    since_ms = src[0][RANGE_FROM].timestamp_ms  # record i of every partition was written at the same stamp + i
    until_ms = src[0][WINDOW_TO].timestamp_ms
    since = datetime.fromtimestamp(since_ms / 1000, UTC).isoformat(timespec="milliseconds")  # both forms
    args = ["--since", since, "--until", str(until_ms)]
    report = _audit_range_as_json(
        source_cluster, destination_cluster, source_topic, tmp_path, "window", args, WINDOW_TO - RANGE_FROM
    )
    assert report["range"] == {"kind": "time", "start_ms": since_ms, "end_ms": until_ms}
