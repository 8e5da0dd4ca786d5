"""The services' consumer groups on real clusters: no partition is left without an owner.

Cooperative-sticky assignment with static membership has a trap: a member that stops (given up, or shut
down) halfway through a cooperative rebalance, after it was told to revoke partitions and before it
rejoins, is succeeded by a member with its ``group.instance.id`` that takes over the stored assignment
without a rebalance; the withheld partitions belong to nobody and nothing starts another rebalance. Seen
in chaos runs (a wrapper whose hand-over commit hung; a deduper SIGTERMed right after a peer joined).
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman.group_close import JoinTracker, close_group_consumer
from ferryman.topics import watermark_offsets
from ferryman_wrapper._clients import ORPHANED_REBUILD_S

from tests.helpers.kafka import (
    KafkaCluster,
    assert_exact_copy,
    create_topic,
    produce_sequences,
    read_all,
    static_member_config,
    wait_until,
)
from tests.helpers.services import ServiceProcess, hold_env, running_flow
from tests.helpers.streams import SequenceProducer

pytestmark = pytest.mark.integration

PARTITIONS = 4


def test_a_consumer_given_up_mid_rebalance_leaves_no_partition_without_an_owner(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("orphans")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    marker = tmp_path / "held"
    held_env = hold_env("revoke-commit-wedged", marker)
    flow = unique_name("flow")
    before = SequenceProducer(source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=200, rate_per_s=400)
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=flow,
        topics=[topic],
        wrapper={"instance_id": f"{flow}-w1"},
        wrapper_env=held_env,
    ) as running:
        before.start()
        running.wrapper.wait_for_log("is new to the flow", 60)
        # The second wrapper's join makes the first one revoke half its partitions: its hand-over commit
        # (in the rebalance callback) is held, then never returns.
        second = ServiceProcess("wrapper", running.config, tmp_path, args=["--instance-id", f"{flow}-w2"]).start()
        try:
            wait_until(marker.exists, 90, message="the first wrapper's hand-over commit held")
            time.sleep(8)  # the watchdog's deadline, about
            assert running.wrapper.proc is not None
            running.wrapper.proc.send_signal(signal.SIGUSR1)  # the commit "never returned": consumer given up
            running.wrapper.wait_for_log("replacing the source consumer", 30)
            before.join(60)
            assert before.error is None
            produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 100, start=1000)
            src = read_all(source_cluster.bootstrap_servers, topic, expected=PARTITIONS * 300, timeout_s=30)
            # Every partition is owned again and replicated: before the fix, the partitions under revocation
            # were never assigned (nothing moved on them within minutes).
            dst = read_all(
                destination_cluster.bootstrap_servers, f"src.{topic}", expected=PARTITIONS * 300, timeout_s=60
            )
            assert_exact_copy(src, dst)
            running.wrapper.wait_for_log("a new static member rejoins once", 5)
            assert running.wrapper.alive and second.alive
        finally:
            second.stop()


def test_a_revoke_hands_partitions_over_without_waiting_out_the_watchdog(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """A second wrapper joins under load: the first one revokes half its partitions and commits their
    acknowledged prefix from the rebalance callback. Its commit used to run on the watchdog's thread, which
    confluent-kafka-python 2.16 makes wait for the callback's ``consume()`` to return: every revoke stalled
    13 s, then the consumer was given up (``test_a_commit_from_another_thread_waits_for_the_rebalance_callback``
    pins the library's side)."""
    topic = unique_name("handover")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    flow = unique_name("flow")
    per_partition = 2000
    load = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=per_partition, rate_per_s=400
    )
    src_bootstrap = source_cluster.bootstrap_servers
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=flow,
        topics=[topic],
        wrapper={"instance_id": f"{flow}-w1"},
    ) as running:
        load.start()
        # Replicating, records acknowledged past the last periodic commit: the revoke has something to commit.
        wait_until(lambda: _copied(destination_cluster.bootstrap_servers, f"src.{topic}") >= 800, 60, 0.5)
        out = _second_member_joins(
            running.wrapper,
            ServiceProcess("wrapper", running.config, tmp_path, args=["--instance-id", f"{flow}-w2"]),
            group=(src_bootstrap, f"ferryman-wrapper.{flow}"),
            load=load,
            copy=(source_cluster, destination_cluster, topic, PARTITIONS * per_partition),
        )
        assert "did not return" not in out, out[-4000:]
        assert "replacing the source consumer" not in out, out[-4000:]


