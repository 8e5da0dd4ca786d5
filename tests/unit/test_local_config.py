"""The local harness without brokers: properties, ids, the jar cache, the test helpers' assertions."""

from __future__ import annotations

import base64
import stat
import threading
from pathlib import Path

import pytest
from ferryman_local import (
    ClusterNode,
    JarResolutionError,
    ToolMissingError,
    coordinator_partition,
    ensure_kafka_jars,
    java_string_hash,
    replication_properties,
)
from ferryman_local._cluster import broker_properties, new_cluster_id
from ferryman_local._multinode import initial_controllers, node_properties
from ferryman_local.cli import main

from tests.helpers.kafka import ConsumedRecord, assert_exact_copy, assert_sequences, unique_name


def test_broker_properties_are_single_node_and_overridable(tmp_path: Path) -> None:
    props = broker_properties(port=1234, controller_port=5678, data_dir=tmp_path, extra={"num.partitions": "3"})
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:1234,CONTROLLER://127.0.0.1:5678"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:5678"
    assert props["log.dirs"] == str(tmp_path)
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert props["auto.create.topics.enable"] == "false"
    assert props["num.partitions"] == "3"


def test_cluster_ids_look_like_kafka_uuids() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert len(cid) == 22
        assert not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def _tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache and a PATH holding only a fake ``java`` (tests add ``mvn``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "java", "exit 0\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FERRYMAN_CACHE_DIR", str(tmp_path / "cache"))
    return bin_dir


def test_jars_are_resolved_once_even_from_parallel_callers(fake_tools: Path, tmp_path: Path) -> None:
    calls = tmp_path / "mvn-calls"
    _tool(
        fake_tools,
        "mvn",
        f'echo called >> "{calls}"\n'
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done\n'
        ': > "$out/kafka_2.13-4.1.1.jar"\n',  # the harness creates the directory
    )
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_kafka_jars())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert results[0].parent == tmp_path / "cache"
    assert results[0].name.startswith("kafka-4.1.1-broker-")
    assert (results[0] / "kafka_2.13-4.1.1.jar").exists()
    assert calls.read_text().count("called") == 1
    (fake_tools / "mvn").unlink()  # no longer needed: the marker answers
    assert ensure_kafka_jars() == results[0]


def test_failed_resolution_reports_maven_output(fake_tools: Path) -> None:
    _tool(fake_tools, "mvn", "echo '[ERROR] Could not resolve org.apache.kafka:kafka_2.13'\nexit 1\n")
    with pytest.raises(JarResolutionError, match=r"Could not resolve org\.apache\.kafka:kafka_2\.13"):
        ensure_kafka_jars(with_mirrormaker=True)


def test_missing_tools_are_named(fake_tools: Path) -> None:
    with pytest.raises(ToolMissingError, match="mvn is not on PATH"):
        ensure_kafka_jars()
    (fake_tools / "java").unlink()
    with pytest.raises(ToolMissingError, match="java is not on PATH"):
        ensure_kafka_jars()


def test_cli_rejects_empty_cluster_list() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", "--clusters", ","])
    assert exc.value.code == 2


def test_unique_names_are_legal_topic_names_and_unique() -> None:
    a = unique_name("test_copy[with params/and spaces]", "topic")
    b = unique_name("test_copy[with params/and spaces]", "topic")
    assert a != b
    assert a.startswith("topic-test_copy-with-params-and-spaces-")
    assert all(c.isalnum() or c in "._-" for c in a)
    assert len(unique_name("x" * 500, "p")) < 80


def _rec(
    value: bytes, offset: int, *, ts: int = 1000, headers: tuple[tuple[str, bytes | None], ...] = ()
) -> ConsumedRecord:
    return ConsumedRecord(
        partition=0, offset=offset, key=b"k", value=value, headers=headers, timestamp_ms=ts, timestamp_type=1
    )


