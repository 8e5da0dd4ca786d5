"""A row's measured phases: the timed copy of the preloaded topics (throughput), then an offered load (latency).

``measure_row`` launches the row and, while a live reader times the copy (``bench.verify``), samples the CPU and
RSS of its processes and the brokers' CPU (``bench.measure``) and the bytes of its sockets that cross between
the clusters' regions (``bench.crossing``); then it offers the latency phase's load (``bench.latency``).
``latency_floor`` runs that phase with nothing replicating.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from collections.abc import Mapping
from dataclasses import replace

import grpc

from bench.config import DEFAULT_LATENCY_RATE, BenchConfig
from bench.crossing import CrossingSampler, Traffic, cross_traffic
from bench.latency import DRAIN_BUDGET_S, SOURCE_TOPIC_CONFIG, LatencyResult
from bench.latency import measure as measure_latency
from bench.log import crossed_line, kernel_share, log, split_per_million, usage_per_million
from bench.measure import TreeSampler, Usage
from bench.records import record_bytes
from bench.results import RowResult, Throughput
from bench.rows import Row
from bench.testbed import Stage, create_bench_topics, destination_topics
from bench.verify import LiveWatcher

#: How often the throughput phase checks the row's processes and its deadlines.
_CHECK_INTERVAL_S = 0.5
#: The watcher closes its consumer within this long once told to stop.
_WATCHER_STOP_BUDGET_S = 10.0
#: After the first records are visible, a row that makes no progress for this long
#: has stalled (no replicator here pauses that long by design).
_STALL_S = 60.0
#: Points of a row's visibility timeline kept in the JSON (enough to plot it).
_TIMELINE_POINTS = 200


class _FirstVisible:
    """The row's CPU reading, taken on the watcher thread when the first records become visible."""

    def __init__(self, sampler: TreeSampler) -> None:
        self._sampler = sampler
        self.cpu_s = math.nan

    def __call__(self) -> None:
        self.cpu_s = self._sampler.sample()


def _await_copy(row: Row, watcher: LiveWatcher, deadline: float) -> str | None:
    """Wait until the watcher saw every record; return why not (a process died, timeout, stall)."""
    while not watcher.done.wait(_CHECK_INTERVAL_S):
        died = row.exited()
        if died:
            return died
        now = time.monotonic()
        t = watcher.tally
        if now > deadline:
            return f"timeout: {t.unique:,} of {t.expected:,} records visible"
        if watcher.first_visible is not None and now - watcher.last_progress > _STALL_S:
            return f"stalled: no new record for {_STALL_S:.0f} s at {t.unique:,} of {t.expected:,}"
    if watcher.error:
        return watcher.error
    t = watcher.tally
    return None if t.complete else f"only {t.unique:,} of {t.expected:,} records visible"


def _throughput(
    stage: Stage,
    value_bytes: int,
    watcher: LiveWatcher,
    launched: float,
    first: _FirstVisible,
    cpu_s: float,
    broker_cpu_s: float,
    broker_cpu_at_launch: float,
) -> Throughput:
    n = watcher.tally.unique
    per_record = record_bytes(value_bytes)
    first_t, last_t = watcher.first_visible, watcher.last_visible
    steady_s = last_t - first_t if first_t is not None and last_t is not None and last_t > first_t else None
    steady_n = n - watcher.first_batch_records
    from_start_s = last_t - launched if last_t is not None else None
    steady_rps = steady_n / steady_s if steady_s else None
    from_start_rps = n / from_start_s if from_start_s else None
    return Throughput(
        records=n,
        payload_bytes=n * per_record,
        first_batch_records=watcher.first_batch_records,
        timeline=_thin([(round(t - launched, 3), seen) for t, seen in watcher.timeline], _TIMELINE_POINTS),
        first_visible_s=first_t - launched if first_t is not None else None,
        steady_s=steady_s,
        from_start_s=from_start_s,
        steady_rps=steady_rps,
        steady_mbps=steady_rps * per_record / 1e6 if steady_rps else None,
        from_start_rps=from_start_rps,
        from_start_mbps=from_start_rps * per_record / 1e6 if from_start_rps else None,
        cpu_s=cpu_s,
        cpu_s_per_m=cpu_s / n * 1e6 if n else None,
        steady_cpu_s_per_m=(cpu_s - first.cpu_s) / steady_n * 1e6 if steady_n > 0 and steady_s else None,
        broker_cpu_s_per_m=(broker_cpu_s - broker_cpu_at_launch) / n * 1e6 if n and stage.broker_pids else None,
        peak_rss_mb=math.nan,  # filled in once the row has stopped (the latency phase counts too)
    )


def _thin(points: list[tuple[float, int]], most: int) -> list[tuple[float, int]]:
    """At most ``most`` evenly chosen points, always keeping the first and the last."""
    if len(points) <= most:
        return points
    step = (len(points) - 1) / (most - 1)
    return [points[round(i * step)] for i in range(most)]


