"""A fenced static member's fatal error comes once, as an event of a consume() batch (real brokers).

librdkafka hands a group consumer's fatal error to the application as a consumer
error event on its queue, not to ``error_cb``. The deduper's loop drops a
consumed batch when a rebalance callback of the same consume() failed, or while
it recovers; a long chaos run lost the event that way (a session timeout's lost
partitions and the fence came in one batch) and the deduper owned no partition
from then on. ``StagingPartitions.note_errors`` takes the batch's error events
before anything can drop it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, Message
from ferryman.config import ClusterConfig
from ferryman.health import ClusterHealth
from ferryman.watchdog import park
from ferryman_deduper._gaps import GapTracker
from ferryman_deduper._partitions import StagingPartitions

from tests.helpers.kafka import KafkaCluster, create_topic, static_member_config

pytestmark = pytest.mark.integration


def _consume_until(consumer: Consumer, done: Callable[[list[Message]], bool], timeout_s: float) -> list[Message]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msgs = consumer.consume(num_messages=100, timeout=0.2)
        if done(msgs):
            return msgs
    raise AssertionError(f"not done within {timeout_s} s")


def test_a_fence_comes_as_a_batch_event_only_and_note_errors_takes_it(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    bootstrap = destination_cluster.bootstrap_servers
    staging, group = unique_name("staging"), unique_name("dedupers")
    create_topic(bootstrap, staging, 2)
    seen_by_error_cb: list[KafkaError] = []

    def on_error(err: KafkaError) -> None:
        seen_by_error_cb.append(err)
        parts.on_consumer_error(err)

    parts = StagingPartitions(
        make_consumer=lambda: Consumer(static_member_config(bootstrap, group, "d1", error_cb=on_error)),
        staging_topic=staging,
        state_topic=unique_name("state"),
        staging_partitions=2,
        instance_id="d1",
        restore_config=lambda: {"bootstrap.servers": bootstrap},
        check_state=lambda: None,
        commit_for_revoke=lambda _lost: None,
        health=ClusterHealth("destination", ClusterConfig(bootstrap_servers=bootstrap)),
        gaps=GapTracker(),
    )
    parts.start()
    twin = Consumer(static_member_config(bootstrap, group, "d1"))
    try:
        _consume_until(parts.consumer, lambda _msgs: bool(parts.restoring), 30)
        twin.subscribe([staging])
        # The twin's join fences our member: its next batches bring the fatal error as an event.
        batch = _consume_until(parts.consumer, lambda msgs: any(m.error() is not None for m in msgs), 30)
        errors = [e for m in batch if (e := m.error()) is not None]
        fatal = [e for e in errors if e.code() == KafkaError._FATAL]
        assert fatal, errors
        assert "fenced" in fatal[0].str().lower()
        assert not any(e.code() == KafkaError._FATAL for e in seen_by_error_cb)  # error_cb never hears of it
        assert not parts.consumer_failed
        parts.note_errors(batch)  # what the loop does first with every batch, even one it then drops
        assert parts.consumer_failed
        # It comes once: later batches do not repeat it.
        later = [e for m in parts.consumer.consume(num_messages=100, timeout=1.0) if (e := m.error()) is not None]
        assert not [e for e in later if e.code() == KafkaError._FATAL]
        _consume_until(twin, lambda _msgs: bool(twin.assignment()), 30)  # a close mid-join can hang (notes)
    finally:
        park(parts.consumer)  # a fenced consumer's close() never returns
        twin.close()