def test_exact_copy_ignores_offsets_only() -> None:
    source = {0: [_rec(b"a", 0), _rec(b"b", 5)]}
    assert_exact_copy(source, {0: [_rec(b"a", 10), _rec(b"b", 12)]})
    with pytest.raises(AssertionError, match=r"partition 0 differs.*index 1"):
        assert_exact_copy(source, {0: [_rec(b"a", 0), _rec(b"b", 1, ts=1001)]})
    with pytest.raises(AssertionError, match=r"index 0"):
        assert_exact_copy(source, {0: [_rec(b"a", 0, headers=(("h", None),)), _rec(b"b", 1)]})


def test_exact_copy_counts_missing_duplicated_and_reordered() -> None:
    source = {0: [_rec(b"a", 0), _rec(b"b", 1), _rec(b"c", 2)]}
    with pytest.raises(
        AssertionError, match=r"source 3 records, destination 4 \(0 missing, 1 duplicated, 0 unexpected\)"
    ):
        assert_exact_copy(source, {0: [_rec(b"a", 0), _rec(b"b", 1), _rec(b"b", 2), _rec(b"c", 3)]})
    with pytest.raises(AssertionError, match=r"\(1 missing, 0 duplicated, 0 unexpected\); first difference at index 1"):
        assert_exact_copy(source, {0: [_rec(b"a", 0), _rec(b"c", 1)]})
    with pytest.raises(AssertionError, match="partition 0 reordered"):
        assert_exact_copy(source, {0: [_rec(b"b", 0), _rec(b"a", 1), _rec(b"c", 2)]})
    with pytest.raises(AssertionError, match="partition 0 differs: source 3 records, destination 0"):
        assert_exact_copy(source, {})


def test_sequences_report_the_first_gap() -> None:
    got = {0: [_rec(b"v0", 0), _rec(b"v2", 1)]}
    with pytest.raises(
        AssertionError, match=r"expected 3 values, got 2 \(1 missing.*index 1: expected b'v1', got b'v2'"
    ):
        assert_sequences(got, {0: [b"v0", b"v1", b"v2"]})


@pytest.mark.parametrize(
    ("text", "java_hash"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        # Overflows to a negative int, as most transactional ids of any length do.
        ("ferryman-deduper.f.d1", -1095900539),
        # The one string whose hash is Integer.MIN_VALUE, where Math.abs would overflow.
        ("polygenelubricants", -(2**31)),
        # Outside the BMP: Java hashes the two UTF-16 code units (0xD83D, 0xDE00).
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
    ],
)
def test_java_string_hash_matches_javas(text: str, java_hash: int) -> None:
    assert java_string_hash(text) == java_hash


def test_coordinator_partition_is_kafkas_abs_hash_modulo() -> None:
    assert coordinator_partition("ferryman-deduper.f.d1", 4) == 1095900539 % 4
    assert coordinator_partition("polygenelubricants", 4) == 0  # Utils.abs(MIN_VALUE) is 0
    assert [coordinator_partition(c, 4) for c in "abcd"] == [1, 2, 3, 0]
    assert coordinator_partition("hello", 50) == 99162322 % 50


def test_replication_properties_tolerate_one_node_down_from_three_nodes() -> None:
    three = replication_properties(3)
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
        "default.replication.factor",
    ):
        assert three[key] == "3", key
    for key in ("transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr", "min.insync.replicas"):
        assert three[key] == "2", key
    assert replication_properties(5)["default.replication.factor"] == "3"
    assert replication_properties(1)["default.replication.factor"] == "1"
    assert replication_properties(1)["min.insync.replicas"] == "1"


def test_node_properties_make_every_node_a_voter_of_one_quorum(tmp_path: Path) -> None:
    nodes = [ClusterNode(node_id=i, port=1000 + i, controller_port=2000 + i, directory_id=f"dir{i}") for i in (1, 2, 3)]
    props = node_properties(nodes[1], nodes, data_dir=tmp_path, extra={"num.partitions": "3"})
    assert props["node.id"] == "2"
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:1002,CONTROLLER://127.0.0.1:2002"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:2001,127.0.0.1:2002,127.0.0.1:2003"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["num.partitions"] == "3"
    assert "controller.quorum.voters" not in props  # a dynamic quorum: --initial-controllers formats it
    assert initial_controllers(nodes) == "1@127.0.0.1:2001:dir1,2@127.0.0.1:2002:dir2,3@127.0.0.1:2003:dir3"