def measure_row(
    row: Row,
    cfg: BenchConfig,
    stage: Stage,
    lat_topic: str,
    latency_rate: float | None,
    result: RowResult,
    cleanup: contextlib.ExitStack,
) -> None:
    """Launch the row, time the copy, then run the latency phase; record into ``result``."""
    brokers = TreeSampler(stage.broker_pids) if stage.broker_pids else None
    if brokers is not None:
        cleanup.callback(brokers.stop)
    broker_cpu_at_launch = brokers.sample() if brokers else math.nan
    broker_kernel_at_launch = brokers.kernel_s() if brokers else math.nan
    launched = time.monotonic()
    row.launch()
    sampler = TreeSampler(p.pid for p in row.processes)
    # Stopped before the row: the peak RSS covers the copy and the latency phase, not the shutdown.
    cleanup.callback(lambda: _record_peak_rss(result, sampler, row))
    # Its first reading, now, is the copy's start: every socket the row opens from here counts in full.
    crossing = _crossing_sampler(row, stage)
    if crossing is not None:
        cleanup.callback(crossing.stop)
    first = _FirstVisible(sampler)
    deadline = launched + cfg.timeout_s
    watcher = LiveWatcher(stage.destination, destination_topics(row, stage), stage.counts, deadline, on_first=first)
    cleanup.callback(watcher.stop, _WATCHER_STOP_BUDGET_S)
    log(f"{row.name}: launched (logs in {row.ctx.work_dir}); copying {sum(stage.counts):,} records")
    failure = _await_copy(row, watcher, deadline)
    cpu_s = sampler.sample()
    kernel_s = sampler.kernel_s()
    usage_by_program = _usage_by_program(sampler, row)
    cpu_by_program = {name: u.cpu_s for name, u in usage_by_program.items()}
    broker_cpu_s = brokers.sample() if brokers else math.nan
    broker_kernel_s = brokers.kernel_s() - broker_kernel_at_launch if brokers else None
    copied = _read_crossing(crossing, row)
    watcher.stop(_WATCHER_STOP_BUDGET_S)
    tp = _throughput(stage, cfg.value_bytes, watcher, launched, first, cpu_s, broker_cpu_s, broker_cpu_at_launch)
    per_m = 1e6 / tp.records if tp.records else None
    tp = replace(
        tp,
        cpu_s_by_program=cpu_by_program,
        kernel_cpu_s_by_program={name: u.kernel_s for name, u in usage_by_program.items()},
        minor_faults_by_program={name: u.minor_faults for name, u in usage_by_program.items()},
        kernel_cpu_s_per_m=kernel_s * per_m if per_m else None,
        broker_kernel_cpu_s_per_m=broker_kernel_s * per_m if per_m and broker_kernel_s is not None else None,
        cross_cluster=cross_traffic(copied, tp.records) if copied is not None else None,
    )
    result.throughput = tp
    log(
        f"{row.name}: {tp.records:,} visible; steady {tp.steady_rps or math.nan:,.0f} rec/s, "
        f"from start {tp.from_start_rps or math.nan:,.0f} rec/s, {tp.cpu_s_per_m or math.nan:.1f} CPU s/M"
        + split_per_million(cpu_by_program, tp.records)
        + kernel_share(tp)
    )
    log(f"{row.name}: by program, per million records: " + usage_per_million(usage_by_program, tp.records))
    if tp.cross_cluster is not None:
        log(f"{row.name}: crossed between the regions in the copy: " + crossed_line(tp.cross_cluster, cfg.value_bytes))
    if failure:
        result.fail(failure)
        return
    if cfg.latency_duration_s <= 0:
        return
    if latency_rate is None:
        latency_rate = tp.steady_rps / 2 if tp.steady_rps else DEFAULT_LATENCY_RATE
    sampler.sample()
    before = _by_program(sampler, row)
    counters_before = _counters(row)
    crossing_before = _read_crossing(crossing, row)
    # A row slower than the offered load (MM2 exactly-once, at half of Ferryman's rate) works through its
    # backlog after the load ends: twice the time its own steady rate needs for it, so that falling behind
    # shows as latency rather than as a failed row.
    backlog_s = latency_rate * cfg.latency_duration_s / tp.steady_rps if tp.steady_rps else 0.0
    lat = _latency_phase(
        cfg,
        row.name,
        stage.source,
        lat_topic,
        stage.destination,
        row.destination_topic(lat_topic),
        latency_rate,
        drain_budget_s=max(DRAIN_BUDGET_S, 2 * backlog_s),
    )
    sampler.sample()
    by_program = {k: v - before.get(k, 0.0) for k, v in _by_program(sampler, row).items()}
    counters_after = _counters(row)
    counters = {k: v - counters_before[k] for k, v in counters_after.items() if k in counters_before}
    crossing_after = _read_crossing(crossing, row)
    crossed = (
        cross_traffic(crossing_after.minus(crossing_before), lat.records)
        if crossing_before is not None and crossing_after is not None
        else None
    )
    # The programs' shares add up to the whole: every process sampled belongs to one root.
    result.latency = replace(
        lat,
        replicator_cpu_s=sum(by_program.values()),
        replicator_cpu_s_by_program=by_program,
        replicator_counters=counters,
        cross_cluster=crossed,
    )
    log(
        f"{row.name}: kept up with the offered load for {result.latency.replicator_cpu_s_per_m:.2f} CPU s/M"
        + split_per_million(by_program, lat.records)
    )
    if crossed is not None:
        log(f"{row.name}: crossed between the regions at the offered load: " + crossed_line(crossed, cfg.value_bytes))
    if counters.get("commits"):
        n = counters["commits"]
        log(
            f"{row.name}: {n:,.0f} transactions committed in the phase, {counters['commit_s'] / n * 1000:.1f} ms "
            f"each on average ({counters['commit_flush_s'] / n * 1000:.1f} ms of it flushing the records)"
        )