def test_a_deduper_without_transactions_commits_staging_offsets_on_revoke_without_stalling(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """``exactly_once: false``: a deduper revoking staging partitions commits their offsets from the rebalance
    callback; on the watchdog's thread that commit waited for the callback (as the wrapper's hand-over did),
    so every revoke with an open transaction stalled the deadline and wedged the producer."""
    topic = unique_name("eos-off")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    flow = unique_name("flow")
    per_partition = 2000
    load = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=per_partition, rate_per_s=400
    )
    dst = destination_cluster.bootstrap_servers
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=flow,
        topics=[topic],
        extra_flow={"exactly_once": False, "staging_partitions": PARTITIONS},
    ) as running:
        load.start()
        wait_until(lambda: _copied(dst, f"src.{topic}") >= 800, 60, 0.5)  # replicating: a transaction is open
        out = _second_member_joins(
            running.deduper,
            ServiceProcess("deduper", running.config, tmp_path, args=["--instance-id", "d2"]),
            group=(dst, f"ferryman-deduper.{flow}"),
            load=load,
            copy=(source_cluster, destination_cluster, topic, PARTITIONS * per_partition),
        )
        assert "did not return" not in out, out[-4000:]


def _copied(bootstrap: str, topic: str) -> int:
    """Records in topic so far (its partitions' high watermarks summed; 0 before it exists)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "copied-probe"})
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        # A destination topic created a moment ago may have no leader yet (NOT_LEADER in a CI run): retried.
        return sum(watermark_offsets(consumer, topic, p, budget_s=10)[1] for p in found.partitions)
    finally:
        consumer.close()


def _second_member_joins(
    first: ServiceProcess,
    second: ServiceProcess,
    *,
    group: tuple[str, str],
    load: SequenceProducer,
    copy: tuple[KafkaCluster, KafkaCluster, str, int],
) -> str:
    """Start second beside first (same flow, load running); once both own partitions of group (bootstrap,
    id) and the load is done, check the copy is exact and both still run. Returns first's output."""
    second.start()
    try:

        def both_own_partitions() -> bool:
            state, owners = _group_owners(*group)
            return state == ConsumerGroupState.STABLE and len([o for o in owners.values() if o]) == 2

        wait_until(both_own_partitions, 90, 0.5, message="both members own partitions")
        load.join(60)
        assert load.error is None
        source, destination, topic, total = copy
        src = read_all(source.bootstrap_servers, topic, expected=total, timeout_s=30)
        assert_exact_copy(src, read_all(destination.bootstrap_servers, f"src.{topic}", expected=total, timeout_s=90))
        assert first.alive and second.alive
        return first.output()
    finally:
        second.stop()


