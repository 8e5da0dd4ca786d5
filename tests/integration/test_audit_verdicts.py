"""The verdict follower on a real broker: it keeps the latest verdict per partition as audits write them."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from ferryman.audit_verdicts import VerdictFollower, verdict_key

from tests.helpers.kafka import KafkaCluster, create_topic, wait_until

pytestmark = pytest.mark.integration


def _entry(partition: int, verdict: str, run_id: str, missing: int = 0) -> bytes:
    report = {"topic": "t", "partition": partition, "verdict": verdict, "run_id": run_id, "finished_at_ms": 5}
    return json.dumps({**report, "expected": 10, "found": 10 - missing, "missing": missing}).encode()


def test_the_follower_keeps_the_latest_verdict_of_each_partition(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("audit")
    bootstrap = destination_cluster.bootstrap_servers
    create_topic(bootstrap, topic, 1, {"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=verdict_key("t", 0), value=_entry(0, "EXACTLY_ONCE", "r1"))
    producer.produce(topic, key=b"run/r1", value=b"{}")  # other records of the audit topic are not verdicts
    producer.produce(topic, key=verdict_key("t", 1), value=b"not json")  # skipped, never fatal
    assert producer.flush(30) == 0
    follower = VerdictFollower({"bootstrap.servers": bootstrap, "client.id": "test"}, topic)
    follower.start()
    try:

        def latest() -> dict[int, tuple[str, str, int]]:
            return {v.partition: (v.verdict, v.run_id, v.missing) for v in follower.verdicts()}

        wait_until(lambda: latest() == {0: ("EXACTLY_ONCE", "r1", 0)}, 30, message="the first verdict")
        producer.produce(topic, key=verdict_key("t", 0), value=_entry(0, "VIOLATED", "r2", missing=1))
        producer.produce(topic, key=verdict_key("t", 1), value=_entry(1, "EXACTLY_ONCE", "r2"))
        assert producer.flush(30) == 0
        expected = {0: ("VIOLATED", "r2", 1), 1: ("EXACTLY_ONCE", "r2", 0)}
        wait_until(lambda: latest() == expected, 30, message="the next run's verdicts")
        producer.produce(topic, key=verdict_key("t", 1), value=None)  # a tombstone removes the verdict
        assert producer.flush(30) == 0
        wait_until(lambda: latest() == {0: ("VIOLATED", "r2", 1)}, 30, message="the tombstone")
    finally:
        follower.stop()