def _crossing_sampler(row: Row, stage: Stage) -> CrossingSampler | None:
    """A sampler of the row's sockets (``bench.crossing``), or None (logged) when they cannot be read."""
    if stage.brokers is None:
        return None
    try:
        return CrossingSampler(row.programs(), row.placement(), stage.brokers)
    except (subprocess.SubprocessError, OSError) as exc:
        log(f"{row.name}: cross-cluster bytes not measured: its sockets could not be read ({exc})")
        return None


def _read_crossing(crossing: CrossingSampler | None, row: Row) -> Traffic | None:
    """``crossing.read()``, or None (logged) when ``ss`` fails: the figure is left out, the row goes on."""
    if crossing is None:
        return None
    try:
        return crossing.read()
    except (subprocess.SubprocessError, OSError) as exc:
        log(f"{row.name}: its sockets could not be read ({exc})")
        return None


def _counters(row: Row) -> Mapping[str, float]:
    """``row.counters()``, or none (logged) when the replicator does not answer: they explain, never decide."""
    try:
        return row.counters()
    except grpc.RpcError as exc:
        log(f"{row.name}: its counters could not be read ({exc.code()}: {exc.details()})")
        return {}


def _by_program(sampler: TreeSampler, row: Row) -> dict[str, float]:
    """The sampler's last CPU reading split by program (processes launched as the same program summed)."""
    return {name: u.cpu_s for name, u in _usage_by_program(sampler, row).items()}


def _usage_by_program(sampler: TreeSampler, row: Row) -> dict[str, Usage]:
    """The sampler's last reading split by program (processes launched as the same program summed)."""
    programs = row.programs()
    out: dict[str, Usage] = {}
    for pid, usage in sampler.usage_by_root().items():
        name = programs.get(pid, str(pid))
        out[name] = out.get(name, Usage()).plus(usage)
    return out


def _latency_phase(
    cfg: BenchConfig,
    label: str,
    source: str,
    topic: str,
    destination: str,
    destination_topic: str,
    rate: float,
    *,
    drain_budget_s: float = DRAIN_BUDGET_S,
) -> LatencyResult:
    """Offer ``rate`` rec/s to ``topic`` for the configured time; time its records in ``destination_topic``."""
    log(f"{label}: latency phase, {rate:,.0f} rec/s offered for {cfg.latency_duration_s:.0f} s")
    lat = measure_latency(
        source,
        destination,
        topic,
        destination_topic,
        partitions=cfg.partitions,
        rate=rate,
        seconds=cfg.latency_duration_s,
        value_bytes=cfg.value_bytes,
        drain_budget_s=drain_budget_s,
    )
    log(
        f"{label}: latency p50 {lat.p50_ms:.0f} ms, p99 {lat.p99_ms:.0f} ms, max {lat.max_ms:.0f} ms; "
        f"machine {lat.machine_busy_cores:.2f} cores busy, load and reader {lat.rig_cores:.2f} "
        f"(generator: {lat.generator_priority or 'priority unknown'})"
    )
    return lat


def latency_floor(cfg: BenchConfig, stage: Stage, rate: float) -> LatencyResult:
    """The latency phase with nothing replicating: the reader follows the source topic itself.

    Same offered load, generator and reader as the rows' latency phases, so this is
    the floor every row's figure stands on, and how much of the machine the
    measurement itself takes.
    """
    topic = f"{stage.name}-lat-floor"
    create_bench_topics(stage.source, [topic], cfg.partitions, SOURCE_TOPIC_CONFIG)
    return _latency_phase(cfg, "latency floor (no replicator)", stage.source, topic, stage.source, topic, rate)


def _record_peak_rss(result: RowResult, sampler: TreeSampler, row: Row) -> None:
    sampler.stop()
    if result.throughput is not None:
        programs = row.programs()
        by_program: dict[str, float] = {}
        for pid, peak in sampler.peak_rss_by_root.items():
            name = programs.get(pid, str(pid))
            by_program[name] = by_program.get(name, 0.0) + peak / 1e6
        result.throughput = replace(
            result.throughput, peak_rss_mb=sampler.peak_rss_bytes / 1e6, peak_rss_mb_by_program=by_program
        )
        log(
            f"{row.name}: peak RSS {sampler.peak_rss_bytes / 1e6:,.0f} MB ("
            + ", ".join(f"{name} {mb:,.0f}" for name, mb in sorted(by_program.items()))
            + ")"
        )
