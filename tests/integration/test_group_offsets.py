"""Moving a consumer group to the destination with ``ferryman offsets translate-group``, on real clusters.

A group reads part of a replicated topic at the source and commits; the CLI, as a user runs it, reads those
offsets through the wrapper and has the deduper translate and commit them; a consumer of the same group at the
destination then reads exactly the records the group had not read at the source: none twice, none skipped.
The source topic is written in transactions, so its offsets (with their markers) differ from the
destination's (with the deduper's markers): the translation cannot be the identity. Partition 1 is committed
past its last marker, as a Java consumer at the end does: the wrapper finds the last record before it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from tests.helpers.groups import consume_at_source, destination_member, read_as_member
from tests.helpers.grpc_clients import start_linked_pair
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import ferryman_cli

pytestmark = pytest.mark.integration

PER_PARTITION = 120
#: Records the group reads of partition 0 at the source before it moves (all of partition 1).
READ_OF_0 = 70
START_TIMEOUT_S = 90.0


def test_a_group_moved_to_the_destination_reads_each_record_it_had_not_read_exactly_once(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, group = unique_name("moving"), unique_name("group")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    values = produce_sequences(
        source_cluster.bootstrap_servers, topic, 2, PER_PARTITION, transactional=True, records_per_transaction=50
    )
    pair = start_linked_pair(tmp_path, source_cluster, destination_cluster, flow=unique_name("flow"), topics=[topic])
    destination_topic = f"src.{topic}"
    try:
        wait_until(pair.link_up, START_TIMEOUT_S, message="control link up")
        read_all(
            destination_cluster.bootstrap_servers,
            destination_topic,
            expected=2 * PER_PARTITION,
            timeout_s=START_TIMEOUT_S,
        )
        committed = consume_at_source(
            source_cluster.bootstrap_servers, topic, group, {0: READ_OF_0, 1: PER_PARTITION}, to_end=frozenset({1})
        )
        at_deduper = {"FERRYMAN_SERVER": pair.deduper_address, "FERRYMAN_SOURCE_SERVER": pair.wrapper_address}

        def translated() -> dict[str, object] | None:
            result = ferryman_cli("offsets", "translate-group", group, "-o", "json", env=at_deduper)
            assert result.returncode == 0, result.stderr
            data: dict[str, object] = json.loads(result.stdout)
            rows = data["partitions"]
            assert isinstance(rows, list)
            return data if all(r["status"] == "translated" for r in rows) else None

        # The deduper's last commit may still be settling: the state read waits for it, the status says so.
        data = wait_until(translated, 60, message="every partition translated")
        assert data is not None and data["committed"] is False
        rows = {r["source"]["partition"]: r for r in data["partitions"]}  # type: ignore[attr-defined]
        assert {p: r["source"]["offset"] for p, r in rows.items()} == committed
        assert {r["destination"]["topic"] for r in rows.values()} == {destination_topic}
        assert rows[0]["destination"]["offset"] != committed[0]  # the markers differ on either side

        # Refused, nothing committed, while the group has a member at the destination.
        member = destination_member(destination_cluster.bootstrap_servers, destination_topic, group)
        try:
            member.subscribe([destination_topic])
            wait_until(lambda: member.poll(0.2) is None and member.assignment(), 60, message="member assigned")
            refused = ferryman_cli("offsets", "translate-group", group, "--commit", env=at_deduper)
            assert refused.returncode == 9, (refused.returncode, refused.stderr)
            assert "has members at the destination" in refused.stderr and "Traceback" not in refused.stderr
        finally:
            member.close()
        check = destination_member(destination_cluster.bootstrap_servers, destination_topic, group)
        try:
            none = check.committed([TopicPartition(destination_topic, p) for p in (0, 1)], timeout=30)
            assert all(tp.offset < 0 for tp in none), none
        finally:
            check.close()

        done = ferryman_cli("offsets", "translate-group", group, "--commit", "-o", "json", env=at_deduper)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["committed"] is True

        moved = destination_member(destination_cluster.bootstrap_servers, destination_topic, group)
        try:
            got = read_as_member(moved, destination_topic, PER_PARTITION - READ_OF_0)
        finally:
            moved.close()
        assert got == {0: values[0][READ_OF_0:]}  # partition 1 was read to its end at the source

        unknown = ferryman_cli("offsets", "translate-group", unique_name("idle"), env=at_deduper)
        assert unknown.returncode == 7 and "no committed offsets" in unknown.stderr, unknown.stderr
    finally:
        pair.stop()
