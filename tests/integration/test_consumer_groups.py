"""The services' consumer groups on real clusters: no partition is left without an owner.

Cooperative-sticky assignment with static membership has a trap: a member that stops (given up, or shut
down) halfway through a cooperative rebalance, after it was told to revoke partitions and before it
rejoins, is succeeded by a member with its ``group.instance.id`` that takes over the stored assignment
without a rebalance; the withheld partitions belong to nobody and nothing starts another rebalance. Seen
in chaos runs (a wrapper whose hand-over commit hung; a deduper SIGTERMed right after a peer joined).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupState
from confluent_kafka.admin import AdminClient

from tests.helpers.kafka import (
    KafkaCluster,
    assert_exact_copy,
    create_topic,
    produce_sequences,
    read_all,
    wait_until,
)
from tests.helpers.services import ServiceProcess, running_flow
from tests.helpers.streams import SequenceProducer

pytestmark = pytest.mark.integration

_HOOK = Path(__file__).parent.parent / "helpers" / "hold_call"
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
    held_env = {
        "PYTHONPATH": os.pathsep.join([str(_HOOK), os.environ.get("PYTHONPATH", "")]),
        "FERRYMAN_TEST_HOLD_CALL": "revoke-commit-wedged",
        "FERRYMAN_TEST_HOLD_MARKER": str(marker),
    }
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
            running.wrapper.wait_for_log("a replacement consumer rejoins once", 5)
            assert running.wrapper.alive and second.alive
        finally:
            second.stop()


def _group_owners(bootstrap: str, group: str) -> tuple[ConsumerGroupState, dict[str, set[int]]]:
    """The group's state and the partitions each member (by group.instance.id) owns."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=20)
    return desc.state, {
        str(m.group_instance_id): {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members
    }


def _member(bootstrap: str, group: str, instance_id: str, topic: str) -> Consumer:
    """A bare consumer in a deduper's group, as the deduper configures its own (cooperative, static)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.instance.id": instance_id,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    return consumer


#: Consumers given up on purpose: never closed or destroyed (either would serve their pending rebalance).
_GIVEN_UP: list[Consumer] = []


@contextlib.contextmanager
def _polling(consumer: Consumer) -> Iterator[None]:
    """Poll consumer on a thread (a live member: serves its rebalances) until the block ends."""
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            consumer.poll(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def test_staging_partitions_left_without_an_owner_are_noticed_and_assigned(
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
        # A member owning every staging partition; a deduper joins, and the member is told to revoke half of
        # them (the first phase of a cooperative rebalance), but it is given up before it can (never polled).
        holder = _member(dst, group, "holder", staging)
        _GIVEN_UP.append(holder)
        wait_until(lambda: (holder.poll(0.1), len(holder.assignment()) == PARTITIONS)[1], 60, message="holder owns all")
        deduper = ServiceProcess("deduper", running.config, tmp_path, args=["--instance-id", "d2"]).start()
        try:

            def first_phase_done() -> bool:
                state, owners = _group_owners(dst, group)
                return state == ConsumerGroupState.STABLE and owners.get("d2") == set() and "holder" in owners

            wait_until(first_phase_done, 60, 0.5, message="the deduper joined with nothing assigned yet")
            # Its successor (same group.instance.id) takes over the stored assignment: half the partitions.
            successor = _member(dst, group, "holder", staging)
            with _polling(successor):
                # (Asked of the group: Consumer.assignment() beside a polling thread can deadlock.)
                wait_until(
                    lambda: len(_group_owners(dst, group)[1].get("holder", ())) == PARTITIONS // 2,
                    60,
                    0.5,
                    message="the successor took over",
                )
                # The other half belong to nobody until the deduper notices and rejoins.
                deduper.wait_for_log("rejoining the staging consumer group", 60)
                wait_until(
                    lambda: len(_group_owners(dst, group)[1].get("d2", ())) == PARTITIONS // 2,
                    60,
                    0.5,
                    message="the deduper owns the partitions nobody owned",
                )
            successor.close()  # static: its partitions move when its session expires
            produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 100, start=1000)
            src = read_all(source_cluster.bootstrap_servers, topic, expected=PARTITIONS * 200, timeout_s=30)
            assert_exact_copy(src, read_all(dst, f"src.{topic}", expected=PARTITIONS * 200, timeout_s=90))
        finally:
            deduper.stop()
