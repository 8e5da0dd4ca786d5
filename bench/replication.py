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

import argparse
import contextlib
import importlib.metadata
import math
import os
import platform
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import confluent_kafka
import grpc
from confluent_kafka import KafkaException
from ferryman.service import tune_gc
from ferryman_local import LocalCluster, start_clusters

from bench.bytecode import compile_launched_code
from bench.crossing import (
    CrossingSampler,
    CrossTraffic,
    Endpoint,
    Side,
    Traffic,
    broker_endpoints,
    cross_traffic,
    ss_available,
)
from bench.errors import BenchError
from bench.latency import DRAIN_BUDGET_S, SOURCE_TOPIC_CONFIG, LatencyResult
from bench.latency import measure as measure_latency
from bench.machine import ReclaimScheme, as_json, describe_reclaim, reclaim_schemes
from bench.measure import TreeSampler, Usage
from bench.preload import PreloadResult, preload
from bench.provenance import CodeVersion, code_version
from bench.readcols import reader_path
from bench.records import MAX_PARTITIONS, MIN_VALUE_BYTES, record_bytes, split_counts
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
from bench.results import RowResult, Throughput, Verdict
from bench.rows import DEFAULT_ROWS, ROWS, Row, RowContext, RowOptions, RowUnavailableError, round_tag
from bench.stages import read_stages
from bench.together import Gate, run_together
from bench.topics import create_topics, delete_topics, describe, list_topics
from bench.verify import LiveWatcher, audit
from bench.warmup import warm_up

#: How often the throughput phase checks the row's processes and its deadlines.
_CHECK_INTERVAL_S = 0.5
#: Processes get this long to stop on SIGTERM (MirrorMaker 2 stops its connectors
#: in turn, Ferryman commits or aborts its transaction) before they are killed.
_STOP_GRACE_S = 30.0
#: The watcher closes its consumer within this long once told to stop.
_WATCHER_STOP_BUDGET_S = 10.0
#: A full read of a topic is given this long plus 1 s per 20 k records (a reader
#: here manages several hundred thousand per second; the margin covers a busy machine).
_AUDIT_BASE_S = 60.0
_AUDIT_RECORDS_PER_S = 20_000
#: Throughput-phase deadline when --timeout is not given: start-up (MirrorMaker 2
#: needs ~10 s, more on a loaded machine) plus the records at 5 k/s, far below any row.
_DEFAULT_TIMEOUT_BASE_S = 180.0
_DEFAULT_TIMEOUT_RECORDS_PER_S = 5_000
#: After the first records are visible, a row that makes no progress for this long
#: has stalled (no replicator here pauses that long by design).
_STALL_S = 60.0
#: --latency-rate value asking for half of the Ferryman row's steady rate.
_HALF_FERRYMAN = "half-ferryman"
#: Offered load of the latency phase: well below every row's maximum here (MirrorMaker 2
#: exactly-once manages ~25-40 k rec/s), so it measures latency, not queueing.
_DEFAULT_LATENCY_RATE = 5000.0
#: --smoke: a light load, the phase only has to work.
_SMOKE_LATENCY_RATE = 1000.0
_SMOKE_ROWS = ("copyloop", "ferryman")
#: Default rehearsal size cap: enough for the brokers to compile each row's paths.
_REHEARSAL_MAX_RECORDS = 200_000
#: The rehearsal's paced load: a few seconds at a rate every row sustains here.
_REHEARSAL_LATENCY_S = 5.0
_REHEARSAL_LATENCY_RATE = 50_000.0
#: Rounds of the throughput phase in a full run (one in --smoke would leave the rounds untested: two).
_DEFAULT_ROUNDS = 3
_SMOKE_ROUNDS = 2
#: Budget of the metadata request that lists a cluster's brokers (for the cross-cluster bytes): the
#: clusters have just answered the preload, so this only covers a slow first connection.
_BROKERS_BUDGET_S = 30.0
#: What a row running together waits for the others beyond the copy's deadline (their topics and launch).
_TOGETHER_SLACK_S = 300.0
#: Points of a row's visibility timeline kept in the JSON (enough to plot it).
_TIMELINE_POINTS = 200
#: Named shapes of issue 29 (scale): defaults that any explicit option overrides.
SCENARIOS: dict[str, dict[str, Any]] = {
    # Many partitions of one topic: per-partition and per-commit costs (AddPartitionsToTxn, markers, state writes).
    "partitions": {"partitions": 256, "drop_copies": True},
    # Large records (10 KB; pass --value-bytes 1024 or 102400 for the other sizes): copies, compression, memory.
    "large": {"records": 100_000, "value_bytes": 10_240},
    # Two wrappers and two dedupers sharing one flow at 256 partitions: does a second core help?
    "scale-out": {"partitions": 256, "wrapper_procs": 2, "deduper_procs": 2, "drop_copies": True},
    # 1,000 partitions over 100 topics: per-topic costs (discovery, destination topics, metadata, fetch and
    # produce requests spanning many topics) besides the per-partition ones of "partitions".
    # Every row leaves 1,000 partitions behind: with them kept, a row after MM2 EOS met ~10,000 (0.38x the
    # copy loop in one round, 1.08-2.39x with them dropped).
    "topics": {"topics": 100, "partitions": 10, "drop_copies": True},
}