def test_a_commit_from_another_thread_waits_for_the_rebalance_callback(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    """The library behaviour behind ``SourceCommits.hand_over``: confluent-kafka-python (2.16) serialises
    calls on one consumer across threads, so while the consumer's thread is inside a rebalance callback (in
    ``consume()``), a commit from another thread waits for the callback to return."""
    bootstrap = source_cluster.bootstrap_servers
    topic = unique_name("gate")
    create_topic(bootstrap, topic, 2)
    produce_sequences(bootstrap, topic, 2, 10)
    consumer = Consumer(static_member_config(bootstrap, unique_name("group"), "m1", **{"enable.auto.commit": False}))
    seen: dict[str, bool] = {}

    def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
        offsets = [TopicPartition(tp.topic, tp.partition, 5) for tp in partitions]

        def commit() -> None:
            with contextlib.suppress(KafkaException):  # refused once the member has left: returning is the point
                c.commit(offsets=offsets, asynchronous=False)

        other = threading.Thread(target=commit, daemon=True)
        other.start()
        other.join(3)
        seen["waited"] = other.is_alive()  # still waiting while this callback runs
        seen["thread"] = True
        _threads.append(other)

    _threads: list[threading.Thread] = []
    try:
        consumer.subscribe([topic], on_revoke=on_revoke)
        wait_until(lambda: (consumer.consume(10, 0.2), len(consumer.assignment()) == 2)[1], 60, message="assigned")
        consumer.unsubscribe()
        wait_until(lambda: (consumer.consume(10, 0.2), "thread" in seen)[1], 30, message="revoked")
        assert seen["waited"], "the other thread's commit returned while the callback ran"
        _threads[0].join(30)
        assert not _threads[0].is_alive(), "the other thread's commit never returned after the callback"
    finally:
        consumer.close()


def test_a_consumer_left_out_of_its_group_after_a_session_timeout_is_replaced_once_the_source_answers(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """After a source broker freeze librdkafka can keep a consumer out of its group for ~60 s (its
    coordinator's handle decommissioned, held by a pending commit). The hold leaves a real consumer reading
    nothing after its session-timeout hook (partitions paused, no rebalance) while the source answers; the
    wrapper replaces it ``ORPHANED_REBUILD_S`` later, once, and replication goes on exactly once. The
    nightly frozen-broker test meets the defect itself."""
    topic = unique_name("left-out")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    marker = tmp_path / "left-out"
    env = hold_env("consumer-left-out", marker, after=200)
    per_partition = 600
    flow = unique_name("flow")
    load = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=per_partition, rate_per_s=100
    )
    with running_flow(
        source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic], wrapper_env=env
    ) as running:
        load.start()
        wait_until(marker.exists, 60, message="the consumer left out of its group")
        running.wrapper.wait_for_log("replacing the source consumer: not assigned again", ORPHANED_REBUILD_S + 30)
        load.join(60)
        assert load.error is None
        total = PARTITIONS * per_partition
        src = read_all(source_cluster.bootstrap_servers, topic, expected=total, timeout_s=30)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=total, timeout_s=60)
        assert_exact_copy(src, dst)
        out = running.wrapper.output()
        waited = re.search(r"not assigned again (\d+) s after its session timed out", out)
        assert waited is not None and int(waited.group(1)) >= ORPHANED_REBUILD_S
        assert out.count("replacing the source consumer") == 1
        assert running.wrapper.alive


def _group_owners(bootstrap: str, group: str) -> tuple[ConsumerGroupState, dict[str, set[int]]]:
    """The group's state and the partitions each member (by group.instance.id) owns."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=20)
    return desc.state, {
        str(m.group_instance_id): {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members
    }


def _member(bootstrap: str, group: str, instance_id: str, topic: str) -> Consumer:
    """A bare consumer in a deduper's group, as the deduper configures its own (cooperative, static)."""
    consumer = Consumer(static_member_config(bootstrap, group, instance_id, **{"enable.auto.commit": False}))
    consumer.subscribe([topic])
    return consumer


#: Consumers given up on purpose: never closed or destroyed (either would serve their pending rebalance).
_GIVEN_UP: list[Consumer] = []


