"""A real Prometheus scrapes a real wrapper and deduper: its figures are what happened on the clusters."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from ferryman import envelope
from ferryman.metrics._latency import DEFAULT_BOUNDS_S
from ferryman_local import LocalPrometheus, reserve_port

from tests.helpers.grpc_clients import local, start_linked_pair
from tests.helpers.kafka import KafkaCluster, assert_sequences, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.prometheus import running_prometheus

pytestmark = pytest.mark.integration

PARTITIONS = 3
STAGING_PARTITIONS = 6
PER_PARTITION = 400
#: Records per envelope: small, so the planted duplicate is one envelope of a known size among several.
ENVELOPE_RECORDS = 50
#: Scrape and evaluation interval of the test's Prometheus: a figure shows within ~2 intervals.
SCRAPE_S = 1.0
#: Longest wait for a figure to reach Prometheus (several scrapes, plus a commit on a busy 2-core machine).
SEEN_TIMEOUT_S = 20.0


def _settles_at(prom: LocalPrometheus, expr: str, expected: float) -> None:
    """Wait until Prometheus reports expected for expr (one series)."""
    last: list[float | None] = [None]

    def reached() -> bool:
        last[0] = prom.value(expr)
        return last[0] == expected

    try:
        wait_until(reached, SEEN_TIMEOUT_S, interval_s=0.25, message=expr)
    except AssertionError as exc:
        raise AssertionError(f"{expr}: Prometheus says {last[0]}, expected {expected}") from exc


def _latency_is_sane(prom: LocalPrometheus, committed: int, produced_from: float) -> None:
    """One latency observation per committed record, each no older than the test's first record."""
    name = "ferryman_deduper_end_to_end_latency_seconds"
    _settles_at(prom, f"{name}_count", committed)
    mean = prom.value(f"{name}_sum / {name}_count")
    p50 = prom.value(f"histogram_quantile(0.5, sum by (le) ({name}_bucket))")
    p99 = prom.value(f"histogram_quantile(0.99, sum by (le) ({name}_bucket))")
    assert mean is not None and p50 is not None and p99 is not None
    # Timestamps are CreateTime from this host's producer, commits this host's clock: no skew.
    oldest = time.time() - produced_from
    assert 0 < mean <= oldest, (mean, oldest)
    assert 0 < p50 <= p99, (p50, p99)
    # histogram_quantile interpolates inside the bucket that holds the p99: at most that bucket's bound.
    assert p99 <= min(b for b in (*DEFAULT_BOUNDS_S, float("inf")) if b >= oldest), (p99, oldest)


def _per_partition(prom: LocalPrometheus, expr: str) -> dict[int, float]:
    return {int(r["metric"]["partition"]): float(r["value"][1]) for r in prom.query(expr)}