@dataclass(frozen=True)
class BenchConfig:
    """One run's settings, from the command line."""

    records: int
    """Records preloaded, spread round-robin over every partition of every source topic."""
    value_bytes: int
    """Size of every value."""
    partitions: int
    """Partitions of every source topic."""
    topics: int
    """Source topics preloaded and copied (the latency phase offers its load to one more)."""
    rows: tuple[str, ...]
    """Rows to run, in order."""
    options: RowOptions
    """Knobs of the rows."""
    latency_rate: float | None
    """Offered load of the latency phase (rec/s); None: half of Ferryman's steady rate."""
    latency_duration_s: float
    """Length of the offered load; 0 skips the latency phase."""
    rounds: int
    """Copies of the preloaded topics per row, the rows interleaved round by round."""
    timeout_s: float
    """Deadline of one row's throughput phase."""
    warmup_seconds: float
    """Records written to and read from the destination before the first row; 0: none."""
    rehearsal_records: int
    """Records every row copies once, unmeasured, before any row is measured; 0: no rehearsal."""
    preload_procs: int | None
    """Producer processes of the preload; None: one per core."""
    source: str | None
    """Source bootstrap servers; None: start local clusters."""
    destination: str | None
    """Destination bootstrap servers (given together with source)."""
    work_dir: Path
    """Each run's configuration files and logs go in a dated directory under here."""
    keep_data: bool
    """Keep the data of the clusters the run started (deleted by default: gigabytes per run)."""
    json_path: Path | None
    """Where to write the raw figures, if anywhere."""
    drop_copies: bool = False
    """Delete the topics each row created, on both clusters, once it is audited (``--drop-copies``)."""
    together: bool = False
    """The rows of a round run at the same time (``--together``, ``bench.together``); no latency phase."""


@dataclass(frozen=True)
class Stage:
    """The shared set-up every row runs on."""

    run_id: str
    source: str
    destination: str
    name: str
    """The source topics' common name (``bench-<run>``); the run's other topics start with it too."""
    topics: tuple[str, ...]
    """The preloaded source topics: ``name`` itself, or ``name-tNN`` for each of several."""
    counts: list[int]
    """Records per source partition, topic after topic (``bench.records``)."""
    broker_pids: list[int]
    work_dir: Path
    brokers: Mapping[Side, frozenset[Endpoint]] | None = None
    """Every endpoint of each cluster's brokers, to tell which of a row's connections cross
    (``bench.crossing``); None: cross-cluster bytes are not measured."""


