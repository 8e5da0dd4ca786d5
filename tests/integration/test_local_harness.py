"""The local Kafka harness on real brokers: separate clusters, transactions, restarts, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import ferryman
import ferryman_local
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from ferryman_local import LocalCluster

from tests.helpers.kafka import (
    KafkaCluster,
    assert_sequences,
    create_topic,
    produce_sequences,
    read_all,
    sequence_value,
    wait_until,
)

pytestmark = pytest.mark.integration


def _described_id(bootstrap: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return str(admin.describe_cluster(request_timeout=10).result(timeout=15).cluster_id)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent has not reaped it yet


def test_source_and_destination_are_separate_clusters(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster
) -> None:
    assert source_cluster.cluster_id != destination_cluster.cluster_id
    assert source_cluster.bootstrap_servers != destination_cluster.bootstrap_servers
    assert _described_id(source_cluster.bootstrap_servers) == source_cluster.cluster_id
    assert _described_id(destination_cluster.bootstrap_servers) == destination_cluster.cluster_id


def test_read_committed_sees_committed_records_only(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    bootstrap = source_cluster.bootstrap_servers
    topic = unique_name("txn")
    create_topic(bootstrap, topic, 3)
    committed = produce_sequences(bootstrap, topic, 3, 100, transactional=True, records_per_transaction=120)

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("txp")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(3):
        producer.produce(topic, value=b"aborted", partition=p)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()  # left open: read_committed must stop before it, not hang
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)

    try:
        assert_sequences(read_all(bootstrap, topic, timeout_s=30), committed)
        uncommitted = read_all(bootstrap, topic, isolation="read_uncommitted", timeout_s=30)
        assert [r.value for r in uncommitted[1]] == [*committed[1], b"aborted"]
        assert [r.value for r in uncommitted[0]][-2:] == [b"aborted", b"open"]
    finally:
        producer.abort_transaction(30)


def test_read_all_waits_for_expected_records(source_cluster: KafkaCluster, unique_name: Callable[[str], str]) -> None:
    bootstrap = source_cluster.bootstrap_servers
    topic = unique_name("late")
    assert read_all(bootstrap, topic, timeout_s=10) == {}  # no topic yet
    create_topic(bootstrap, topic, 2)
    first = produce_sequences(bootstrap, topic, 2, 10)
    with pytest.raises(AssertionError, match="20 of 21 expected records"):
        read_all(bootstrap, topic, timeout_s=1, expected=21)

    # The rest arrives while read_all is already waiting for it.
    later = threading.Timer(0.5, produce_sequences, (bootstrap, topic, 2, 15), {"start": 10})
    later.start()
    try:
        records = read_all(bootstrap, topic, timeout_s=30, expected=50)
    finally:
        later.join()
    assert_sequences(records, {p: [*first[p], *(sequence_value(topic, p, i) for i in range(10, 25))] for p in first})
    assert [r.key for r in records[1][:2]] == [b"1:0", b"1:1"]


@pytest.mark.slow
def test_restart_and_crash_keep_committed_data(tmp_path: Path) -> None:
    with LocalCluster.start("restartable", work_dir=tmp_path / "restartable") as cluster:
        bootstrap, cluster_id = cluster.bootstrap_servers, cluster.cluster_id
        create_topic(bootstrap, "kept", 2)
        produced = produce_sequences(bootstrap, "kept", 2, 50, transactional=True)

        cluster.restart()  # clean: SIGTERM, then start again
        assert (cluster.bootstrap_servers, cluster.cluster_id) == (bootstrap, cluster_id)
        assert _described_id(bootstrap) == cluster_id
        assert_sequences(read_all(bootstrap, "kept", timeout_s=30), produced)

        pid = cluster.pid
        assert pid is not None
        cluster.kill()
        assert cluster.pid is None
        assert not _alive(pid)
        cluster.restart()  # after a crash
        more = produce_sequences(bootstrap, "kept", 2, 10, start=50, transactional=True)
        assert_sequences(read_all(bootstrap, "kept", timeout_s=30), {p: produced[p] + more[p] for p in produced})

        cluster.stop()
        cluster.stop()  # idempotent
        assert cluster.pid is None


def test_a_new_partitions_index_files_are_small(tmp_path: Path) -> None:
    """The broker takes the harness's index cap: a new segment's sparse index files are 256 KiB, not 10 MiB.

    How far the kernel reads (and zero-fills) around the fault of a first index entry is bounded by the
    file's size (docs/notes.md, "Index files and read-ahead").
    """
    cap = int(ferryman_local.SINGLE_NODE_PROPERTIES["log.index.size.max.bytes"])
    assert cap == 256 * 1024
    with LocalCluster.start("indexes", work_dir=tmp_path / "indexes") as cluster:
        create_topic(cluster.bootstrap_servers, "fresh", 1)
        segment = cluster.data_dir / "fresh-0"

        def index_sizes() -> dict[str, int]:
            return {f.suffix: f.stat().st_size for f in segment.glob("*") if f.suffix in (".index", ".timeindex")}

        wait_until(lambda: len(index_sizes()) == 2, 30, message=f"index files in {segment}")
        sizes = index_sizes()  # read while the broker runs: a clean stop trims them to their entries
    assert sizes == {".index": cap // 8 * 8, ".timeindex": cap // 12 * 12}, sizes


def _cli(base_dir: Path) -> subprocess.Popen[str]:
    # The packages' parent dirs, for a child that may not have them installed.
    roots = {str(Path(m.__file__ or "").resolve().parents[1]) for m in (ferryman, ferryman_local)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*roots, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "ferryman_local", "up", "--clusters", "solo", "--dir", str(base_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _wait_for_clusters_file(cli: subprocess.Popen[str], path: Path) -> dict[str, dict[str, object]]:
    def written() -> bool:
        if cli.poll() is not None:
            raise AssertionError(f"ferryman-local exited with {cli.returncode}:\n{cli.communicate()[0]}")
        return path.exists()

    wait_until(written, 120, message=f"{path} written")
    info: dict[str, dict[str, object]] = json.loads(path.read_text())
    return info


@pytest.mark.e2e
@pytest.mark.slow
def test_cli_up_stops_cleanly_and_never_orphans_a_broker(tmp_path: Path) -> None:
    clusters_file = tmp_path / "clusters.json"
    cli = _cli(tmp_path)
    try:
        solo = _wait_for_clusters_file(cli, clusters_file)["solo"]
        assert _described_id(str(solo["bootstrap_servers"])) == solo["cluster_id"]
        pid = int(str(solo["pid"]))
        cli.send_signal(signal.SIGTERM)
        out, _ = cli.communicate(timeout=60)
        assert cli.returncode == 0, out
        assert f"solo {solo['bootstrap_servers']} {solo['cluster_id']}" in out.splitlines()
        assert not _alive(pid)
        assert not clusters_file.exists()

        # Same dir again: same cluster back. Then the CLI dies without any chance to clean up.
        cli = _cli(tmp_path)
        again = _wait_for_clusters_file(cli, clusters_file)["solo"]
        assert (again["cluster_id"], again["bootstrap_servers"]) == (solo["cluster_id"], solo["bootstrap_servers"])
        pid = int(str(again["pid"]))
        cli.kill()
        cli.wait(10)
        wait_until(lambda: not _alive(pid), 10, message=f"broker {pid} gone after SIGKILL of its parent")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
