"""The bench's report: the machine's load beside each latency, the no-replicator floor, the rounds."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from bench import config, log, replication
from bench.latency import LatencyResult, percentile
from bench.machine import ReclaimScheme
from bench.measure import Usage
from bench.report import FLOOR_ROW, footnotes, latency_table, observability_table, rounds_table, write_json
from bench.results import RowResult, Throughput


def _latency(
    *,
    busy: float,
    generator: float = 0.4,
    reader: float = 0.3,
    visible: int = 1000,
    replicator_cpu_s: float = math.nan,
    achieved_rate: float = 149_990.0,
) -> LatencyResult:
    return LatencyResult(
        offered_rate=150_000.0,
        achieved_rate=achieved_rate,
        records=1000,
        visible=visible,
        duplicates=0,
        p50_ms=180.0,
        p99_ms=420.0,
        max_ms=510.0,
        machine_busy_cores=busy,
        generator_cores=generator,
        reader_cores=reader,
        replicator_cpu_s=replicator_cpu_s,
    )


def _row(name: str, lat: LatencyResult) -> RowResult:
    result = RowResult(name, exactly_once=True)
    result.latency = lat
    return result


def test_the_load_and_the_reader_are_counted_as_the_rigs_share() -> None:
    assert _latency(busy=1.2, generator=0.42, reader=0.33).rig_cores == 0.42 + 0.33


def test_the_floor_is_the_last_line_and_every_line_shows_the_machines_load() -> None:
    header, cells = latency_table([_row("ferryman", _latency(busy=1.5))], _latency(busy=1.1))
    assert [c[0] for c in cells] == ["ferryman", FLOOR_ROW]
    busy, rig = header.index("machine busy cores"), header.index("load+reader cores")
    assert cells[0][busy] == f"1.50/{os.cpu_count()}"
    assert cells[1][busy] == f"1.10/{os.cpu_count()}"
    assert cells[0][rig] == "0.70"


def test_without_a_floor_only_the_rows_are_listed() -> None:
    _header, cells = latency_table([_row("copyloop", _latency(busy=1.0))])
    assert [c[0] for c in cells] == ["copyloop"]


def test_a_saturated_phase_is_flagged_and_a_quiet_one_is_not() -> None:
    cores = os.cpu_count() or 1
    saturated = footnotes([_row("ferryman", _latency(busy=0.95 * cores))])
    quiet = footnotes([_row("ferryman", _latency(busy=0.5 * cores))])
    assert any("queueing for CPU" in line for line in saturated)
    assert not any("queueing for CPU" in line for line in quiet)


def test_a_phase_the_generator_offered_short_is_flagged_and_a_full_one_is_not() -> None:
    lines = footnotes(
        [_row("ferryman", _latency(busy=1.0, achieved_rate=128_250.0)), _row("copyloop", _latency(busy=1.0))]
    )
    short = [line for line in lines if "of the offered load" in line]
    assert short == [
        "ferryman: the generator delivered 86% of the offered load (128,250 of 150,000 rec/s): it runs below what it "
        "measures and was left short of CPU, so this row's latency is for a lighter load than the others'"
    ]


def test_an_incomplete_floor_is_reported() -> None:
    lines = footnotes([], _latency(busy=0.1, visible=900))
    assert any(line.startswith(FLOOR_ROW) and "900 of 1,000 visible" in line for line in lines)


def test_rows_run_together_say_their_rates_are_shares_of_the_machine() -> None:
    rows = [_row("ferryman", _latency(busy=1.0))]
    assert any(line.startswith("rows ran together (--together)") for line in footnotes(rows, together=True))
    assert not any("--together" in line for line in footnotes(rows))


def test_the_raw_figures_hold_the_floor_and_the_rigs_share(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    write_json(out, {"topic": "t"}, [_row("ferryman", _latency(busy=1.5))], _latency(busy=1.1))
    figures = json.loads(out.read_text())
    assert figures["latency_floor"]["machine_busy_cores"] == 1.1
    assert figures["rows"][0]["latency"]["rig_cores"] == 0.7
    assert figures["topic"] == "t"


def test_what_keeping_up_cost_each_replicator_is_compared_with_the_copy_loop(tmp_path: Path) -> None:
    rows = [
        _row("ferryman", _latency(busy=1.5, replicator_cpu_s=0.0026)),
        _row("copyloop", _latency(busy=1.4, replicator_cpu_s=0.0020)),
    ]
    header, cells = latency_table(rows, _latency(busy=1.1))
    cpu, ratio = header.index("replicator CPU s/M"), header.index("vs copyloop")
    assert [c[cpu] for c in cells] == ["2.60", "2.00", "-"]  # 1000 records offered
    assert [c[ratio] for c in cells] == ["1.30x", "1.00x", "-"]
    out = tmp_path / "run.json"
    write_json(out, {}, rows, _latency(busy=1.1))
    figures = json.loads(out.read_text())
    assert figures["rows"][0]["latency"]["replicator_cpu_s_per_m"] == pytest.approx(2.6)
    assert figures["latency_floor"]["replicator_cpu_s_per_m"] is None


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([], 99) != percentile([], 99)  # NaN


def _throughput(rps: float, cpu_s_per_m: float, steady_cpu_s_per_m: float | None = None) -> Throughput:
    return Throughput(
        records=1_000_000,
        payload_bytes=117_000_000,
        first_batch_records=10_000,
        first_visible_s=1.0,
        steady_s=1_000_000 / rps,
        from_start_s=1.0 + 1_000_000 / rps,
        steady_rps=rps,
        steady_mbps=rps * 117 / 1e6,
        from_start_rps=1_000_000 / (1.0 + 1_000_000 / rps),
        from_start_mbps=None,
        cpu_s=cpu_s_per_m,
        cpu_s_per_m=cpu_s_per_m,
        steady_cpu_s_per_m=steady_cpu_s_per_m,
        broker_cpu_s_per_m=None,
        peak_rss_mb=100.0,
        timeline=[],
    )


def _rounds(name: str, *figures: tuple[float, ...]) -> RowResult:
    """A row's rounds from (steady rec/s, CPU s/M[, steady CPU s/M]) each."""
    result = RowResult(name, exactly_once=name == "ferryman")
    first, *more = (_throughput(*f) for f in figures)
    result.throughput = first
    result.repeats = more
    return result


