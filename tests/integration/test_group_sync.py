"""Periodic group-offset sync (``flows[].sync_group_offsets``), on real clusters.

A flow syncs the groups its ``groups`` regexes choose, every second here. A group reads part of a replicated
topic at the source (written in transactions, so offsets differ on either side) and commits: the same group
at the destination gets the translated offsets without anyone asking, follows the source group as it reads
on, is left alone while it has a member at the destination, and is never moved back once it read further
there. A member of the synced group at the destination reads exactly what the group had not read at the
source. A group the flow does not choose gets nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.helpers.groups import consume_at_source, destination_member, read_as_member
from tests.helpers.grpc_clients import LinkedPair, start_linked_pair
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import ferryman_cli

pytestmark = pytest.mark.integration

PER_PARTITION = 120
START_TIMEOUT_S = 90.0
SYNC_TIMEOUT_S = 60.0


def _committed(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """The group's committed offsets of partitions 0 and 1 of topic (absent: not committed), read without joining."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


def _syncs(pair: LinkedPair, outcome: str) -> int:
    return pair.await_deduper_status().group_offset_syncs.get(outcome, 0)


def test_a_synced_group_follows_the_source_group_and_is_never_moved_under_its_members_nor_back(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, prefix = unique_name("synced"), unique_name("app")
    group, other = f"{prefix}.billing", unique_name("unchosen")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    values = produce_sequences(
        source_cluster.bootstrap_servers, topic, 2, PER_PARTITION, transactional=True, records_per_transaction=50
    )
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=unique_name("flow"),
        topics=[topic],
        extra_flow={"sync_group_offsets": True, "groups": [f"{prefix}\\..*"], "sync_group_offsets_interval_s": 1},
    )
    dst, destination_topic = destination_cluster.bootstrap_servers, f"src.{topic}"
    try:
        wait_until(pair.link_up, START_TIMEOUT_S, message="control link up")
        read_all(dst, destination_topic, expected=2 * PER_PARTITION, timeout_s=START_TIMEOUT_S)

        # The group reads 70 of partition 0 and all of partition 1 at the source: synced without a call.
        at_source = consume_at_source(
            source_cluster.bootstrap_servers, topic, group, {0: 70, 1: PER_PARTITION}, frozenset({1})
        )
        consume_at_source(source_cluster.bootstrap_servers, topic, other, {0: 10})
        first = wait_until(
            lambda: (c := _committed(dst, destination_topic, group)).keys() == {0, 1} and c,
            SYNC_TIMEOUT_S,
            message="the group's offsets synced at the destination",
        )
        assert first and first[0] != at_source[0]  # translated: the destination's markers stand elsewhere

        # It reads on at the source: the destination follows, forward.
        consume_at_source(source_cluster.bootstrap_servers, topic, group, {0: 100})
        second = wait_until(
            lambda: (c := _committed(dst, destination_topic, group)).get(0, -1) > first[0] and c,
            SYNC_TIMEOUT_S,
            message="the group's partition 0 synced forward",
        )
        assert second and second[1] == first[1]

        # A member at the destination: the group is left alone while it runs there (its reads are its own).
        member = destination_member(dst, destination_topic, group)
        try:
            got = read_as_member(member, destination_topic, PER_PARTITION - 100)
            assert got == {0: values[0][100:]}  # exactly what the group had not read at the source
            consume_at_source(source_cluster.bootstrap_servers, topic, group, {0: 110})
            active = _syncs(pair, "active")
            wait_until(lambda: _syncs(pair, "active") > active, SYNC_TIMEOUT_S, message="a sync refused as active")
            member.commit(asynchronous=False)  # the member read to the end: it commits its positions
            at_end = _committed(dst, destination_topic, group)
        finally:
            member.close()
        assert at_end[0] > second[0]

        # Gone from the destination, the group is not moved back to the source group's (older) position.
        unchanged = _syncs(pair, "unchanged")
        wait_until(lambda: _syncs(pair, "unchanged") > unchanged + 1, SYNC_TIMEOUT_S, message="syncs left it")
        assert _committed(dst, destination_topic, group) == at_end

        assert _committed(dst, destination_topic, other) == {}  # not chosen by the flow's groups
        assert _syncs(pair, "failed") == 0
        assert "Traceback" not in pair.deduper.output() + pair.wrapper.output()
    finally:
        pair.stop()


def test_the_sync_is_off_by_default_and_turned_on_live_with_flows_update(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Off (the default), no group is written at the destination; ``ferryman flows update`` turns it on live."""
    topic, group, flow = unique_name("unsynced"), unique_name("group"), unique_name("flow")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, 20)
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=flow,
        topics=[topic],
        extra_flow={"sync_group_offsets_interval_s": 0.5},
    )
    try:
        wait_until(pair.link_up, START_TIMEOUT_S, message="control link up")
        read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=40, timeout_s=START_TIMEOUT_S)
        consume_at_source(source_cluster.bootstrap_servers, topic, group, {0: 20, 1: 20})
        time.sleep(3)  # six intervals
        assert _committed(destination_cluster.bootstrap_servers, f"src.{topic}", group) == {}
        assert dict(pair.await_deduper_status().group_offset_syncs) == {}

        on = ferryman_cli(
            "flows",
            "update",
            flow,
            "--sync-group-offsets",
            "--group",
            group,
            env={"FERRYMAN_SERVER": pair.deduper_address},
        )
        assert on.returncode == 0, on.stderr
        synced = wait_until(
            lambda: _committed(destination_cluster.bootstrap_servers, f"src.{topic}", group).keys() == {0, 1},
            SYNC_TIMEOUT_S,
            message="the group synced once the flow asks for it",
        )
        assert synced
    finally:
        pair.stop()
