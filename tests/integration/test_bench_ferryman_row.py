"""The bench's Ferryman row on real clusters: it copies, its dedupers report their commits, its crossing bytes show."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from bench.crossing import CrossingSampler, Endpoint, Link, Side, broker_endpoints, ss_available
from bench.loader import LoadProducer
from bench.records import padding, record_bytes, split_counts
from bench.rows.base import RowContext, RowOptions
from bench.rows.ferryman import FerrymanRow
from bench.verify import LiveWatcher
from tests.helpers.kafka import KafkaCluster, create_topic, wait_until

pytestmark = pytest.mark.integration

_PARTITIONS = 2
_RECORDS = 2_000
_BUDGET_S = 60.0


def test_the_ferryman_row_reports_its_dedupers_commits(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("bench-row")
    create_topic(source_cluster.bootstrap_servers, topic, _PARTITIONS)
    counts = split_counts(_RECORDS, _PARTITIONS)
    load = LoadProducer(source_cluster.bootstrap_servers)
    for p, n in enumerate(counts):
        assert load.produce_run(topic, p, range(n), padding(100)) == n
    load.finish(_BUDGET_S)
    ctx = RowContext(
        unique_name("run"),
        source_cluster.bootstrap_servers,
        destination_cluster.bootstrap_servers,
        (topic,),
        _PARTITIONS,
        tmp_path,
        RowOptions(),
    )
    row = FerrymanRow(ctx)
    row.check()
    assert row.counters() == {"commits": 0.0, "commit_s": 0.0, "commit_flush_s": 0.0}  # nothing launched
    row.launch()
    brokers: dict[Side, frozenset[Endpoint]] = {
        "source": broker_endpoints(source_cluster.bootstrap_servers, _BUDGET_S),
        "destination": broker_endpoints(destination_cluster.bootstrap_servers, _BUDGET_S),
    }
    assert ss_available(), "ss (iproute2) is not installed: scripts/bootstrap installs it"
    crossing = CrossingSampler(row.programs(), row.placement(), brokers)
    try:
        watcher = LiveWatcher(
            destination_cluster.bootstrap_servers,
            [row.destination_topic(topic)],
            counts,
            time.monotonic() + _BUDGET_S,
        )
        assert watcher.done.wait(_BUDGET_S), row.exited()
        watcher.stop(_BUDGET_S)
        assert watcher.tally.unique == _RECORDS
        assert watcher.tally.duplicates == 0
        # The copy is visible, so at least one transaction committed; its status says so.

        def committed() -> Mapping[str, float] | None:
            counters = row.counters()
            return counters if counters["commits"] >= 1 else None

        counters = wait_until(committed, _BUDGET_S, message="the deduper reports a committed transaction")
        assert counters is not None
        assert 0 < counters["commit_flush_s"] < counters["commit_s"]
        # What crosses is the wrapper's: its staging writes carry every record (uncompressed by RowOptions()).
        flows = crossing.read().flows
        staging = flows[Link("ferryman-wrapper", "destination brokers", crosses=True)]
        assert staging.sent_bytes > _RECORDS * record_bytes(100)
        assert Link("ferryman-wrapper", "ferryman-deduper", crosses=True) in flows
        assert not any(link.crosses for link in flows if link.program == "ferryman-deduper")
    finally:
        crossing.stop()
        row.stop(10.0)