def _parse(argv: Sequence[str] | None) -> BenchConfig:
    ap = argparse.ArgumentParser(
        prog="python -m bench.replication",
        description=(__doc__ or "").splitlines()[0],
    )
    ap.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        help="a named shape (issue 29): partitions (256 partitions), large (100 k x 10 KB), scale-out (256 "
        "partitions, two wrappers and two dedupers), topics (100 topics x 10 partitions); explicit options override "
        "its settings",
    )
    ap.add_argument(
        "--records",
        type=int,
        default=1_000_000,
        help="records preloaded, spread over every partition of every source topic (%(default)s)",
    )
    ap.add_argument("--value-bytes", type=int, default=100, help="size of every value, keys are 8 bytes (%(default)s)")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the source topics (%(default)s)")
    ap.add_argument(
        "--topics",
        type=int,
        default=1,
        help="source topics preloaded and copied, each with --partitions partitions; the latency phase offers its "
        "load to one topic whatever this is (%(default)s)",
    )
    ap.add_argument(
        "--rows",
        help=f"comma-separated, from: {', '.join(ROWS)} (default: {','.join(DEFAULT_ROWS)}; --smoke: "
        f"{','.join(_SMOKE_ROWS)})",
    )
    ap.add_argument("--wrapper-procs", type=int, default=1, help="ferryman: wrapper processes (%(default)s)")
    ap.add_argument("--deduper-procs", type=int, default=1, help="ferryman: deduper processes (%(default)s)")
    ap.add_argument(
        "--ferryman-txn-ms", type=int, help="ferryman: deduper.transaction_interval_ms (default: service's)"
    )
    ap.add_argument(
        "--staging-partitions",
        type=int,
        help="ferryman: flows[].staging_partitions (default: the service's, whatever the source partition count)",
    )
    ap.add_argument(
        "--compression",
        "--staging-compression",
        dest="compression",
        default="none",
        choices=["none", "gzip", "snappy", "lz4", "zstd"],
        help="producer compression of every row: ferryman's staging hop (wrapper.compression_type; its dedupers "
        "keep the service's none), the copy loop's and mm2's destination producer (%(default)s: the bytes never "
        "leave this machine; the wrapper's own default, lz4, is for a WAN). With the wrapper next to the source "
        "its staging batches cross; the others run next to the destination, where what crosses is the source's "
        "batches as its producers wrote them, whatever this says",
    )
    ap.add_argument("--mm2-tasks", type=int, default=2, help="mm2 rows: tasks.max (%(default)s: one per core here)")
    ap.add_argument(
        "--mm2-producer-tuning", action="store_true", help="mm2 rows: 1 MB batches, linger 5 ms (default: as shipped)"
    )
    ap.add_argument(
        "--latency-rate",
        help=f"offered load of the latency phase, rec/s, or {_HALF_FERRYMAN} (default: {_HALF_FERRYMAN} when the "
        f"ferryman row runs, else {_DEFAULT_LATENCY_RATE:.0f}; --smoke: {_SMOKE_LATENCY_RATE:.0f})",
    )
    ap.add_argument(
        "--latency-seconds",
        type=float,
        default=20.0,
        help="length of the latency phase (its load goes to one topic, whatever --topics), s; 0 skips it (%(default)s)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help=f"copies of the preloaded topics per row, rows interleaved round by round; the latency phase runs in "
        f"the first (default: {_DEFAULT_ROUNDS}; --smoke: {_SMOKE_ROUNDS})",
    )
    ap.add_argument("--timeout", type=float, help="deadline of one row's throughput phase, s (default: by size)")
    ap.add_argument(
        "--warmup-seconds",
        type=float,
        default=30.0,
        help="warm-up traffic through both brokers before the first row, s; 0: none (%(default)s)",
    )
    ap.add_argument(
        "--rehearsal-records",
        type=int,
        help="records every row copies once, unmeasured, before any is measured; 0: none "
        "(default: a fifth of --records, at most 200 000; --smoke: 0)",
    )
    ap.add_argument("--preload-procs", type=int, help="preload producer processes (default: one per core)")
    ap.add_argument("--source-bootstrap", "--source", dest="source", help="use this source cluster")
    ap.add_argument("--destination-bootstrap", "--destination", dest="destination", help="and this destination")
    ap.add_argument(
        "--dir", type=Path, default=Path(".ferryman/bench"), help="work dirs and logs go under here (%(default)s)"
    )
    ap.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the data of the clusters this run starts (default: deleted at the end, logs kept)",
    )
    ap.add_argument(
        "--drop-copies",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="delete the topics each row created (its copies, internal and latency topics) on both clusters once "
        "it is audited, so that every row and round meets brokers holding the same partitions (default: kept, "
        "dropped in the partitions, scale-out and topics scenarios)",
    )
    ap.add_argument(
        "--together",
        action="store_true",
        help="run the rows of each round at the same time, an A/B whose rows meet the same machine (their CPU "
        "per record compares; each rate is a share of the machine); no latency phase, not with --drop-copies",
    )
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--smoke", action="store_true", help="tiny run that only checks the bench works (< ~90 s)")
    scenario = ap.parse_known_args(argv)[0].scenario
    if scenario is not None:
        ap.set_defaults(**SCENARIOS[scenario])
    args = ap.parse_args(argv)
    if args.smoke:
        args.records, args.partitions, args.latency_seconds, args.warmup_seconds = 20_000, 4, 3.0, 3.0
        args.rehearsal_records = 0
    if args.rounds is None:
        args.rounds = _SMOKE_ROUNDS if args.smoke else _DEFAULT_ROUNDS
    if args.rehearsal_records is None:
        args.rehearsal_records = min(_REHEARSAL_MAX_RECORDS, args.records // 5)
    args.rows = args.rows or ",".join(_SMOKE_ROWS if args.smoke else DEFAULT_ROWS)
    rows = tuple(r.strip() for r in args.rows.split(",") if r.strip())
    if not args.latency_rate:
        # The goal is latency at half of Ferryman's maximum rate: measured as such whenever that row runs.
        default = _HALF_FERRYMAN if "ferryman" in rows else str(_DEFAULT_LATENCY_RATE)
        args.latency_rate = str(_SMOKE_LATENCY_RATE) if args.smoke else default
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or not rows or len(set(rows)) != len(rows):
        ap.error(f"--rows: give distinct rows from {', '.join(ROWS)} (got {args.rows!r})")
    if args.value_bytes < MIN_VALUE_BYTES:
        ap.error(f"--value-bytes must be at least {MIN_VALUE_BYTES} (the sequence header)")
    positive = (args.records, args.partitions, args.topics, args.wrapper_procs, args.deduper_procs, args.mm2_tasks)
    if min(*positive, args.rounds) < 1:
        ap.error("--records, --partitions, --topics, --*-procs, --mm2-tasks and --rounds must be positive")
    if args.staging_partitions is not None and args.staging_partitions < 1:
        ap.error("--staging-partitions must be positive")
    if args.rehearsal_records < 0:
        ap.error("--rehearsal-records must not be negative")
    if args.topics * args.partitions > MAX_PARTITIONS:
        ap.error(
            f"--topics x --partitions: at most {MAX_PARTITIONS} (the record header's partition field numbers the "
            "partitions of all source topics)"
        )
    if args.together:
        if len(rows) < 2:
            ap.error("--together needs at least two --rows")
        if args.drop_copies:
            ap.error("--together: not with --drop-copies (a row would drop the copies of the rows beside it)")
        args.latency_seconds = 0.0
    if bool(args.source) != bool(args.destination):
        ap.error("give both --source-bootstrap and --destination-bootstrap, or neither")
    if args.latency_rate == _HALF_FERRYMAN:
        if "ferryman" not in rows:
            ap.error(f"--latency-rate {_HALF_FERRYMAN} needs the ferryman row")
        latency_rate = None
        rows = ("ferryman", *(r for r in rows if r != "ferryman"))  # its rate is needed first
    else:
        try:
            latency_rate = float(args.latency_rate)
        except ValueError:
            ap.error(f"--latency-rate: a number or {_HALF_FERRYMAN}")
        if latency_rate <= 0:
            ap.error("--latency-rate must be positive")
    return BenchConfig(
        records=args.records,
        value_bytes=args.value_bytes,
        partitions=args.partitions,
        topics=args.topics,
        rows=rows,
        options=RowOptions(
            wrapper_procs=args.wrapper_procs,
            deduper_procs=args.deduper_procs,
            ferryman_txn_ms=args.ferryman_txn_ms,
            compression=args.compression,
            staging_partitions=args.staging_partitions,
            mm2_tasks=args.mm2_tasks,
            mm2_producer_tuning=args.mm2_producer_tuning,
        ),
        latency_rate=latency_rate,
        latency_duration_s=args.latency_seconds,
        rounds=args.rounds,
        timeout_s=args.timeout or _DEFAULT_TIMEOUT_BASE_S + args.records / _DEFAULT_TIMEOUT_RECORDS_PER_S,
        warmup_seconds=args.warmup_seconds,
        rehearsal_records=args.rehearsal_records,
        preload_procs=args.preload_procs,
        source=args.source,
        destination=args.destination,
        work_dir=args.dir,
        keep_data=args.keep_data,
        drop_copies=args.drop_copies,
        together=args.together,
        json_path=args.json,
    )


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _create_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, config: dict[str, str] | None = None
) -> None:
    # retention.ms=-1: nothing is deleted under the bench, whatever the broker's retention checks.
    create_topics(bootstrap, topics, partitions, {"retention.ms": "-1", **(config or {})})