def test_a_deduper_restarted_mid_rebalance_leaves_no_staging_partition_without_an_owner(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("orphans")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 100)
    flow = unique_name("flow")
    group, staging = f"ferryman-deduper.{flow}", f"ferryman.{flow}.staging.internal"
    dst = destination_cluster.bootstrap_servers
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=flow,
        topics=[topic],
        extra_flow={"staging_partitions": PARTITIONS},
        deduper={"session_timeout_ms": 6000},
    ) as running:
        read_all(dst, f"src.{topic}", expected=PARTITIONS * 100, timeout_s=90)
        running.deduper.stop()  # a static member: it leaves the group when its session expires
        wait_until(lambda: _group_owners(dst, group)[0] == ConsumerGroupState.EMPTY, 60, 0.5, message="group empty")
        # Deduper d1's last session, as the chaos run saw it: it owns every staging partition, a second deduper
        # joins, d1 is told to revoke half of them (the first phase of a cooperative rebalance) and stops before
        # it rejoins (a bare member with d1's group.instance.id, never polled again).
        last_session = _member(dst, group, "d1", staging)
        _GIVEN_UP.append(last_session)
        wait_until(
            lambda: (last_session.poll(0.1), len(last_session.assignment()) == PARTITIONS)[1], 60, message="d1 owns all"
        )
        second = ServiceProcess("deduper", running.config, tmp_path, args=["--instance-id", "d2"]).start()
        try:
            # d2's first assignment is empty (the partitions are withheld until d1 revokes them); d1 never does.
            second.wait_for_log("deduper d2 starting", 60)
            time.sleep(6)  # its join, and the first phase of the rebalance
            # d1 restarts: it takes over its last session's stored assignment (without the partitions withheld
            # for d2), then rejoins once, and the withheld ones are assigned.
            running.deduper.start()

            def every_partition_owned() -> bool:
                state, owners = _group_owners(dst, group)
                owned = [p for parts in owners.values() for p in parts]
                return state == ConsumerGroupState.STABLE and sorted(owned) == list(range(PARTITIONS))

            wait_until(every_partition_owned, 90, 0.5, message="every staging partition owned again")
            running.deduper.wait_for_log("rejoining the staging consumer group once", 5)
            produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 100, start=1000)
            src = read_all(source_cluster.bootstrap_servers, topic, expected=PARTITIONS * 200, timeout_s=30)
            assert_exact_copy(src, read_all(dst, f"src.{topic}", expected=PARTITIONS * 200, timeout_s=90))
        finally:
            second.stop()


@pytest.mark.parametrize("delay_s", [0.0, 0.2])
def test_a_consumer_closed_during_its_join_takes_its_assignment_before_it_closes(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str], delay_s: float
) -> None:
    """librdkafka #4884: a close() that serves an assign callback can hang for good holding the GIL.

    Closed soon after subscribe(), never polled: its join is in flight, so without the settle close() itself
    would serve the assignment (on close_or_park's worker thread), which hung a deduper's drain in CI and 2
    of 12 such closes stand-alone. With it, the assign callback runs in a poll on this thread, before close().
    """
    topic = unique_name("joinclose")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    joins = JoinTracker()
    calls: list[tuple[str, int, str]] = []

    def on_assign(consumer: Consumer, parts: list[TopicPartition]) -> None:
        joins.assigned()
        calls.append(("assign", len(parts), threading.current_thread().name))
        consumer.incremental_assign(parts)

    def on_revoke(_consumer: Consumer, parts: list[TopicPartition]) -> None:
        joins.revoked()
        calls.append(("revoke", len(parts), threading.current_thread().name))

    consumer = Consumer(
        {
            "bootstrap.servers": source_cluster.bootstrap_servers,
            "group.id": unique_name("joinclose"),
            "group.instance.id": "m1",
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
        }
    )
    joins.subscribed()
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    time.sleep(delay_s)  # the close meets the join at different moments
    started = time.monotonic()
    close_group_consumer(consumer, joins, what="closing the test consumer", deadline_s=15)
    assert time.monotonic() - started < 15, calls
    assert calls[0] == ("assign", PARTITIONS, threading.current_thread().name), calls
    assert [c[0] for c in calls] == ["assign", "revoke"], calls  # close() revoked what the poll assigned
