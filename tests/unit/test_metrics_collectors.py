"""The services' collectors: status snapshots in, Prometheus families out (names, values, labels)."""

from __future__ import annotations

from functools import partial

import pytest
from ferryman.metrics.collectors import DeduperCollector, WrapperCollector
from ferryman.v1 import control_pb2
from prometheus_client.registry import Collector

from tests.helpers.metrics import deduper_status, metric_names_in, sample_names, wrapper_status


def _values(collector: Collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one collect(), by name and sorted labels (without the flow label)."""
    out = {}
    for family in collector.collect():
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "flow"))
            out[(s.name, labels)] = s.value
    return out


def test_deduper_counters_and_gauges_are_the_status_figures() -> None:
    values = _values(DeduperCollector(deduper_status))
    assert values[("ferryman_deduper_records_written_total", ())] == 1000
    assert values[("ferryman_deduper_duplicates_dropped_total", ())] == 7
    assert values[("ferryman_deduper_gaps_detected_total", ())] == 2
    assert values[("ferryman_deduper_gaps_healed_total", ())] == 1
    assert values[("ferryman_deduper_transactions_total", (("outcome", "committed"),))] == 40
    assert values[("ferryman_deduper_transactions_total", (("outcome", "aborted"),))] == 3
    assert values[("ferryman_deduper_commit_duration_seconds", (("quantile", "0.5"),))] == pytest.approx(0.03)
    assert values[("ferryman_deduper_commit_duration_seconds", (("quantile", "1"),))] == pytest.approx(0.12)
    assert values[("ferryman_deduper_commit_duration_seconds_sum", ())] == pytest.approx(1.6)
    assert values[("ferryman_deduper_commit_duration_seconds_count", ())] == 40
    assert values[("ferryman_deduper_commit_flush_seconds_total", ())] == pytest.approx(0.2)
    assert values[("ferryman_deduper_producer_rebuilds_total", ())] == 1
    assert values[("ferryman_deduper_wedged_calls_total", ())] == 1
    assert values[("ferryman_deduper_connected_wrappers", ())] == 2
    assert values[("ferryman_deduper_serving", ())] == 1


def test_deduper_partitions_report_watermark_and_lag_where_known() -> None:
    values = _values(DeduperCollector(deduper_status, clock=lambda: 100.0))
    p0 = (("partition", "0"), ("topic", "t"))
    p1 = (("partition", "1"), ("topic", "t"))
    assert values[("ferryman_deduper_watermark_offset", p0)] == 499
    assert values[("ferryman_deduper_watermark_offset", p1)] == -1
    assert values[("ferryman_deduper_lag_records", p0)] == 25
    assert values[("ferryman_deduper_lag_seconds", p0)] == 0.0  # first sight: a lower bound
    # Lag unknown (no wrapper reported the log end): no lag series rather than a made-up one.
    assert ("ferryman_deduper_lag_records", p1) not in values
    assert ("ferryman_deduper_lag_seconds", p1) not in values


def test_deduper_exports_the_last_audit_verdict_of_each_audited_partition() -> None:
    clean = control_pb2.AuditVerdict(topic="t", partition=1, verdict="EXACTLY_ONCE", finished_at_ms=1_700_000_100_000)
    values = _values(DeduperCollector(lambda: deduper_status(audit_verdicts=[*deduper_status().audit_verdicts, clean])))
    p0, p1 = (("partition", "0"), ("topic", "t")), (("partition", "1"), ("topic", "t"))
    assert values[("ferryman_deduper_audit_violated", p0)] == 1
    assert values[("ferryman_deduper_audit_violated", p1)] == 0
    assert values[("ferryman_deduper_audit_finished_timestamp_seconds", p1)] == pytest.approx(1_700_000_100.0)
    unaudited = _values(DeduperCollector(lambda: deduper_status(audit_verdicts=[])))
    assert not [k for k in unaudited if k[0].startswith("ferryman_deduper_audit_")]


def test_deduper_lag_seconds_grows_while_the_watermark_stands_still() -> None:
    now = [100.0]
    collector = DeduperCollector(deduper_status, clock=lambda: now[0])
    _values(collector)
    now[0] = 130.0
    assert _values(collector)[("ferryman_deduper_lag_seconds", (("partition", "0"), ("topic", "t")))] == 30.0


def test_a_refused_record_is_one_series_naming_its_destination_partition_and_error() -> None:
    refused = (("error", "INVALID_RECORD"), ("partition", "0"), ("topic", "src.t"))
    assert _values(DeduperCollector(deduper_status))[("ferryman_deduper_refused_record", refused)] == 1
    unnamed = control_pb2.RefusedRecord(topic="", partition=-1, error="MSG_SIZE_TOO_LARGE")
    values = _values(DeduperCollector(lambda: deduper_status(refused_record=unnamed)))
    refused = (("error", "MSG_SIZE_TOO_LARGE"), ("partition", "-1"), ("topic", ""))
    assert values[("ferryman_deduper_refused_record", refused)] == 1
    nothing = _values(DeduperCollector(lambda: deduper_status(refused_record=None)))
    assert not [k for k in nothing if k[0] == "ferryman_deduper_refused_record"]


def test_every_held_staging_partitions_refusal_is_a_series_of_its_own() -> None:
    def held(topic: str, partition: int) -> control_pb2.HeldStagingPartition:
        refused = control_pb2.RefusedRecord(topic=topic, partition=partition, error="MSG_SIZE_TOO_LARGE")
        return control_pb2.HeldStagingPartition(staging_partition=partition, refused_record=refused)

    holds = [held("src.a", 0), held("src.b", 3)]
    # refused_record names the first hold too: one series for it, not two.
    status = partial(deduper_status, refused_record=holds[0].refused_record, held_staging_partitions=holds)
    series = {k[1] for k in _values(DeduperCollector(status)) if k[0] == "ferryman_deduper_refused_record"}
    assert series == {
        (("error", "MSG_SIZE_TOO_LARGE"), ("partition", "0"), ("topic", "src.a")),
        (("error", "MSG_SIZE_TOO_LARGE"), ("partition", "3"), ("topic", "src.b")),
    }


def test_not_serving_is_zero_and_the_reason_is_no_label() -> None:
    collector = DeduperCollector(lambda: deduper_status(unavailable_reason="destination cluster unavailable"))
    families = {f.name: f for f in collector.collect()}
    (sample,) = families["ferryman_deduper_serving"].samples
    assert sample.value == 0
    assert set(sample.labels) == {"flow"}


def test_deduper_identity_is_only_on_the_info_family() -> None:
    families = list(DeduperCollector(deduper_status).collect())
    for family in families:
        for s in family.samples:
            if family.name == "ferryman_deduper":
                assert s.labels["deduper_id"] == "d1"
                assert s.labels["flow"] == "orders"
            else:
                assert "deduper_id" not in s.labels


def test_deduper_before_its_first_status_has_no_partition_series() -> None:
    names = sample_names(DeduperCollector(lambda: control_pb2.GetDeduperStatusResponse(flow="f")))
    assert "ferryman_deduper_records_written_total" in names
    assert "ferryman_deduper_lag_records" not in names


def test_wrapper_counters_and_state() -> None:
    values = _values(WrapperCollector(wrapper_status, control_link=True))
    assert values[("ferryman_wrapper_records_sent_total", ())] == 1200
    assert values[("ferryman_wrapper_envelopes_sent_total", ())] == 12
    assert values[("ferryman_wrapper_rewinds_total", ())] == 1
    assert values[("ferryman_wrapper_resends_served_total", ())] == 2
    assert values[("ferryman_wrapper_producer_rebuilds_total", ())] == 1
    assert values[("ferryman_wrapper_paused", ())] == 1
    assert values[("ferryman_wrapper_control_connected", ())] == 1
    assert values[("ferryman_wrapper_serving", ())] == 1


def test_wrapper_partitions() -> None:
    values = _values(WrapperCollector(wrapper_status, control_link=True))
    p0 = (("partition", "0"), ("topic", "t"))
    p1 = (("partition", "1"), ("topic", "t"))
    assert values[("ferryman_wrapper_source_end_offset", p0)] == 600
    assert values[("ferryman_wrapper_wrapped_offset", p0)] == 599
    assert values[("ferryman_wrapper_lag_records", p0)] == 0
    assert values[("ferryman_wrapper_lag_seconds", p0)] == 0
    assert values[("ferryman_wrapper_wrapped_offset", p1)] == -1
    assert ("ferryman_wrapper_source_end_offset", p1) not in values
    assert ("ferryman_wrapper_lag_records", p1) not in values
    assert values[("ferryman_wrapper_held_offset", p1)] == 42  # a record too large to stage holds it
    assert ("ferryman_wrapper_held_offset", p0) not in values


def test_wrapper_without_a_control_link_exports_no_link_state() -> None:
    # A link that is not configured is not "down": no series, so no alert.
    names = sample_names(WrapperCollector(wrapper_status, control_link=False))
    assert "ferryman_wrapper_control_connected" not in names
    assert "ferryman_wrapper_records_sent_total" in names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("rate(ferryman_deduper_records_written_total[5m])", {"ferryman_deduper_records_written_total"}),
        (
            'sum by (flow) (ferryman_deduper_lag_records{flow=~"$flow"}) > 1e3',
            {"ferryman_deduper_lag_records"},
        ),
        (
            "histogram_quantile(0.99, sum(rate(a_bucket[$__rate_interval])) by (le)) / on (instance) b_info",
            {"a_bucket", "b_info"},
        ),
        ("ferryman_wrapper_paused == 1 and ignoring(x) up offset 5m", {"ferryman_wrapper_paused", "up"}),
    ],
)
def test_metric_names_in_promql(expr: str, names: set[str]) -> None:
    assert metric_names_in(expr) == names