def _audit_budget(records: int) -> float:
    return _AUDIT_BASE_S + records / _AUDIT_RECORDS_PER_S


def _source_topics(name: str, n: int) -> tuple[str, ...]:
    """The names of ``n`` source topics: ``name`` itself for one (as the bench always named it), else ``name-tNN``."""
    if n == 1:
        return (name,)
    width = len(str(n - 1))
    return tuple(f"{name}-t{i:0{width}d}" for i in range(n))


def _preloaded_topics(
    cfg: BenchConfig, source: str, name: str, records: int
) -> tuple[tuple[str, ...], list[int], PreloadResult]:
    """Create the source topics (``_source_topics``) and fill them with ``records`` bench records.

    Returns:
        The topics, the records of each of their partitions (topic after topic) and how the preload went.
    """
    topics = _source_topics(name, cfg.topics)
    counts = split_counts(records, cfg.topics * cfg.partitions)
    _create_topics(source, topics, cfg.partitions)
    loaded = preload(
        source, topics, counts, cfg.value_bytes, processes=cfg.preload_procs, budget_s=_audit_budget(records)
    )
    return topics, counts, loaded


def _stage(cfg: BenchConfig, source: str, destination: str, broker_pids: list[int], base: Path) -> Stage:
    """Preload the source topics, check them, and warm both brokers."""
    run_id = uuid.uuid4().hex[:6]
    name = f"bench-{run_id}"
    topics, counts, loaded = _preloaded_topics(cfg, source, name, cfg.records)
    _log(
        f"preloaded {describe(topics)}: {loaded.records:,} records in {loaded.seconds:.1f} s "
        f"({loaded.processes} processes)"
    )
    check = audit(source, topics, counts, _audit_budget(cfg.records))
    t = check.tally
    if not (check.read_to_end and t.complete and t.duplicates == 0 and t.misplaced == 0):
        raise BenchError(f"the preloaded source topics are not what was written: {t} ({check.error})")
    _log(
        f"source read back complete in {check.seconds:.1f} s: the reader's ceiling is "
        f"~{t.unique / check.seconds:,.0f} rec/s (rows near it are reader-bound)"
    )
    if cfg.warmup_seconds > 0:
        w = warm_up(source, destination, f"{name}-warmup", cfg.partitions, cfg.warmup_seconds, cfg.value_bytes)
        _log(
            f"brokers warmed up in {w.seconds:.1f} s: {w.offered:,} records offered, "
            f"{w.relayed:,} relayed in transactions, {w.read:,} read back"
        )
    brokers = _broker_endpoints(source, destination)
    return Stage(run_id, source, destination, name, topics, counts, broker_pids, base, brokers)


