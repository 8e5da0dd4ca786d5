"""Replication benchmark: Ferryman, a bare copy loop and MirrorMaker 2, on the same clusters and data.

``python -m bench.replication [--scenario partitions|large|scale-out|topics] [--records 1000000] [--value-bytes 100]
[--partitions 8] [--topics 1] [--staging-partitions N]
[--rows ferryman,copyloop,mm2,mm2-eos] [--wrapper-procs 1] [--deduper-procs 1] [--compression none]
[--latency-rate R|half-ferryman] [--rounds 3] [--json out.json] [--smoke]``

The cost of observability: ``--rows ferryman-bare,ferryman,ferryman-tracedefault,ferryman-trace1,ferryman-trace100``
(metrics and tracing off; metrics on; metrics on and records traced at the default ratio / 1 % / 100 %; see
``bench/rows/ferryman_observed.py``); a table compares them with ``ferryman-bare`` round by round.

One run starts two local clusters (or uses ``--source-bootstrap`` /
``--destination-bootstrap``), preloads the source topics (one by default;
``--topics N``: N topics of ``--partitions`` partitions each, the records spread
round-robin over all their partitions), warms both brokers
(``bench/warmup.py``), rehearses every row on small topics of its own (a
freshly started broker JIT-compiles each row's paths the first time it sees
them, and that cost used to land on whichever row was measured first), then
for each row:

1. throughput: the row's processes copy the preloaded topics to fresh destination
   topics; one read_committed reader of all of them times it from the first
   record visible to the last (steady state) and from the processes' launch,
   while the CPU and RSS of the row's process trees (and the brokers' CPU) are sampled;
2. latency: a fixed load below the maximum is offered to one more, empty source
   topic the row already follows (one, whatever ``--topics``: the phase measures
   a record's way through, not the number of topics), and the reader measures
   visible time minus each record's source append time (the topic is
   LogAppendTime; replicators keep the timestamp on the copy) (p50, p99, max);
3. verdict: the row is stopped and its destination topics read back in full:
   every source (partition, seq) of every topic must be present, in the copy of
   its own topic; exactly-once rows must have no duplicate and keep per-partition
   order. A row that fails is marked FAILED and gets no ratio: a fast wrong
   answer cannot win.

In both phases the bench also reads the TCP byte counters of the row's sockets
(``bench.crossing``): the bytes that cross between the clusters' regions with the
row placed as it is usually deployed (Ferryman's wrapper next to the source, its
dedupers, MirrorMaker 2 and the copy loop next to the destination), per record
copied, beside the compression of what crosses.

Then, with ``--rounds N`` (3 by default), the copy is repeated N - 1 more times,
the rows interleaved round by round (ferryman, copyloop, ... then again, the order rotated by one each round), each
round a fresh launch to fresh destination topics, audited like the first. Two
identical runs on this 2-core machine differ by 20% or more, and it drifts
within minutes, so one copy per row cannot carry a ratio: the rounds table gives
every round's figures, their median, and each round's ratio to the copy loop's
run of the same round.

It is a benchmark, not a test: it prints tables and writes raw figures as JSON;
the exit code is 1 when a row FAILED (2 when the set-up did).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType
from typing import Any, TypeVar

import confluent_kafka
from ferryman.service import tune_gc
from ferryman_local import LocalCluster, start_clusters

from bench.bytecode import compile_launched_code
from bench.config import DEFAULT_LATENCY_RATE, BenchConfig, parse_args
from bench.errors import BenchError
from bench.latency import LatencyResult
from bench.log import log
from bench.machine import ReclaimScheme, as_json, describe_reclaim, reclaim_schemes
from bench.phases import latency_floor
from bench.provenance import CodeVersion, code_version
from bench.readcols import reader_path
from bench.report import (
    cross_cluster_table,
    footnotes,
    latency_table,
    observability_table,
    print_tables,
    rounds_table,
    throughput_table,
    write_json,
)
from bench.results import RowResult
from bench.row_run import run_row
from bench.rows import ROWS
from bench.testbed import Stage, build_stage, host_ports, preloaded_topics
from bench.together import run_together

#: The rehearsal's paced load: a few seconds at a rate every row sustains here.
_REHEARSAL_LATENCY_S = 5.0
_REHEARSAL_LATENCY_RATE = 50_000.0
#: What a row running together waits for the others beyond the copy's deadline (their topics and launch).
_TOGETHER_SLACK_S = 300.0


def _rehearse(cfg: BenchConfig, stage: Stage) -> None:
    """Run every row once, unmeasured, on small topics of its own (same clusters, same code paths, same shape).

    Each row copies ``cfg.rehearsal_records`` records, then takes a short paced
    load (the latency phase's paths: small batches, transactions committed on
    time rather than size), and is checked like a measured row; its figures are
    logged and dropped. A row that fails here is measured anyway (and fails
    there too if it is broken).
    """
    run_id = uuid.uuid4().hex[:6]
    stem = f"bench-{run_id}-rehearsal"
    topics, counts, _loaded = preloaded_topics(cfg, stage.source, stem, cfg.rehearsal_records)
    rehearsal = Stage(
        run_id, stage.source, stage.destination, stem, topics, counts, [], stage.work_dir / "rehearsal", stage.brokers
    )
    short = replace(cfg, latency_duration_s=min(cfg.latency_duration_s, _REHEARSAL_LATENCY_S))
    for name in cfg.rows:
        started = time.monotonic()
        result = run_row(ROWS[name], short, rehearsal, cfg.latency_rate or _REHEARSAL_LATENCY_RATE)
        log(f"{name}: rehearsed in {time.monotonic() - started:.1f} s ({result.status})")


_T = TypeVar("_T")


def round_order(results: list[_T], round_no: int) -> list[_T]:
    """The rows in the order round round_no runs them: the first round's order rotated by round_no - 1."""
    turn = (round_no - 1) % len(results) if results else 0
    return results[turn:] + results[:turn]


