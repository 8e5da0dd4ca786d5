"""Print the figures side by side (``rich`` when installed, plain aligned text otherwise) and dump JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.latency import LatencyResult
from bench.results import SHORT_WINDOW_SHARE, RowResult, Throughput

try:  # rich is a development dependency; plain text without it
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover
    Console = Table = None  # type: ignore[assignment,misc]

#: Marks a steady figure taken over too short a window (see ``Throughput.short_window``).
_SHORT = "†"
#: Wide enough for the throughput table on one line when stdout is not a terminal.
_MIN_WIDTH = 200


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    if value is None or math.isnan(value):
        return "-"
    return format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return _fmt(a / b, ".2f") + "x" if a and b and math.isfinite(a) and math.isfinite(b) else "-"


def _ok(results: Sequence[RowResult], name: str) -> RowResult | None:
    for r in results:
        if r.row == name and r.status == "ok":
            return r
    return None


def throughput_table(results: Sequence[RowResult]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the throughput table (ratios only between rows that passed).

    Rates are compared on the steady figure; CPU on the launch-to-last-record figure,
    which counts start-up (a JVM boots, a Python process imports) for every row alike.
    """
    mm2, copy = _ok(results, "mm2"), _ok(results, "copyloop")
    mm2_rps = mm2.throughput.steady_rps if mm2 and mm2.throughput else None
    copy_rps = copy.throughput.steady_rps if copy and copy.throughput else None
    copy_cpu = copy.throughput.cpu_s_per_m if copy and copy.throughput else None
    header = [
        "row",
        "result",
        "rec/s",
        "MB/s",
        "rec/s from start",
        "1st visible s",
        "CPU s/M",
        "CPU s/M steady",
        "broker CPU s/M",
        "peak RSS MB",
        "dups",
        "vs mm2",
        "vs copyloop",
        "CPU vs copyloop",
    ]
    cells: list[list[str]] = []
    for r in results:
        t, v = r.throughput, r.verdict
        ok = r.status == "ok"
        dups = str(v.duplicates) if v else "-"
        if t is None:
            cells.append([r.row, r.status, *["-"] * 8, dups, "-", "-", "-"])
            continue
        cells.append(
            [
                r.row,
                r.status,
                _fmt(t.steady_rps) + (_SHORT if t.short_window else ""),
                _fmt(t.steady_mbps, ".1f"),
                _fmt(t.from_start_rps),
                _fmt(t.first_visible_s, ".1f"),
                _fmt(t.cpu_s_per_m, ".1f"),
                _fmt(t.steady_cpu_s_per_m, ".1f") + (_SHORT if t.short_window else ""),
                _fmt(t.broker_cpu_s_per_m, ".1f"),
                _fmt(t.peak_rss_mb),
                dups,
                _ratio(t.steady_rps, mm2_rps) if ok else "-",
                _ratio(t.steady_rps, copy_rps) if ok else "-",
                _ratio(t.cpu_s_per_m, copy_cpu) if ok else "-",
            ]
        )
    return header, cells


def _per_round(values: Sequence[float | None], spec: str) -> str:
    return " / ".join(_fmt(v, spec) for v in values)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(known) if known else None


def _paired(mine: Sequence[float | None], theirs: Sequence[float | None]) -> list[float | None]:
    """Round k's figure over the reference row's round k (the same minutes of the machine)."""
    return [
        a / b if a and b and math.isfinite(a) and math.isfinite(b) else None for a, b in zip(mine, theirs, strict=True)
    ]


def _median_ratio(ratios: Sequence[float | None] | None) -> str:
    median = _median(ratios) if ratios else None
    return _fmt(median, ".2f") + "x" if median else "-"