def test_each_round_is_compared_with_the_copy_loops_run_of_the_same_round() -> None:
    rows = [
        _rounds("ferryman", (500_000, 2.6), (300_000, 2.2), (450_000, 2.4)),
        _rounds("copyloop", (400_000, 2.0), (600_000, 2.0), (300_000, 1.6)),
        _rounds("mm2", (100_000, 20.0), (100_000, 20.0), (90_000, 20.0)),
        _rounds("mm2-eos", (50_000, 25.0), (60_000, 25.0), (150_000, 25.0)),
    ]
    header, cells = rounds_table(rows)
    ferryman = dict(zip(header[2:], cells[0][2:], strict=False))
    assert cells[0][2] == "500,000 / 300,000 / 450,000"
    assert cells[0][3] == "450,000"  # median of the rates
    assert ferryman["from start median"] == "310,345"  # 1 M records in 1 s + 1 M / 450 k
    assert ferryman["vs copyloop by round"] == "1.25 / 0.50 / 1.50"  # round k against the copy loop's round k
    assert cells[0][6] == "1.25x"  # the median of those (the ratio of the medians would be 1.12)
    assert ferryman["vs mm2 median"] == "5.00x"  # 5.0, 3.0, 5.0
    assert ferryman["vs mm2-eos median"] == "5.00x"  # 10.0, 5.0, 3.0
    assert ferryman["CPU s/M by round"] == "2.6 / 2.2 / 2.4"
    assert ferryman["CPU vs copyloop by round"] == "1.30 / 1.10 / 1.50"
    assert cells[0][-1] == "1.30x"
    assert [c[0] for c in cells] == ["ferryman", "copyloop", "mm2", "mm2-eos"]
    assert cells[1][6] == "1.00x"


def test_a_row_that_failed_a_round_gets_no_ratio() -> None:
    ferryman = _rounds("ferryman", (500_000, 2.6), (300_000, 2.2))
    ferryman.fail("round 2: exactly-once broken: 3 duplicates, 0 out of order")
    _header, cells = rounds_table([ferryman, _rounds("copyloop", (400_000, 2.0), (600_000, 2.0))])
    assert cells[0][1] == "FAILED"
    assert cells[0][2] == "500,000 / 300,000"  # the figures stay visible
    assert cells[0][5:9] == ["-", "-", "-", "-"]
    assert cells[0][11:] == ["-", "-"]