def _repeat(cfg: BenchConfig, stage: Stage, round_no: int, results: list[RowResult]) -> None:
    """Copy the preloaded topics once more with every row that ran, the order rotated by one; no latency phase.

    A fresh run id per round gives every row fresh flows, groups and internal
    topics, and the round tag fresh destination topics, so no round sees
    another's state. The rotation puts each row after a different one from
    round to round: a row that always ran second met the brokers' work left by
    the first (segment rolls, compaction of its internal topics) every time. A
    failed round fails its row.
    """
    log(f"round {round_no} of {cfg.rounds}")
    again = replace(stage, run_id=f"{stage.run_id}r{round_no}", work_dir=stage.work_dir / f"round{round_no}")
    once = replace(cfg, latency_duration_s=0.0)
    ran = [result for result in round_order(results, round_no) if result.status != "unavailable"]
    if cfg.together:
        repeats = run_together(
            ran, lambda r, gate: run_row(ROWS[r.row], once, again, None, round_no, gate), _together_budget(cfg)
        )
    else:
        repeats = [run_row(ROWS[result.row], once, again, None, round_no) for result in ran]
    for result, repeat in zip(ran, repeats, strict=True):
        if repeat.throughput is not None:
            result.repeats.append(repeat.throughput)
        for reason in repeat.reasons:
            result.fail(f"round {round_no}: {reason}")


