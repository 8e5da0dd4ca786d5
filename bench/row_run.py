"""One row of ``bench.replication`` run end to end: checked, prepared, measured, stopped, audited, judged.

``run_row`` always stops the row's processes, and marks FAILED a row that copied wrong: records missing or
misplaced, or, for an exactly-once row, duplicated or out of order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace

from bench.config import BenchConfig
from bench.latency import SOURCE_TOPIC_CONFIG
from bench.log import log
from bench.phases import measure_row
from bench.results import RowResult, Verdict
from bench.rows import Row, RowContext, RowUnavailableError, round_tag
from bench.stages import read_stages
from bench.testbed import Stage, audit_budget, create_bench_topics, destination_topics
from bench.together import Gate
from bench.topics import delete_topics, list_topics
from bench.verify import audit

#: Processes get this long to stop on SIGTERM (MirrorMaker 2 stops its connectors
#: in turn, Ferryman commits or aborts its transaction) before they are killed.
_STOP_GRACE_S = 30.0


def _verdict(stage: Stage, row: Row) -> Verdict:
    found = audit(stage.destination, destination_topics(row, stage), stage.counts, audit_budget(sum(stage.counts)))
    t = found.tally
    return Verdict(
        expected=t.expected,
        unique=t.unique,
        duplicates=t.duplicates,
        misplaced=t.misplaced,
        disordered=t.disordered,
        foreign=t.foreign,
        read_to_end=found.read_to_end,
        missing_examples=t.missing_examples(),
    )


def _judge(result: RowResult) -> None:
    """Mark the row FAILED for any wrong answer."""
    v, lat = result.verdict, result.latency
    if v is not None:
        if not v.complete:
            result.fail(
                f"incomplete: {v.expected - v.unique:,} records missing, e.g. (partition, seq) {v.missing_examples}"
            )
        if v.misplaced or v.foreign:
            result.fail(f"{v.misplaced:,} records on the wrong partition, {v.foreign:,} unreadable")
        if result.exactly_once and (v.duplicates or v.disordered):
            result.fail(f"exactly-once broken: {v.duplicates:,} duplicates, {v.disordered:,} out of order")
        if not v.read_to_end:
            result.fail("the destination topic could not be read to its end (an open transaction?)")
    if lat is not None:
        if not lat.complete or lat.error:
            result.fail(f"latency phase: {lat.visible:,} of {lat.records:,} visible ({lat.error or 'timeout'})")
        if result.exactly_once and lat.duplicates:
            result.fail(f"latency phase: {lat.duplicates:,} duplicates")


def run_row(
    cls: type[Row],
    cfg: BenchConfig,
    stage: Stage,
    latency_rate: float | None,
    round_no: int = 1,
    gate: Gate | None = None,
) -> RowResult:
    """Throughput, latency and verdict of one row; the row's processes are always stopped.

    latency_rate None: offer half of this row's own steady rate (the ferryman row under half-ferryman).
    round_no: which copy of the preloaded topics this is; names the row's topics apart from other rounds'.
    gate: the rows running together with this one (``--together``): launched at once, audited once all copied.
    """
    lat_topic = f"{stage.name}-lat-{cls.name.replace('-', '')}{round_tag(round_no)}"
    work = stage.work_dir / cls.name
    work.mkdir(parents=True, exist_ok=True)
    ctx = RowContext(
        stage.run_id,
        stage.source,
        stage.destination,
        (*stage.topics, lat_topic),
        cfg.partitions,
        work,
        cfg.options,
        round_no,
    )
    row = cls(ctx)
    result = RowResult(cls.name, cls.exactly_once)
    try:
        row.check()
    except RowUnavailableError as exc:
        result.status = "unavailable"
        result.reasons.append(str(exc))
        log(f"{cls.name}: unavailable: {exc}")
        return result
    result.settings = dict(row.settings())
    result.placement = row.placement()
    existing: dict[str, set[str]] = {}  # each cluster's topics before the row (--drop-copies)
    try:
        if cfg.drop_copies:
            existing = {side: set(list_topics(side)) for side in (stage.source, stage.destination)}
        with contextlib.ExitStack() as cleanup:  # unwinds in reverse: watcher, samplers, then the row
            cleanup.callback(row.stop, _STOP_GRACE_S)
            create_bench_topics(stage.source, [lat_topic], cfg.partitions, SOURCE_TOPIC_CONFIG)
            row.prepare()
            if gate is not None:
                gate.wait()
            measure_row(row, cfg, stage, lat_topic, latency_rate, result, cleanup)
        _read_stages(row, result)  # the row has stopped: its services flushed their last spans
        if gate is not None:
            gate.wait()
        if result.throughput is not None and result.throughput.records:
            result.verdict = _verdict(stage, row)
    except Exception as exc:  # a broken row is reported, the next row still runs
        result.fail(f"{type(exc).__name__}: {exc}")
    if existing:
        drop_copies(cls.name, existing)
    _judge(result)
    log(f"{cls.name}: {result.status}" + (f" ({'; '.join(result.reasons)})" if result.reasons else ""))
    return result


def _read_stages(row: Row, result: RowResult) -> None:
    """Split a traced row's latency phase by stage (``bench.stages``), from the spans its services wrote."""
    spans = row.spans_file()
    if result.latency is None or spans is None:
        return
    stages = read_stages(spans, result.latency.started_s)
    if stages is None:
        log(f"{row.name}: no traced record of the latency phase in {spans}")
        return
    result.latency = replace(result.latency, stages=stages.as_dict())
    log(f"{row.name}: where the latency phase's " + stages.describe())


def drop_copies(row: str, existing: Mapping[str, set[str]]) -> None:
    """Delete the topics a row created on each cluster (named by bootstrap in ``existing``, with its topics before)."""
    for bootstrap, before in existing.items():
        try:
            created = {name: n for name, n in list_topics(bootstrap).items() if name not in before}
            delete_topics(bootstrap, created)
            partitions = sum(created.values())
        except Exception as exc:  # the next row meets more partitions, as without --drop-copies
            log(f"{row}: dropping its topics on {bootstrap} failed: {type(exc).__name__}: {exc}")
            continue
        if created:
            log(f"{row}: dropped the {len(created)} topics ({partitions:,} partitions) it created on {bootstrap}")