def _broker_endpoints(source: str, destination: str) -> dict[Side, frozenset[Endpoint]] | None:
    """Each cluster's broker endpoints for ``bench.crossing``; None (logged) when they cannot be told apart."""
    if not ss_available():
        _log("cross-cluster bytes not measured: ss (iproute2) is not installed")
        return None
    try:
        brokers: dict[Side, frozenset[Endpoint]] = {
            "source": broker_endpoints(source, _BROKERS_BUDGET_S),
            "destination": broker_endpoints(destination, _BROKERS_BUDGET_S),
        }
    except (KafkaException, OSError, ValueError) as exc:
        _log(f"cross-cluster bytes not measured: the brokers' endpoints could not be listed ({exc})")
        return None
    if shared := brokers["source"] & brokers["destination"]:
        _log(f"cross-cluster bytes not measured: source and destination share brokers ({_endpoints(shared)})")
        return None
    _log(
        f"cross-cluster bytes: source brokers {_endpoints(brokers['source'])}, destination brokers "
        f"{_endpoints(brokers['destination'])}"
    )
    return brokers


def _endpoints(endpoints: frozenset[Endpoint]) -> list[str]:
    return [f"{e.host}:{e.port}" for e in sorted(endpoints)]


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
    topics, counts, _loaded = _preloaded_topics(cfg, stage.source, stem, cfg.rehearsal_records)
    rehearsal = Stage(
        run_id, stage.source, stage.destination, stem, topics, counts, [], stage.work_dir / "rehearsal", stage.brokers
    )
    short = replace(cfg, latency_duration_s=min(cfg.latency_duration_s, _REHEARSAL_LATENCY_S))
    for name in cfg.rows:
        started = time.monotonic()
        result = _run_row(ROWS[name], short, rehearsal, cfg.latency_rate or _REHEARSAL_LATENCY_RATE)
        _log(f"{name}: rehearsed in {time.monotonic() - started:.1f} s ({result.status})")


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


def _destination_topics(row: Row, stage: Stage) -> list[str]:
    """Where ``row`` copies the preloaded topics, in their order."""
    return [row.destination_topic(t) for t in stage.topics]


def _verdict(stage: Stage, row: Row) -> Verdict:
    found = audit(stage.destination, _destination_topics(row, stage), stage.counts, _audit_budget(sum(stage.counts)))
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


