"""The bench's latency runs from the source broker's append time, on a real cluster."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

from bench.latency import SOURCE_TOPIC_CONFIG, measure
from bench.loader import LoadProducer
from bench.records import padding, split_counts
from bench.verify import LiveWatcher
from tests.helpers.kafka import KafkaCluster, create_topic

pytestmark = pytest.mark.integration

_PARTITIONS = 2
_BUDGET_S = 30.0


def _appended_topic(cluster: KafkaCluster, name: str, records: int, *, direct: bool = False) -> list[int]:
    """A LogAppendTime topic holding ``records`` bench records; returns the counts per partition."""
    create_topic(cluster.bootstrap_servers, name, _PARTITIONS, SOURCE_TOPIC_CONFIG)
    counts = split_counts(records, _PARTITIONS)
    load = LoadProducer(cluster.bootstrap_servers, direct=direct)
    assert load.direct is direct
    for p, n in enumerate(counts):
        assert load.produce_run(name, p, range(n), padding(100)) == n
    load.finish(_BUDGET_S)
    return counts


def _watch(cluster: KafkaCluster, topic: str, counts: list[int], latency: int, *, direct: bool) -> LiveWatcher:
    deadline = time.monotonic() + _BUDGET_S
    watcher = LiveWatcher(cluster.bootstrap_servers, [topic], counts, deadline, latency=latency, direct=direct)
    assert watcher.direct is direct  # the compiled reader is built here
    watcher.done.wait(_BUDGET_S)
    watcher.stop(_BUDGET_S)
    return watcher


@pytest.mark.parametrize(
    ("direct", "direct_read"),
    [(False, False), (True, True)],
    ids=["produce-calls-consume", "direct-produce-direct-read"],
)
def test_latencies_are_taken_from_the_append_time_the_records_carry(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str], direct: bool, direct_read: bool
) -> None:
    topic = unique_name("appended")
    before_ms = time.time() * 1000
    counts = _appended_topic(source_cluster, topic, 50, direct=direct)
    watcher = _watch(source_cluster, topic, counts, TIMESTAMP_LOG_APPEND_TIME, direct=direct_read)
    assert watcher.error is None
    assert watcher.tally.complete
    assert len(watcher.latencies_ms) == 50
    # Stamped by the broker after this test started, and visible after that.
    assert all(0 <= lat <= time.time() * 1000 - before_ms for lat in watcher.latencies_ms)


@pytest.mark.parametrize("direct_read", [False, True], ids=["consume", "direct-read"])
def test_copies_stamped_anywhere_else_stop_the_measurement(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str], direct_read: bool
) -> None:
    # What the watcher sees if a replicator's destination topic re-stamped the copies (LogAppendTime there).
    topic = unique_name("restamped")
    counts = _appended_topic(source_cluster, topic, 10)
    watcher = _watch(source_cluster, topic, counts, TIMESTAMP_CREATE_TIME, direct=direct_read)
    assert watcher.error is not None
    assert "timestamp is LogAppendTime, expected CreateTime" in watcher.error
    assert len(watcher.latencies_ms) == 0


def test_the_floor_measures_a_paced_load_from_its_append_time(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("floor")
    create_topic(source_cluster.bootstrap_servers, topic, _PARTITIONS, SOURCE_TOPIC_CONFIG)
    bootstrap = source_cluster.bootstrap_servers
    result = measure(
        bootstrap, bootstrap, topic, topic, partitions=_PARTITIONS, rate=2_000, seconds=1.0, value_bytes=100
    )
    assert result.error is None
    assert result.complete
    assert result.records == 2_000
    assert 0 <= result.p50_ms <= result.p99_ms <= result.max_ms