def test_metrics_and_tracing_are_compared_with_the_bare_row_round_by_round() -> None:
    rows = [
        _rounds("ferryman-bare", (500_000, 2.5, 2.0), (400_000, 2.0, 1.6)),
        _rounds("ferryman", (490_000, 2.5, 2.0), (400_000, 2.1)),
        _rounds("ferryman-trace1", (250_000, 5.0, 4.0), (400_000, 2.2, 2.0)),
        _rounds("ferryman-trace100", (5_000, 250.0), (4_000, 200.0)),
        _rounds("copyloop", (400_000, 2.0), (600_000, 2.0)),
    ]
    rows[3].fail("round 1: only 52,030 of 200,000 records visible")
    header, cells = observability_table(rows)
    assert header[2] == "rec/s vs bare by round"
    assert [c[0] for c in cells] == ["ferryman", "ferryman-trace1", "ferryman-trace100"]
    assert header[6] == "steady CPU s/M vs bare by round"
    assert cells[0][2:] == ["0.98 / 1.00", "0.99x", "1.00 / 1.05", "1.02x", "1.00 / -", "1.00x"]
    assert cells[1][2:] == ["0.50 / 1.00", "0.75x", "2.00 / 1.10", "1.55x", "2.00 / 1.25", "1.62x"]
    assert cells[2][1:] == ["FAILED", "-", "-", "-", "-", "-", "-"]  # a failed row gets no ratio
    assert observability_table(rows[1:]) == ([], [])  # without the baseline, no table


def test_one_round_prints_no_rounds_table_and_the_json_keeps_every_round(tmp_path: Path) -> None:
    assert rounds_table([_rounds("ferryman", (500_000, 2.6))]) == ([], [])
    out = tmp_path / "run.json"
    write_json(out, {}, [_rounds("ferryman", (500_000, 2.6), (300_000, 2.2))])
    row = json.loads(out.read_text())["rows"][0]
    assert row["throughput"]["steady_rps"] == 500_000
    assert [t["steady_rps"] for t in row["repeats"]] == [300_000]


def test_rounds_default_to_three_two_in_a_smoke_run_and_must_be_positive() -> None:
    assert config.parse_args([]).rounds == 3
    assert config.parse_args(["--smoke"]).rounds == 2
    assert config.parse_args(["--rounds", "1"]).rounds == 1
    with pytest.raises(SystemExit):
        config.parse_args(["--rounds", "0"])


def test_the_log_line_gives_the_kernels_part_of_the_rows_and_the_brokers_cpu() -> None:
    tp = _throughput(500_000.0, 2.2)
    assert log.kernel_share(tp) == ""  # no reading (a row that failed before it)
    tp = replace(tp, kernel_cpu_s_per_m=0.45)
    assert log.kernel_share(tp) == "; kernel 0.45"  # clusters given on the command line: no brokers
    tp = replace(tp, broker_cpu_s_per_m=1.3, broker_kernel_cpu_s_per_m=0.52)
    assert log.kernel_share(tp) == "; kernel 0.45; brokers 1.3 CPU s/M, kernel 0.52"


def test_the_runs_json_names_the_client_library_and_the_machines_reclaim() -> None:
    scheme = ReclaimScheme(action="pageout", min_idle_s=60.0, quota_bytes_per_s=2**31, filters=["anon: excluded"])
    machine = replication._describe(config.parse_args(["--smoke"]), None, [scheme], None)["machine"]
    assert machine["confluent_kafka"] == importlib.metadata.version("confluent-kafka")  # not its first character
    assert machine["memory_reclaim"] == [
        {"action": "pageout", "min_idle_s": 60.0, "quota_bytes_per_s": 2**31, "filters": ["anon: excluded"]}
    ]


def test_the_log_line_gives_each_programs_cpu_kernel_part_and_faults_per_million() -> None:
    usage = {"ferryman-deduper": Usage(0.65, 0.1, 29_000), "ferryman-wrapper": Usage(0.5, 0.05, 20_500)}
    assert log.usage_per_million(usage, 500_000) == (
        "ferryman-deduper 1.30 CPU s (kernel 0.20), 58 k faults; ferryman-wrapper 1.00 CPU s (kernel 0.10), 41 k faults"
    )