def _run_row(
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
        _log(f"{cls.name}: unavailable: {exc}")
        return result
    result.settings = dict(row.settings())
    result.placement = row.placement()
    existing: dict[str, set[str]] = {}  # each cluster's topics before the row (--drop-copies)
    try:
        if cfg.drop_copies:
            existing = {side: set(list_topics(side)) for side in (stage.source, stage.destination)}
        with contextlib.ExitStack() as cleanup:  # unwinds in reverse: watcher, samplers, then the row
            cleanup.callback(row.stop, _STOP_GRACE_S)
            _create_topics(stage.source, [lat_topic], cfg.partitions, SOURCE_TOPIC_CONFIG)
            row.prepare()
            if gate is not None:
                gate.wait()
            _measure(row, cfg, stage, lat_topic, latency_rate, result, cleanup)
        _read_stages(row, result)  # the row has stopped: its services flushed their last spans
        if gate is not None:
            gate.wait()
        if result.throughput is not None and result.throughput.records:
            result.verdict = _verdict(stage, row)
    except Exception as exc:  # a broken row is reported, the next row still runs
        result.fail(f"{type(exc).__name__}: {exc}")
    if existing:
        _drop_copies(cls.name, existing)
    _judge(result)
    _log(f"{cls.name}: {result.status}" + (f" ({'; '.join(result.reasons)})" if result.reasons else ""))
    return result


def _read_stages(row: Row, result: RowResult) -> None:
    """Split a traced row's latency phase by stage (``bench.stages``), from the spans its services wrote."""
    spans = row.spans_file()
    if result.latency is None or spans is None:
        return
    stages = read_stages(spans, result.latency.started_s)
    if stages is None:
        _log(f"{row.name}: no traced record of the latency phase in {spans}")
        return
    result.latency = replace(result.latency, stages=stages.as_dict())
    _log(f"{row.name}: where the latency phase's " + stages.describe())


def _drop_copies(row: str, existing: Mapping[str, set[str]]) -> None:
    """Delete the topics a row created on each cluster (named by bootstrap in ``existing``, with its topics before)."""
    for bootstrap, before in existing.items():
        try:
            created = {name: n for name, n in list_topics(bootstrap).items() if name not in before}
            delete_topics(bootstrap, created)
            partitions = sum(created.values())
        except Exception as exc:  # the next row meets more partitions, as without --drop-copies
            _log(f"{row}: dropping its topics on {bootstrap} failed: {type(exc).__name__}: {exc}")
            continue
        if created:
            _log(f"{row}: dropped the {len(created)} topics ({partitions:,} partitions) it created on {bootstrap}")


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
    _log(f"round {round_no} of {cfg.rounds}")
    again = replace(stage, run_id=f"{stage.run_id}r{round_no}", work_dir=stage.work_dir / f"round{round_no}")
    once = replace(cfg, latency_duration_s=0.0)
    ran = [result for result in round_order(results, round_no) if result.status != "unavailable"]
    if cfg.together:
        repeats = run_together(
            ran, lambda r, gate: _run_row(ROWS[r.row], once, again, None, round_no, gate), _together_budget(cfg)
        )
    else:
        repeats = [_run_row(ROWS[result.row], once, again, None, round_no) for result in ran]
    for result, repeat in zip(ran, repeats, strict=True):
        if repeat.throughput is not None:
            result.repeats.append(repeat.throughput)
        for reason in repeat.reasons:
            result.fail(f"round {round_no}: {reason}")


def _together_budget(cfg: BenchConfig) -> float:
    """How long a row running together waits for the others at a step: their preparation, or their copy."""
    return cfg.timeout_s + _TOGETHER_SLACK_S


def _measure(
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
    cleanup.callback(lambda: _record_peak_rss(result, sampler))
    # Its first reading, now, is the copy's start: every socket the row opens from here counts in full.
    crossing = _crossing_sampler(row, stage)
    if crossing is not None:
        cleanup.callback(crossing.stop)
    first = _FirstVisible(sampler)
    deadline = launched + cfg.timeout_s
    watcher = LiveWatcher(stage.destination, _destination_topics(row, stage), stage.counts, deadline, on_first=first)
    cleanup.callback(watcher.stop, _WATCHER_STOP_BUDGET_S)
    _log(f"{row.name}: launched (logs in {row.ctx.work_dir}); copying {sum(stage.counts):,} records")
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
    _log(
        f"{row.name}: {tp.records:,} visible; steady {tp.steady_rps or math.nan:,.0f} rec/s, "
        f"from start {tp.from_start_rps or math.nan:,.0f} rec/s, {tp.cpu_s_per_m or math.nan:.1f} CPU s/M"
        + _split_per_million(cpu_by_program, tp.records)
        + _kernel_share(tp)
    )
    _log(f"{row.name}: by program, per million records: " + _usage_per_million(usage_by_program, tp.records))
    if tp.cross_cluster is not None:
        _log(f"{row.name}: crossed between the regions in the copy: " + _crossed(tp.cross_cluster, cfg.value_bytes))
    if failure:
        result.fail(failure)
        return
    if cfg.latency_duration_s <= 0:
        return
    if latency_rate is None:
        latency_rate = tp.steady_rps / 2 if tp.steady_rps else _DEFAULT_LATENCY_RATE
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
    _log(
        f"{row.name}: kept up with the offered load for {result.latency.replicator_cpu_s_per_m:.2f} CPU s/M"
        + _split_per_million(by_program, lat.records)
    )
    if crossed is not None:
        _log(f"{row.name}: crossed between the regions at the offered load: " + _crossed(crossed, cfg.value_bytes))
    if counters.get("commits"):
        n = counters["commits"]
        _log(
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
        _log(f"{row.name}: cross-cluster bytes not measured: its sockets could not be read ({exc})")
        return None


def _read_crossing(crossing: CrossingSampler | None, row: Row) -> Traffic | None:
    """``crossing.read()``, or None (logged) when ``ss`` fails: the figure is left out, the row goes on."""
    if crossing is None:
        return None
    try:
        return crossing.read()
    except (subprocess.SubprocessError, OSError) as exc:
        _log(f"{row.name}: its sockets could not be read ({exc})")
        return None


def _crossed(crossed: CrossTraffic, value_bytes: int) -> str:
    """The crossing figures for a log line.

    For instance ``"12.3 MB, 123.4 B/record (113 B of payload): ferryman-wrapper to destination brokers 12.2 MB,
    ferryman-wrapper to ferryman-deduper 0.1 MB"``, with the sockets that closed in the phase when there were some.
    """
    per_record = crossed.bytes_per_record
    out = (
        f"{crossed.total_bytes / 1e6:,.1f} MB, {per_record or math.nan:,.1f} B/record "
        f"({record_bytes(value_bytes)} B of payload): "
    )
    out += ", ".join(f"{link} {crossed.by_link[link].total_bytes / 1e6:,.2f} MB" for link in crossed.crossing_links)
    if crossed.sockets_closed:
        out += f"; {crossed.sockets_closed} sockets closed in the phase (counted to their last reading)"
    return out


def _counters(row: Row) -> Mapping[str, float]:
    """``row.counters()``, or none (logged) when the replicator does not answer: they explain, never decide."""
    try:
        return row.counters()
    except grpc.RpcError as exc:
        _log(f"{row.name}: its counters could not be read ({exc.code()}: {exc.details()})")
        return {}


def _kernel_share(tp: Throughput) -> str:
    """The kernel's part of the row's and the brokers' CPU per million records, as a suffix for a log line.

    For instance ``"; kernel 0.45; brokers 1.3 CPU s/M, kernel 0.52"`` (brokers only for local clusters).
    """
    out = f"; kernel {tp.kernel_cpu_s_per_m:.2f}" if tp.kernel_cpu_s_per_m is not None else ""
    if tp.broker_cpu_s_per_m is not None and tp.broker_kernel_cpu_s_per_m is not None:
        out += f"; brokers {tp.broker_cpu_s_per_m:.1f} CPU s/M, kernel {tp.broker_kernel_cpu_s_per_m:.2f}"
    return out


def _split_per_million(cpu_by_program: dict[str, float], records: int) -> str:
    """CPU s per million records of each program, as a suffix for a log line, when there are several.

    For instance ``" (ferryman-deduper 1.30, ferryman-wrapper 1.10)"``; "" for a one-program row.
    """
    if len(cpu_by_program) < 2 or not records:
        return ""
    return " (" + ", ".join(f"{k} {v / records * 1e6:.2f}" for k, v in cpu_by_program.items()) + ")"


def _usage_per_million(usage_by_program: Mapping[str, Usage], records: int) -> str:
    """Each program's CPU, kernel part and minor faults per million records, for a log line.

    For instance ``"ferryman-deduper 1.30 CPU s (kernel 0.21), 58 k faults; ferryman-wrapper ..."``.
    """
    per_m = 1e6 / records if records else math.nan
    return "; ".join(
        f"{name} {u.cpu_s * per_m:.2f} CPU s (kernel {u.kernel_s * per_m:.2f}), "
        f"{u.minor_faults * per_m / 1e3:.0f} k faults"
        for name, u in usage_by_program.items()
    )


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
    _log(f"{label}: latency phase, {rate:,.0f} rec/s offered for {cfg.latency_duration_s:.0f} s")
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
    _log(
        f"{label}: latency p50 {lat.p50_ms:.0f} ms, p99 {lat.p99_ms:.0f} ms, max {lat.max_ms:.0f} ms; "
        f"machine {lat.machine_busy_cores:.2f} cores busy, load and reader {lat.rig_cores:.2f} "
        f"(generator: {lat.generator_priority or 'priority unknown'})"
    )
    return lat


def _latency_floor(cfg: BenchConfig, stage: Stage, rate: float) -> LatencyResult:
    """The latency phase with nothing replicating: the reader follows the source topic itself.

    Same offered load, generator and reader as the rows' latency phases, so this is
    the floor every row's figure stands on, and how much of the machine the
    measurement itself takes.
    """
    topic = f"{stage.name}-lat-floor"
    _create_topics(stage.source, [topic], cfg.partitions, SOURCE_TOPIC_CONFIG)
    return _latency_phase(cfg, "latency floor (no replicator)", stage.source, topic, stage.source, topic, rate)


def _record_peak_rss(result: RowResult, sampler: TreeSampler) -> None:
    sampler.stop()
    if result.throughput is not None:
        result.throughput = replace(result.throughput, peak_rss_mb=sampler.peak_rss_bytes / 1e6)


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    # Unwind through the finally blocks that stop the rows' processes and the clusters.
    raise SystemExit(128 + signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return 1 if a row FAILED, 2 if the set-up (preload, warm-up) failed."""
    cfg = _parse(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    base = (cfg.work_dir / time.strftime("%Y%m%d-%H%M%S")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    _log(f"{cfg.records:,} records x {cfg.value_bytes} B, {_shape(cfg)}; rows {', '.join(cfg.rows)}; work dir {base}")
    clusters: list[LocalCluster] = []
    results: list[RowResult] = []
    floor: LatencyResult | None = None
    stage: Stage | None = None
    if not compile_launched_code():
        _log("set-up failed: the launched code does not compile")
        return 2
    # This process reads every copied record back (the live watcher, the audits) on the
    # cores the rows run on, and each consumed record is a GC-tracked Message: with
    # CPython's defaults a third of its CPU went to collections (see docs/notes.md,
    # session 11), taken from whichever row was running. The services' setting keeps it off.
    tune_gc()
    _log(f"reader of the destination: {reader_path()}")
    code = code_version()
    _log(f"code measured: {code.describe() if code else 'not a git checkout'}")
    reclaim = reclaim_schemes()
    if (reclaim_note := describe_reclaim(reclaim)) is not None:
        _log(reclaim_note)
    try:
        if cfg.source and cfg.destination:
            source, destination, broker_pids = cfg.source, cfg.destination, []
        else:
            # Deleted topics' files go after 1 s instead of 60: the next row must not meet them.
            dropped = {"file.delete.delay.ms": "1000"} if cfg.drop_copies else None
            clusters = start_clusters(["source", "destination"], base_dir=base / "clusters", extra_properties=dropped)
            source, destination = clusters[0].bootstrap_servers, clusters[1].bootstrap_servers
            broker_pids = [c.pid for c in clusters if c.pid is not None]
            _log(f"clusters up: source {source}, destination {destination}")
        try:
            stage = _stage(cfg, source, destination, broker_pids, base)
        except BenchError as exc:
            _log(f"set-up failed: {exc}")
            return 2
        if cfg.rehearsal_records:
            _rehearse(cfg, stage)
        rate = cfg.latency_rate
        if cfg.together:  # no latency phase: the rate is not needed
            _log(f"rows run together: {', '.join(cfg.rows)}")
            results = run_together(
                cfg.rows, lambda name, gate: _run_row(ROWS[name], cfg, stage, None, 1, gate), _together_budget(cfg)
            )
        else:
            for name in cfg.rows:
                result = _run_row(ROWS[name], cfg, stage, rate)
                results.append(result)
                if rate is None:  # half-ferryman: ferryman ran first and offered half its own rate to itself
                    rate = result.latency.offered_rate if result.latency is not None else _DEFAULT_LATENCY_RATE
                    _log(f"latency phases offer {rate:,.0f} rec/s")
        for round_no in range(2, cfg.rounds + 1):
            _repeat(cfg, stage, round_no, results)
        if cfg.latency_duration_s > 0 and rate is not None:
            floor = _latency_floor(cfg, stage, rate)
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
        _log(f"raw figures in {cfg.json_path}")
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
            {side: _endpoints(endpoints) for side, endpoints in stage.brokers.items()}
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