def test_prometheus_counts_what_was_replicated_and_a_planted_duplicate_once(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("metrics")
    flow = unique_name("flow")
    dst_topic = f"src.{topic}"
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    produced_from = time.time()
    expected = produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, PER_PARTITION)
    wport, dport = reserve_port(), reserve_port()
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=flow,
        topics=[topic],
        staging_partitions=STAGING_PARTITIONS,
        wrapper={"metrics_address": local(wport), "envelope_max_records": ENVELOPE_RECORDS},
        deduper={"metrics_address": local(dport)},
    )
    jobs = {"ferryman-wrapper": [local(wport)], "ferryman-deduper": [local(dport)]}
    try:
        with running_prometheus(tmp_path / "prometheus", jobs, scrape_interval_s=SCRAPE_S) as prom:
            total = PARTITIONS * PER_PARTITION
            copied = read_all(destination_cluster.bootstrap_servers, dst_topic, expected=total, timeout_s=60)
            assert_sequences(copied, expected)

            # What a separate consumer sees is what the deduper says it wrote, as Prometheus scraped it.
            _settles_at(prom, "ferryman_deduper_records_written_total", total)
            _latency_is_sane(prom, total, produced_from)
            all_up = {job: ["up"] for job in jobs}
            wait_until(lambda: prom.target_health() == all_up, SEEN_TIMEOUT_S, message="both targets up")
            assert prom.value("ferryman_deduper_serving") == 1
            assert prom.value("ferryman_wrapper_serving") == 1
            sent = prom.value("ferryman_wrapper_records_sent_total")
            assert sent is not None
            assert sent >= total  # a rewind would re-send some
            _settles_at(prom, "ferryman_wrapper_control_connected", 1)
            _settles_at(prom, "ferryman_deduper_connected_wrappers", 1)

            # Caught up: every partition's watermark is its last offset, and its lag is zero.
            last_offsets = {p: float(len(values) - 1) for p, values in expected.items()}
            wait_until(
                lambda: _per_partition(prom, "ferryman_deduper_watermark_offset") == last_offsets,
                SEEN_TIMEOUT_S,
                message="watermarks in Prometheus",
            )
            wait_until(
                lambda: _per_partition(prom, "ferryman_deduper_lag_records") == dict.fromkeys(expected, 0.0),
                SEEN_TIMEOUT_S,
                message="zero lag in Prometheus",
            )
            source_ends = {p: float(len(values)) for p, values in expected.items()}
            wait_until(
                lambda: _per_partition(prom, "ferryman_wrapper_source_end_offset") == source_ends,
                SEEN_TIMEOUT_S,
                message="source log-end offsets in Prometheus",
            )
            wait_until(
                lambda: _per_partition(prom, "ferryman_deduper_lag_seconds") == dict.fromkeys(expected, 0.0),
                SEEN_TIMEOUT_S,
                message="zero lag in seconds in Prometheus",
            )

            # Plant a duplicate: one envelope of partition 1 written to staging a second time.
            baseline = prom.value("ferryman_deduper_duplicates_dropped_total")
            assert baseline is not None
            staging = f"ferryman.{flow}.staging.internal"
            staging_partition = envelope.staging_partition(topic, 1, STAGING_PARTITIONS)
            replayed = read_all(destination_cluster.bootstrap_servers, staging)[staging_partition][0]
            planted = len(envelope.decode(replayed.value).run)  # up to ENVELOPE_RECORDS (batch boundaries)
            producer = Producer({"bootstrap.servers": destination_cluster.bootstrap_servers})
            producer.produce(staging, value=replayed.value, key=replayed.key, partition=staging_partition)
            assert producer.flush(30) == 0
            # Records after it in the same staging partition: once they are written, the duplicate was dealt with.
            more = produce_sequences(source_cluster.bootstrap_servers, topic, [1], 10, start=PER_PARTITION)
            expected[1] += more[1]
            copied = read_all(destination_cluster.bootstrap_servers, dst_topic, expected=total + 10, timeout_s=60)
            assert_sequences(copied, expected)

            _settles_at(prom, "ferryman_deduper_records_written_total", total + 10)
            # Counted once, as the records it carried, and not written: the consumer saw no extra copy above.
            assert prom.value("ferryman_deduper_duplicates_dropped_total") == baseline + planted
            # The duplicate's records were not committed again: they are not in the latency histogram either.
            _latency_is_sane(prom, total + 10, produced_from)
    finally:
        pair.stop()


def test_a_relative_work_dir_starts_prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's default --dir is relative; the server runs inside it, so its paths must not be (they doubled)."""
    monkeypatch.chdir(tmp_path)
    with LocalPrometheus.start(Path("demo") / "prometheus", {"nothing": [f"127.0.0.1:{reserve_port()}"]}) as prom:
        assert prom.work_dir.is_absolute() and (tmp_path / "demo" / "prometheus" / "prometheus.yml").exists()
        assert [s["value"][1] for s in prom.query("vector(1)")] == ["1"]  # it answers queries
