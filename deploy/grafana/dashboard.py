"""The Ferryman Grafana dashboard, built in code (grafana-foundation-sdk) and written to ``ferryman.json``.

    python deploy/grafana/dashboard.py           # (re)write deploy/grafana/ferryman.json
    python deploy/grafana/dashboard.py --check   # exit 1 when ferryman.json is not what this builds

Import ``ferryman.json`` into Grafana and pick a Prometheus data source that
scrapes the services (``deploy/prometheus/prometheus.yml``). Every metric
queried here is one the services export: ``tests/contract/
test_grafana_dashboard.py`` checks it against the collectors themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueGraphMode, LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, VariableRefresh

OUTPUT = Path(__file__).with_name("ferryman.json")
UID = "ferryman-replication"

_DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Every Ferryman series of the selected flows (each family carries a ``flow`` label).
_FLOW = 'flow=~"$flow"'
#: Process metrics have no flow label: every Ferryman process that Prometheus scrapes.
_JOBS = 'job=~"ferryman-.*"'
_RATE = "[$__rate_interval]"
#: The end-to-end latency histogram's buckets per flow, for histogram_quantile.
_LATENCY_BUCKETS = f"sum by (flow, le) (rate(ferryman_deduper_end_to_end_latency_seconds_bucket{{{_FLOW}}}{_RATE}))"


def _query(expr: str, legend: str = "", ref: str = "A") -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(_DATASOURCE)


def _timeseries(title: str, unit: str, description: str, *queries: Dataquery, span: int = 8) -> Timeseries:
    panel = Timeseries().title(title).description(description).unit(unit).span(span).height(8)
    legend = VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
    panel = (
        panel.datasource(_DATASOURCE).fill_opacity(10).line_width(1).legend(legend.placement(LegendPlacement.BOTTOM))
    )
    for query in queries:
        panel = panel.with_target(query)
    return panel


def _stat(title: str, unit: str, description: str, query: Dataquery, span: int = 4) -> Stat:
    panel = Stat().title(title).description(description).unit(unit).span(span).height(4).datasource(_DATASOURCE)
    # The latest value, with its trend drawn behind it.
    panel = panel.reduce_options(ReduceDataOptions().calcs(["lastNotNull"])).graph_mode(BigValueGraphMode.AREA)
    return panel.with_target(query)


def _overview() -> list[Stat]:
    return [
        _stat(
            "Records written / s",
            "rps",
            "Records the dedupers write to destination topics.",
            _query(f"sum(rate(ferryman_deduper_records_written_total{{{_FLOW}}}{_RATE}))"),
        ),
        _stat(
            "Duplicates dropped",
            "short",
            "Source records dropped as already replicated, over the time range.",
            _query(f"sum(increase(ferryman_deduper_duplicates_dropped_total{{{_FLOW}}}[$__range]))"),
        ),
        _stat(
            "Gaps detected",
            "short",
            "Envelopes that did not follow their partition's watermark, over the time range.",
            _query(f"sum(increase(ferryman_deduper_gaps_detected_total{{{_FLOW}}}[$__range]))"),
        ),
        _stat(
            "Max lag",
            "s",
            "Age of the oldest source record not yet committed at the destination, worst partition.",
            _query(f"max(ferryman_deduper_lag_seconds{{{_FLOW}}})"),
        ),
        _stat(
            "p99 latency",
            "s",
            "99th percentile of the end-to-end latency (source timestamp to destination commit), all selected flows.",
            _query(
                "histogram_quantile(0.99, sum by (le) "
                f"(rate(ferryman_deduper_end_to_end_latency_seconds_bucket{{{_FLOW}}}{_RATE})))"
            ),
        ),
        _stat(
            "Dedupers not serving",
            "short",
            "Dedupers that report NOT_SERVING (destination unreachable or recovering).",
            _query(f"count(ferryman_deduper_serving{{{_FLOW}}} == 0) or vector(0)"),
        ),
        _stat(
            "Control links down",
            "short",
            "Wrappers with a control link configured and not connected.",
            _query(f"count(ferryman_wrapper_control_connected{{{_FLOW}}} == 0) or vector(0)"),
        ),
        _stat(
            "Partitions held at a record",
            "short",
            "Partitions that wait at one record: the destination refuses it (the deduper holds its staging "
            "partition; ferryman_deduper_refused_record names it) or it is too large to stage (the wrapper holds "
            "its partition).",
            _query(
                f"(count(ferryman_deduper_refused_record{{{_FLOW}}} == 1) or vector(0)) "
                f"+ (count(ferryman_wrapper_held_offset{{{_FLOW}}} >= 0) or vector(0))"
            ),
        ),
        _stat(
            "Audits violated",
            "short",
            "Source partitions whose last audit (ferryman audit) found a fault; `ferryman audit show` has them.",
            _query(
                f"count(max by (flow, topic, partition) (ferryman_deduper_audit_violated{{{_FLOW}}}) == 1) or vector(0)"
            ),
        ),
    ]


def _throughput() -> list[Timeseries]:
    return [
        _timeseries(
            "Records / s",
            "rps",
            "Wrapped into staging by the wrappers, written to the destination by the dedupers.",
            _query(f"sum by (flow) (rate(ferryman_wrapper_records_sent_total{{{_FLOW}}}{_RATE}))", "wrapped {{flow}}"),
            _query(
                f"sum by (flow) (rate(ferryman_deduper_records_written_total{{{_FLOW}}}{_RATE}))",
                "written {{flow}}",
                "B",
            ),
        ),
        _timeseries(
            "Duplicates dropped / s",
            "rps",
            "Replays the dedupers dropped: a wrapper restart or rewind re-sends what it had not committed.",
            _query(f"sum by (instance) (rate(ferryman_deduper_duplicates_dropped_total{{{_FLOW}}}{_RATE}))"),
        ),
        _timeseries(
            "Gaps",
            "short",
            "Gap detections (each envelope that arrives while a gap is open) and gaps healed by resends.",
            _query(f"sum by (instance) (increase(ferryman_deduper_gaps_detected_total{{{_FLOW}}}{_RATE}))", "detected"),
            _query(
                f"sum by (instance) (increase(ferryman_deduper_gaps_healed_total{{{_FLOW}}}{_RATE}))", "healed", "B"
            ),
        ),
    ]


def _lag() -> list[Timeseries]:
    return [
        _timeseries(
            "Lag (records), destination",
            "short",
            "Source records not yet committed at the destination, per partition (from the wrappers' progress).",
            _query(f"ferryman_deduper_lag_records{{{_FLOW}}}", "{{topic}}-{{partition}}"),
        ),
        _timeseries(
            "Lag (seconds), destination",
            "s",
            "Age of the oldest source record not yet committed, per partition (resolution: the scrape interval).",
            _query(f"ferryman_deduper_lag_seconds{{{_FLOW}}}", "{{topic}}-{{partition}}"),
        ),
        _timeseries(
            "End-to-end latency",
            "s",
            "Per committed record, source timestamp to destination commit (LogAppendTime topics: the source "
            "append; CreateTime: the producer's timestamp, so its delay and clock skew count): p50 and p99 over "
            "the interval, by flow.",
            _query(f"histogram_quantile(0.5, {_LATENCY_BUCKETS})", "p50 {{flow}}"),
            _query(f"histogram_quantile(0.99, {_LATENCY_BUCKETS})", "p99 {{flow}}", "B"),
        ),
        _timeseries(
            "Lag (records), staging",
            "short",
            "Source records not yet wrapped into staging, per partition.",
            _query(f"ferryman_wrapper_lag_records{{{_FLOW}}}", "{{topic}}-{{partition}}"),
        ),
    ]


def _transactions() -> list[Timeseries]:
    summary = "ferryman_deduper_commit_duration_seconds"
    return [
        _timeseries(
            "Transactions / s",
            "ops",
            "Kafka transactions committed and aborted by the dedupers.",
            _query(f"sum by (outcome) (rate(ferryman_deduper_transactions_total{{{_FLOW}}}{_RATE}))", "{{outcome}}"),
        ),
        _timeseries(
            "Commit duration",
            "s",
            "Wall time of a commit, which stops the deduper's loop: mean over the interval, and median and "
            "maximum of the last 256 commits.",
            _query(
                f"sum by (instance) (rate({summary}_sum{{{_FLOW}}}{_RATE})) / "
                f"sum by (instance) (rate({summary}_count{{{_FLOW}}}{_RATE}))",
                "mean {{instance}}",
            ),
            _query(f'{summary}{{{_FLOW},quantile="0.5"}}', "p50 {{instance}}", "B"),
            _query(f'{summary}{{{_FLOW},quantile="1"}}', "max {{instance}}", "C"),
        ),
        _timeseries(
            "Share of time committing",
            "percentunit",
            "Part of each second the deduper's loop spends committing, and in that the flush of records.",
            _query(f"sum by (instance) (rate({summary}_sum{{{_FLOW}}}{_RATE}))", "commit {{instance}}"),
            _query(
                f"sum by (instance) (rate(ferryman_deduper_commit_flush_seconds_total{{{_FLOW}}}{_RATE}))",
                "flush {{instance}}",
                "B",
            ),
        ),
    ]


def _health() -> list[Timeseries]:
    return [
        _timeseries(
            "Serving",
            "short",
            "1 while a process serves, 0 while NOT_SERVING (the reason is in its status and log).",
            _query(f"ferryman_deduper_serving{{{_FLOW}}}", "deduper {{instance}}"),
            _query(f"ferryman_wrapper_serving{{{_FLOW}}}", "wrapper {{instance}}", "B"),
        ),
        _timeseries(
            "Control link and backpressure",
            "short",
            "Wrappers: control link up (1/0) and paused by backpressure (1/0); dedupers: wrappers connected.",
            _query(f"ferryman_wrapper_control_connected{{{_FLOW}}}", "link {{instance}}"),
            _query(f"ferryman_wrapper_paused{{{_FLOW}}}", "paused {{instance}}", "B"),
            _query(f"ferryman_deduper_connected_wrappers{{{_FLOW}}}", "connected to {{instance}}", "C"),
        ),
        _timeseries(
            "Recoveries",
            "short",
            "Producer rebuilds, abandoned (wedged) calls and wrapper rewinds, per interval.",
            _query(
                f"sum by (instance) (increase(ferryman_deduper_producer_rebuilds_total{{{_FLOW}}}{_RATE}))",
                "deduper rebuilds {{instance}}",
            ),
            _query(
                f"sum by (instance) (increase(ferryman_deduper_wedged_calls_total{{{_FLOW}}}{_RATE}))",
                "wedged {{instance}}",
                "B",
            ),
            _query(
                f"sum by (instance) (increase(ferryman_wrapper_rewinds_total{{{_FLOW}}}{_RATE}))",
                "rewinds {{instance}}",
                "C",
            ),
            _query(
                f"sum by (instance) (increase(ferryman_wrapper_producer_rebuilds_total{{{_FLOW}}}{_RATE}))",
                "wrapper rebuilds {{instance}}",
                "D",
            ),
        ),
    ]


def _groups() -> list[Timeseries]:
    return [
        _timeseries(
            "Group offset syncs",
            "short",
            "Consumer-group offsets synced at the destination (flows[].sync_group_offsets), per interval, by "
            "outcome: committed, unchanged, active (the group has members there: left alone), failed (retried).",
            _query(
                f"sum by (outcome) (increase(ferryman_deduper_group_offset_syncs_total{{{_FLOW}}}{_RATE}))",
                "{{outcome}}",
            ),
            span=24,
        ),
    ]


def _process() -> list[Timeseries]:
    return [
        _timeseries(
            "CPU",
            "percentunit",
            "CPU of each Ferryman process (cores).",
            _query(f"rate(process_cpu_seconds_total{{{_JOBS}}}{_RATE})", "{{job}} {{instance}}"),
            span=12,
        ),
        _timeseries(
            "Resident memory",
            "bytes",
            "Resident set size of each Ferryman process.",
            _query(f"process_resident_memory_bytes{{{_JOBS}}}", "{{job}} {{instance}}"),
            span=12,
        ),
    ]


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    dashboard = (
        Dashboard("Ferryman replication")
        .uid(UID)
        .description("Exactly-once replication between Kafka clusters: throughput, lag, duplicates, transactions.")
        .tags(["ferryman", "kafka", "replication"])
        .refresh("30s")
        .time("now-1h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            QueryVariable("flow")
            .label("Flow")
            .datasource(_DATASOURCE)
            .query("label_values(ferryman_deduper_info, flow)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    panel_id = 0
    for title, panels in (
        ("Overview", _overview()),
        ("Throughput and duplicates", _throughput()),
        ("Lag and latency", _lag()),
        ("Transactions", _transactions()),
        ("Health", _health()),
        ("Consumer groups", _groups()),
        ("Processes", _process()),
    ):
        panel_id += 1
        dashboard = dashboard.with_row(Row(title).id(panel_id))
        for panel in panels:
            panel_id += 1  # unique ids: Grafana links and repeats name panels by id
            dashboard = dashboard.with_panel(panel.id(panel_id))
    encoded: dict[str, Any] = json.loads(JSONEncoder().encode(dashboard.build()))
    return encoded


def render() -> str:
    """The JSON text written to OUTPUT (stable: sorted keys, two-space indent, final newline)."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write OUTPUT, or with --check report whether it is up to date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {OUTPUT.name} differs from the build")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).relative_to(Path.cwd())}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