def rounds_table(results: Sequence[RowResult]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the rounds table; no cells unless some row ran more than one round.

    Every round's steady rate and CPU s/M, their medians, and the ratios to the
    copy loop and to MirrorMaker 2 (both modes) taken round by round (round k against the
    reference's round k, which ran minutes apart at most), with the median of those.
    Ratios only between rows that passed every round.
    """
    if not any(r.repeats for r in results):
        return [], []
    copy, mm2, mm2_eos = _ok(results, "copyloop"), _ok(results, "mm2"), _ok(results, "mm2-eos")
    header = [
        "row",
        "result",
        "rec/s by round",
        "median",
        "from start median",
        "vs copyloop by round",
        "median",
        "vs mm2 median",
        "vs mm2-eos median",
        "CPU s/M by round",
        "median",
        "CPU vs copyloop by round",
        "median",
    ]
    cells: list[list[str]] = []
    for r in results:
        rates = [t.steady_rps for t in r.rounds]
        cpus = [t.cpu_s_per_m for t in r.rounds]
        ok = r.status == "ok"
        vs_copy = _paired(rates, [t.steady_rps for t in copy.rounds]) if ok and copy else None
        vs_mm2 = _paired(rates, [t.steady_rps for t in mm2.rounds]) if ok and mm2 else None
        vs_mm2_eos = _paired(rates, [t.steady_rps for t in mm2_eos.rounds]) if ok and mm2_eos else None
        cpu_vs_copy = _paired(cpus, [t.cpu_s_per_m for t in copy.rounds]) if ok and copy else None
        cells.append(
            [
                r.row,
                r.status,
                _per_round(rates, ",.0f"),
                _fmt(_median(rates)),
                _fmt(_median([t.from_start_rps for t in r.rounds])),
                _per_round(vs_copy, ".2f") if vs_copy else "-",
                _median_ratio(vs_copy),
                _median_ratio(vs_mm2),
                _median_ratio(vs_mm2_eos),
                _per_round(cpus, ".1f"),
                _fmt(_median(cpus), ".1f"),
                _per_round(cpu_vs_copy, ".2f") if cpu_vs_copy else "-",
                _median_ratio(cpu_vs_copy),
            ]
        )
    return header, cells


def cross_cluster_table(results: Sequence[RowResult]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the cross-cluster table; no cells unless some row's bytes were measured.

    Each row's bytes between the clusters' regions, placed as it is usually deployed
    (``bench.crossing``; the title says where, the JSON has each row's ``placement``),
    per record copied: the first round (MB and B/rec), every round and their median,
    against the payload (key and value) and against MirrorMaker 2's median (both modes;
    ratios only between rows that passed), and at the latency phase's offered load
    (small batches).
    """
    if not any(t.cross_cluster for r in results for t in r.rounds):
        return [], []
    mm2, mm2_eos = _ok(results, "mm2"), _ok(results, "mm2-eos")
    header = [
        "row",
        "result",
        "what crosses is compressed",
        "MB",
        "B/rec",
        "B/rec by round",
        "median",
        "x payload",
        "vs mm2",
        "vs mm2-eos",
        "B/rec offered load",
    ]
    mm2_median = _crossing_median(mm2) if mm2 else None
    mm2_eos_median = _crossing_median(mm2_eos) if mm2_eos else None
    cells: list[list[str]] = []
    for r in results:
        t, lat, ok = r.throughput, r.latency, r.status == "ok"
        crossed = t.cross_cluster if t else None
        median = _crossing_median(r)
        payload = t.payload_bytes / t.records if t and t.records else None
        cells.append(
            [
                r.row,
                r.status,
                r.placement.crossing_compression if r.placement else "-",
                _fmt(crossed.total_bytes / 1e6 if crossed else None, ",.1f"),
                _fmt(crossed.bytes_per_record if crossed else None, ",.1f"),
                _per_round([_bytes_per_record(t) for t in r.rounds], ",.1f"),
                _fmt(median, ",.1f"),
                _ratio(median, payload),
                _ratio(median, mm2_median) if ok else "-",
                _ratio(median, mm2_eos_median) if ok else "-",
                _fmt(lat.cross_cluster.bytes_per_record if lat and lat.cross_cluster else None, ",.1f"),
            ]
        )
    return header, cells


def _bytes_per_record(t: Throughput) -> float | None:
    return t.cross_cluster.bytes_per_record if t.cross_cluster else None


def _crossing_median(r: RowResult) -> float | None:
    """The median over the row's rounds of the bytes that crossed per record."""
    return _median([_bytes_per_record(t) for t in r.rounds])


#: The baseline of the observability rows (metrics and tracing off), and the rows compared with it.
OBSERVABILITY_BASELINE = "ferryman-bare"
OBSERVED_ROWS = (
    "ferryman",
    "ferryman-tracedefault",
    "ferryman-trace01",
    "ferryman-trace1",
    "ferryman-trace10",
    "ferryman-trace100",
)


def observability_table(results: Sequence[RowResult]) -> tuple[list[str], list[list[str]]]:
    """What metrics and tracing cost: each observed row's rate and CPU s/M against ``ferryman-bare``'s.

    Round by round (round k against the baseline's round k), with the medians; issue 26's goal is
    ``ferryman-trace1`` (metrics on, 1 % traced) within 5 % of the baseline in both. CPU twice: from
    launch (start-up included: importing OpenTelemetry is part of a traced service's) and over the
    steady window only (what each record costs). No cells unless the baseline and an observed row ran.
    """
    bare = _ok(results, OBSERVABILITY_BASELINE)
    observed = [r for r in results if r.row in OBSERVED_ROWS]
    if bare is None or not observed:
        return [], []
    header = [
        "row",
        "result",
        "rec/s vs bare by round",
        "median",
        "CPU s/M vs bare by round",
        "median",
        "steady CPU s/M vs bare by round",
        "median",
    ]
    cells: list[list[str]] = []
    for r in observed:
        ok = r.status == "ok"
        row = [r.row, r.status]
        for figure in ("steady_rps", "cpu_s_per_m", "steady_cpu_s_per_m"):
            ratios = (
                _paired([getattr(t, figure) for t in r.rounds], [getattr(t, figure) for t in bare.rounds])
                if ok
                else None
            )
            row += [_per_round(ratios, ".2f") if ratios else "-", _median_ratio(ratios)]
        cells.append(row)
    return header, cells


#: Name of the latency table's line measured with nothing replicating.
FLOOR_ROW = "(no replicator)"
#: A latency phase that kept the machine this busy (share of its cores) measured queueing for CPU.
SATURATED_SHARE = 0.9

#: A latency phase whose generator delivered less than this share of the offered load measured a lighter one.
SHORT_LOAD_SHARE = 0.99


def _named_latencies(results: Sequence[RowResult], floor: LatencyResult | None) -> list[tuple[str, LatencyResult]]:
    """Each row's latency phase by row name, then the floor's (nothing replicating) if there is one."""
    named = [(r.row, r.latency) for r in results if r.latency is not None]
    if floor is not None:
        named.append((FLOOR_ROW, floor))
    return named


def latency_table(
    results: Sequence[RowResult], floor: LatencyResult | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the latency table; ``floor`` (nothing replicating) comes last."""
    header = [
        "row",
        "offered rec/s",
        "achieved rec/s",
        "records",
        "visible",
        "dups",
        "p50 ms",
        "p99 ms",
        "max ms",
        "machine busy cores",
        "load+reader cores",
        "replicator CPU s/M",
        "vs copyloop",
    ]
    copy = _ok(results, "copyloop")
    copy_cpu = copy.latency.replicator_cpu_s_per_m if copy and copy.latency else None
    named = _named_latencies(results, floor)
    cells = [
        [
            name,
            _fmt(lat.offered_rate),
            _fmt(lat.achieved_rate),
            _fmt(lat.records),
            _fmt(lat.visible),
            str(lat.duplicates),
            _fmt(lat.p50_ms, ".1f"),
            _fmt(lat.p99_ms, ".1f"),
            _fmt(lat.max_ms, ".1f"),
            f"{_fmt(lat.machine_busy_cores, '.2f')}/{os.cpu_count()}",
            _fmt(lat.rig_cores, ".2f"),
            _fmt(lat.replicator_cpu_s_per_m, ".2f"),
            _ratio(lat.replicator_cpu_s_per_m, copy_cpu) if name != FLOOR_ROW else "-",
        ]
        for name, lat in named
    ]
    return header, cells


def footnotes(results: Sequence[RowResult], floor: LatencyResult | None = None, *, together: bool = False) -> list[str]:
    """What the marks in the tables mean, and why rows failed or were unavailable (together: ``--together`` ran)."""
    lines = []
    cores = os.cpu_count() or 1
    named = _named_latencies(results, floor)
    if any(lat.machine_busy_cores >= SATURATED_SHARE * cores for _, lat in named):
        lines.append(
            f"latency: a phase that kept the machine {SATURATED_SHARE:.0%} busy or more measured queueing for "
            "CPU as much as the replicator; 'load+reader cores' is the measurement's own share, and "
            f"{FLOOR_ROW} the latency of the load and the reader alone."
        )
    lines.extend(
        f"{name}: the generator delivered {lat.achieved_rate / lat.offered_rate:.0%} of the offered load "
        f"({lat.achieved_rate:,.0f} of {lat.offered_rate:,.0f} rec/s): it runs below what it measures and was "
        "left short of CPU, so this row's latency is for a lighter load than the others'"
        for name, lat in named
        if lat.achieved_rate < SHORT_LOAD_SHARE * lat.offered_rate
    )
    if floor is not None and (not floor.complete or floor.error):
        lines.append(f"{FLOOR_ROW}: {floor.visible:,} of {floor.records:,} visible ({floor.error or 'timeout'})")
    if any(r.throughput and r.throughput.short_window for r in results):
        lines.append(
            f"{_SHORT} the steady window (first to last record visible) is under {SHORT_WINDOW_SHARE:.0%} of the "
            "run: most of the copy happened before anything was visible (start-up, or records held back and "
            "committed in a few large transactions), so the steady figures say more about the reader than the "
            "replicator. Compare rec/s from start, use more --records, and see the timeline in the JSON."
        )
    lines.extend(
        f"cross-cluster bytes: {r.row}: {closed} of its sockets closed during the copy (over all rounds); each is "
        "counted to its last reading, up to a second before it closed"
        for r in results
        if (closed := sum(t.cross_cluster.sockets_closed for t in r.rounds if t.cross_cluster))
    )
    compressed = [r.row for r in results if r.placement and not r.placement.crossing_compression.endswith(": none")]
    if compressed and any(t.cross_cluster for r in results for t in r.rounds):
        lines.append(
            f"cross-cluster bytes: {', '.join(compressed)}: what crosses is compressed, and the bench's values are a "
            "16-byte header and constant padding: real data compresses far less."
        )
    lines.extend(f"{r.row}: {r.status}: {reason}" for r in results for reason in r.reasons)
    if together:
        lines.append(
            "rows ran together (--together): compare their CPU per record; each rate is a share of the machine the "
            "rows shared (their brokers among it), not the row's rate alone"
        )
    return lines


def _plain(title: str, header: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    lines = [list(header), *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    body = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    ]
    return "\n".join([title, *body])


def print_tables(tables: Sequence[tuple[str, list[str], list[list[str]]]]) -> None:
    """Print each ``(title, header, cells)`` table."""
    if Console is None or Table is None:
        for title, header, cells in tables:
            if cells:
                print(_plain(title, header, cells) + "\n")
        return
    console = Console(width=None if sys.stdout.isatty() else _MIN_WIDTH)
    for title, header, cells in tables:
        if not cells:
            continue
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right")
        for line in cells:
            style = "bold red" if line[1] == "FAILED" else None
            table.add_row(*line, style=style)
        console.print(table)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in (
            "complete",
            "short_window",
            "rig_cores",
            "replicator_cpu_s_per_m",
            "total_bytes",
            "bytes_per_record",
        ):
            if hasattr(obj, name):
                out[name] = _jsonable(getattr(obj, name))
        return out
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(
    path: Path, run: Mapping[str, Any], results: Sequence[RowResult], floor: LatencyResult | None = None
) -> None:
    """Write the raw figures of the run (``run`` describes its set-up; ``floor``: nothing replicating)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figures = {**_jsonable(run), "rows": _jsonable(list(results)), "latency_floor": _jsonable(floor)}
    path.write_text(json.dumps(figures, indent=2) + "\n")
