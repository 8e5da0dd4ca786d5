"""Cluster reachability: one log line per state change (ferryman.health) and librdkafka's log (ferryman.kafka_log)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from ferryman.config import ClusterConfig
from ferryman.errors import ClusterUnreachableError
from ferryman.health import (
    PROBE_TIMEOUT_S,
    STILL_DOWN_LOG_INTERVAL_S,
    ClusterHealth,
    StuckRecovery,
    wait_until_reachable,
)
from ferryman.kafka_log import REPEAT_INTERVAL_S, LibrdkafkaLog

CLUSTER = ClusterConfig(bootstrap_servers="kafka-b:9092")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_logged_once_then_periodically_then_once_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    changes: list[bool] = []
    health = ClusterHealth("backup", CLUSTER, on_change=lambda: changes.append(health.reachable), clock=clock)
    caplog.set_level(logging.WARNING, logger="ferryman.health")
    for _ in range(50):
        health.down("all brokers down")
        health.tick()
    assert not health.reachable
    assert health.reason == "all brokers down"
    clock.now += STILL_DOWN_LOG_INTERVAL_S
    health.tick()
    health.tick()
    clock.now += 2.5
    health.up()
    health.up()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "cluster 'backup' (kafka-b:9092) is unreachable: all brokers down; waiting it out",
        f"cluster 'backup' (kafka-b:9092) still unreachable after {STILL_DOWN_LOG_INTERVAL_S:.0f} s: all brokers down",
        f"cluster 'backup' (kafka-b:9092) is back after {STILL_DOWN_LOG_INTERVAL_S + 2.5:.1f} s",
    ]
    assert changes == [False, True]
    assert health.outages == 1
    assert health.last_outage_s == pytest.approx(STILL_DOWN_LOG_INTERVAL_S + 2.5)


def test_client_errors_all_brokers_down_is_an_outage_a_failed_connection_is_noise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = ClusterHealth("backup", CLUSTER)
    caplog.set_level(logging.WARNING, logger="ferryman.health")
    health.client_error(KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9092 failed"), "producer")
    assert health.reachable
    assert caplog.records == []
    health.client_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"), "producer")
    assert not health.reachable
    health.client_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"), "producer")
    assert "denied" in caplog.records[-1].getMessage()


def test_a_client_error_repeated_is_warned_of_once_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    """A consumer of a deleted topic reports the same error ~60 times a second: one warning per interval."""
    now = [0.0]
    health = ClusterHealth("dst", CLUSTER, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="ferryman.health")
    lost = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "Failed to query logical offset BEGINNING")
    for _ in range(100):  # 10 s of it
        health.client_error(lost, "staging consumer")
        now[0] += 0.1
    health.client_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"), "staging consumer")
    health.client_error(lost, "producer")  # another client: its own first warning
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "staging consumer" in messages[0] and "logical offset" in messages[0]
    assert "denied" in messages[1]
    assert "producer" in messages[2] and "more like it" not in messages[2]

    now[0] += STILL_DOWN_LOG_INTERVAL_S
    health.client_error(lost, "staging consumer")
    assert caplog.records[-1].getMessage().endswith("(99 more like it in the 40 s before)")
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_an_unreachable_cluster_at_start_up_is_one_error_naming_it_and_the_setting() -> None:
    # A loopback port nothing listens on: refused at once, the whole deadline spent retrying.
    conf: dict[str, object] = {"bootstrap.servers": "127.0.0.1:1", "logger": LibrdkafkaLog("127.0.0.1:1")}
    admin = AdminClient(conf)  # type: ignore[arg-type]  # the stubs do not know the logger property
    with pytest.raises(ClusterUnreachableError) as caught:
        wait_until_reachable(admin, "source", ClusterConfig(bootstrap_servers="127.0.0.1:1"), deadline_s=1.5)
    message = str(caught.value)
    assert "cluster 'source' (127.0.0.1:1)" in message
    assert "startup_timeout_s" in message


def test_librdkafka_connection_lines_go_to_debug_and_repeats_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    log = LibrdkafkaLog("kafka-b:9092")
    caplog.set_level(logging.DEBUG, logger="ferryman.librdkafka")
    fmt = "%s [%s] %s"
    log.log(logging.ERROR, fmt, "FAIL", "rdkafka#producer-1", "Connect to ipv4#127.0.0.1:9092 failed")
    assert caplog.records[-1].levelno == logging.DEBUG
    for i in range(5):
        log.log(logging.WARNING, fmt, "SESSTMOUT", "rdkafka#consumer-2", f"session timed out after {1000 + i} ms")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # the four repeats are held back


def test_a_producer_property_ignored_by_a_consumer_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = LibrdkafkaLog("kafka-b:9092")
    caplog.set_level(logging.DEBUG, logger="ferryman.librdkafka")
    ignored = "Configuration property message.timeout.ms is a producer property and will be ignored by this consumer"
    log.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#consumer-3", ignored)
    log.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "Configuration property x is deprecated")
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]


def test_a_held_back_repeat_is_logged_again_with_its_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr("ferryman.kafka_log.time.monotonic", clock)
    log = LibrdkafkaLog("kafka-b:9092")
    caplog.set_level(logging.WARNING, logger="ferryman.librdkafka")
    for _ in range(3):
        log.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "c", "session timed out after 10013 ms")
    clock.now += REPEAT_INTERVAL_S
    log.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "c", "session timed out after 10020 ms")
    assert [r.getMessage().endswith("(and 2 more like it in the last 30 s)") for r in caplog.records] == [False, True]


def test_while_down_the_cluster_is_probed_every_interval_and_an_answer_brings_it_back() -> None:
    """With nothing flowing (wrappers paused because the destination was down) only a probe shows it is back."""
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from ferryman.health import PROBE_INTERVAL_S  # noqa: PLC0415

    clock = Clock()
    health = ClusterHealth("backup", CLUSTER, clock=clock)
    asked: list[float] = []
    answers = iter([False, True])

    def ask(timeout_s: float) -> None:
        asked.append(timeout_s)
        if not next(answers):
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker"))

    health.probe(ask)
    assert asked == []  # up: nothing to ask
    health.down("all brokers down")
    health.probe(ask)
    health.probe(ask)  # not yet due again
    assert len(asked) == 1 and not health.reachable
    clock.now += PROBE_INTERVAL_S
    health.probe(ask)
    assert len(asked) == 2 and health.reachable


def test_a_recovery_is_stuck_after_its_window_only_while_the_clusters_answer() -> None:
    now = [0.0]
    answers = [True]
    asked: list[float] = []

    def ask(timeout_s: float) -> None:
        asked.append(timeout_s)
        if not answers[0]:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    stuck = StuckRecovery(after_s=60.0, clock=lambda: now[0])
    assert stuck.failed(ask) == 0.0  # the first failure opens the window
    now[0] = 59.0
    assert stuck.failed(ask) == 0.0
    assert asked == []  # inside the window nothing is asked
    now[0] = 61.0
    answers[0] = False
    assert stuck.failed(ask) == 0.0  # a cluster is away: an outage, waited out
    answers[0] = True
    now[0] = 65.0
    assert stuck.failed(ask) == 65.0
    assert asked == [PROBE_TIMEOUT_S, PROBE_TIMEOUT_S]
    now[0] = 70.0
    assert stuck.failed(ask) == 0.0  # a new window from the replacement
    now[0] = 126.0
    assert stuck.failed(ask) == 61.0
    stuck.recovered()
    now[0] = 300.0
    assert stuck.failed(ask) == 0.0  # a new recovery, a new window