def _together_budget(cfg: BenchConfig) -> float:
    """How long a row running together waits for the others at a step: their preparation, or their copy."""
    return cfg.timeout_s + _TOGETHER_SLACK_S


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    # Unwind through the finally blocks that stop the rows' processes and the clusters.
    raise SystemExit(128 + signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return 1 if a row FAILED, 2 if the set-up (preload, warm-up) failed."""
    cfg = parse_args(argv, description=(__doc__ or "").splitlines()[0])
    signal.signal(signal.SIGTERM, _sigterm)
    base = (cfg.work_dir / time.strftime("%Y%m%d-%H%M%S")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    log(f"{cfg.records:,} records x {cfg.value_bytes} B, {_shape(cfg)}; rows {', '.join(cfg.rows)}; work dir {base}")
    clusters: list[LocalCluster] = []
    results: list[RowResult] = []
    floor: LatencyResult | None = None
    stage: Stage | None = None
    if not compile_launched_code():
        log("set-up failed: the launched code does not compile")
        return 2
    # This process reads every copied record back (the live watcher, the audits) on the
    # cores the rows run on, and each consumed record is a GC-tracked Message: with
    # CPython's defaults a third of its CPU went to collections (see docs/notes.md,
    # session 11), taken from whichever row was running. The services' setting keeps it off.
    tune_gc()
    log(f"reader of the destination: {reader_path()}")
    code = code_version()
    log(f"code measured: {code.describe() if code else 'not a git checkout'}")
    reclaim = reclaim_schemes()
    if (reclaim_note := describe_reclaim(reclaim)) is not None:
        log(reclaim_note)
    try:
        if cfg.source and cfg.destination:
            source, destination, broker_pids = cfg.source, cfg.destination, []
        else:
            # Deleted topics' files go after 1 s instead of 60: the next row must not meet them.
            dropped = {"file.delete.delay.ms": "1000"} if cfg.drop_copies else None
            clusters = start_clusters(["source", "destination"], base_dir=base / "clusters", extra_properties=dropped)
            source, destination = clusters[0].bootstrap_servers, clusters[1].bootstrap_servers
            broker_pids = [c.pid for c in clusters if c.pid is not None]
            log(f"clusters up: source {source}, destination {destination}")
        try:
            stage = build_stage(cfg, source, destination, broker_pids, base)
        except BenchError as exc:
            log(f"set-up failed: {exc}")
            return 2
        if cfg.rehearsal_records:
            _rehearse(cfg, stage)
        rate = cfg.latency_rate
        if cfg.together:  # no latency phase: the rate is not needed
            log(f"rows run together: {', '.join(cfg.rows)}")
            results = run_together(
                cfg.rows, lambda name, gate: run_row(ROWS[name], cfg, stage, None, 1, gate), _together_budget(cfg)
            )
        else:
            for name in cfg.rows:
                result = run_row(ROWS[name], cfg, stage, rate)
                results.append(result)
                if rate is None:  # half-ferryman: ferryman ran first and offered half its own rate to itself
                    rate = result.latency.offered_rate if result.latency is not None else DEFAULT_LATENCY_RATE
                    log(f"latency phases offer {rate:,.0f} rec/s")
        for round_no in range(2, cfg.rounds + 1):
            _repeat(cfg, stage, round_no, results)
        if cfg.latency_duration_s > 0 and rate is not None:
            floor = latency_floor(cfg, stage, rate)
    finally:
        for c in clusters:
            c.stop()
            if not cfg.keep_data:
                # A default run writes ~2-4 GB; the broker logs stay for a post-mortem.
                shutil.rmtree(c.data_dir, ignore_errors=True)
    tp_title = f"Throughput: {cfg.records:,} records x {cfg.value_bytes} B values, {_shape(cfg)}"
    lat_title = f"End-to-end latency ({cfg.latency_duration_s:.0f} s of offered load, read_committed)"
    print()
    rounds_title = (
        f"Rounds: the copy {cfg.rounds} times per row, rows interleaved; ratios round by round (the first round is "
        "the throughput table's)"
    )
    print_tables(
        [
            (tp_title, *throughput_table(results)),
            (rounds_title, *rounds_table(results)),
            (_CROSS_TITLE, *cross_cluster_table(results)),
            ("Cost of metrics and tracing: against ferryman-bare, round by round", *observability_table(results)),
            (lat_title, *latency_table(results, floor)),
        ]
    )
    for line in footnotes(results, floor, together=cfg.together):
        print(line)
    if cfg.json_path:
        write_json(cfg.json_path, _describe(cfg, stage, reclaim, code), results, floor)
        log(f"raw figures in {cfg.json_path}")
    return 1 if any(r.status == "FAILED" for r in results) else 0


#: Title of the cross-cluster table: what the figures count.
_CROSS_TITLE = (
    "Cross-cluster bytes: TCP payload both ways between the clusters' regions, each replicator placed as usually "
    "deployed (Ferryman's wrapper next to the source; its dedupers, MirrorMaker 2 and the copy loop next to the "
    "destination)"
)


def _shape(cfg: BenchConfig) -> str:
    """The source topics' shape for a title: ``"8 partitions"``, or ``"100 topics x 10 partitions"``."""
    return f"{cfg.partitions} partitions" if cfg.topics == 1 else f"{cfg.topics} topics x {cfg.partitions} partitions"


def _describe(
    cfg: BenchConfig, stage: Stage | None, reclaim: list[ReclaimScheme], code: CodeVersion | None
) -> dict[str, Any]:
    return {
        "config": cfg,
        "code": code,  # as the run started
        "topic": stage.name if stage else None,  # the only source topic's name when there is one, as it always was
        "topics": list(stage.topics) if stage else None,
        # The endpoints that told the rows' connections apart (bench.crossing); None: not measured.
        "cross_cluster_brokers": (
            {side: host_ports(endpoints) for side, endpoints in stage.brokers.items()}
            if stage and stage.brokers
            else None
        ),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            # The package's version() returns its version string (not cimpl's (str, int) pair its stub
            # declares), so indexing it gave "2"; the distribution's metadata says it plainly.
            "confluent_kafka": importlib.metadata.version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0],
            "local_clusters": not cfg.source,
            "memory_reclaim": as_json(reclaim),
            "reader": reader_path(),
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
