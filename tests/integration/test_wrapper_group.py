"""The wrappers' source consumer group on real clusters: a consumer given up mid-rebalance orphans nothing.

A wrapper gives its source consumer up (parks it, never closed) when a commit through it never returns.
Given up while the group is halfway through a cooperative rebalance, the partitions it was to revoke
belonged to nobody: its replacement (same ``group.instance.id``) took over the stored assignment without a
rebalance and nothing ever started another. Seen in a chaos run as five minutes with half the partitions
idle; a probe with plain consumers stayed stuck for good.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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
