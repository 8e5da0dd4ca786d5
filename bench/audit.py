"""Audit-rate benchmark: ``ferryman audit`` verifying what Ferryman replicated, on the same machine and data.

``python -m bench.audit [--records 5000000] [--value-bytes 100] [--partitions 8] [--runs 3]
[--master local[2 x cores]] [--json out.json] [--smoke]``

One run starts two local clusters (or uses ``--source-bootstrap`` /
``--destination-bootstrap``), preloads the source topic (``bench.preload``),
warms both brokers (``bench.warmup``), then:

1. replication: the bench's Ferryman row (``bench.rows.ferryman``: wrapper and
   deduper processes) copies the topic while a read_committed watcher times it
   (steady: first to last record visible; and from launch), and samples the
   CPU of its processes; the row is then stopped, so the audit has the machine
   to itself as the copy had;
2. audit: a Spark session (its start timed apart: ``ferryman audit schedule``
   keeps one for its life), then ``--runs`` audits of the whole flow, each
   timed: source records verified per second, with the source, the destination
   and the offset map read and aligned both ways (explicit offsets from the
   start, so every run reads everything; the first also pays the start of
   Spark's Python workers); CPU of the Spark JVM, its Python workers and this
   process;
3. the table: Ferryman's rates beside the audit's and their ratio (goal: the
   audit verifies at least as fast as Ferryman replicates, >= 1.0x). Every
   audit must say EXACTLY_ONCE with every record expected and found.

A benchmark, not a test: exit 1 when an audit is not clean or the copy is incomplete, 2 when the set-up failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from ferryman.config import load_config
from ferryman.service import tune_gc
from ferryman_auditor import AuditRange, run_audit, spark_session
from ferryman_auditor._align import PAIRING
from ferryman_auditor._identity import CODER
from ferryman_auditor._spark import DEFAULT_MASTER
from ferryman_auditor.kafka_source._reader import compiled_path
from ferryman_local import LocalCluster, start_clusters

from bench.measure import TreeSampler
from bench.preload import preload
from bench.provenance import CodeVersion, code_version
from bench.records import split_counts
from bench.report import print_tables
from bench.rows import RowContext, RowOptions
from bench.rows.ferryman import FerrymanRow
from bench.topics import create_topics
from bench.verify import LiveWatcher
from bench.warmup import warm_up

#: Processes get this long to stop on SIGTERM (the deduper commits or aborts its transaction).
_STOP_GRACE_S = 30.0
#: The copy's deadline: start-up plus the records at 5 k/s, far below Ferryman's rate here.
_COPY_BASE_S, _COPY_RECORDS_PER_S = 180.0, 5_000
#: The preload's budget: generous, one Python producer per core manages a few hundred thousand per second.
_PRELOAD_BASE_S, _PRELOAD_RECORDS_PER_S = 60.0, 20_000
_SMOKE_RECORDS, _SMOKE_PARTITIONS, _SMOKE_WARMUP_S = 50_000, 4, 3.0
_DEFAULT_RUNS = 3


@dataclass(frozen=True)
class Rate:
    """One timed phase: how many records, how long, and the CPU it took."""

    label: str
    records: int
    seconds: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_s_per_m(self) -> float:
        """CPU seconds per million records."""
        return self.cpu_s / self.records * 1e6 if self.records else 0.0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.audit", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--records", type=int, default=5_000_000, help="records preloaded and replicated (%(default)s)")
    ap.add_argument("--value-bytes", type=int, default=100, help="size of every value (%(default)s)")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the source topic (%(default)s)")
    ap.add_argument(
        "--runs",
        type=int,
        help="audits of the whole flow in one Spark session (default 3: the first pays the Python workers' start, "
        "the JVM compiles for a while after it; --smoke: 1)",
    )
    ap.add_argument("--master", default=DEFAULT_MASTER, help="Spark master (%(default)s)")
    ap.add_argument("--warmup-seconds", type=float, default=30.0, help="broker warm-up traffic, s (%(default)s)")
    ap.add_argument("--source-bootstrap", "--source", dest="source", help="use this source cluster")
    ap.add_argument("--destination-bootstrap", "--destination", dest="destination", help="and this destination")
    ap.add_argument("--dir", type=Path, default=Path(".ferryman/bench-audit"), help="work dirs (%(default)s)")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--smoke", action="store_true", help=f"{_SMOKE_RECORDS:,} records: only checks the bench works")
    args = ap.parse_args(argv)
    if args.smoke:
        args.records, args.partitions, args.warmup_seconds = _SMOKE_RECORDS, _SMOKE_PARTITIONS, _SMOKE_WARMUP_S
    if args.runs is None:
        args.runs = 1 if args.smoke else _DEFAULT_RUNS
    if min(args.records, args.partitions, args.runs) < 1:
        ap.error("--records, --partitions and --runs must be positive")
    if bool(args.source) != bool(args.destination):
        ap.error("give both --source-bootstrap and --destination-bootstrap, or neither")
    return args


def _log(msg: str) -> None:
    print(f"[bench-audit {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _replicate(
    args: argparse.Namespace, source: str, destination: str, topic: str, work: Path
) -> tuple[Rate, Rate, Path]:
    """Copy topic with the Ferryman row; return its steady and from-launch rates and its configuration file.

    Raises:
        RuntimeError: the copy did not complete (a process died, the deadline passed).
    """
    counts = split_counts(args.records, args.partitions)
    ctx = RowContext(uuid.uuid4().hex[:6], source, destination, (topic,), args.partitions, work, RowOptions())
    row = FerrymanRow(ctx)
    row.check()
    launched = time.monotonic()
    row.launch()
    try:
        sampler = TreeSampler(p.pid for p in row.processes)
        deadline = launched + _COPY_BASE_S + args.records / _COPY_RECORDS_PER_S
        watcher = LiveWatcher(destination, [row.destination_topic(topic)], counts, deadline)
        while not watcher.done.wait(0.5):
            if (died := row.exited()) is not None or time.monotonic() > deadline:
                raise RuntimeError(died or f"timeout: {watcher.tally.unique:,} of {args.records:,} visible")
        cpu_s = sampler.stop()
        watcher.stop(_STOP_GRACE_S)
    finally:
        row.stop(_STOP_GRACE_S)
    t = watcher.tally
    if watcher.error or not t.complete or t.duplicates:
        raise RuntimeError(f"incomplete or duplicated copy: {t} ({watcher.error})")
    first, last = watcher.first_visible, watcher.last_visible
    assert first is not None  # complete, so records were seen
    assert last is not None
    steady = Rate("ferryman replication, steady", t.unique - watcher.first_batch_records, last - first, cpu_s)
    whole = Rate("ferryman replication, from launch", t.unique, last - launched, cpu_s)
    return steady, whole, work / "ferryman.yaml"


def _spark_jvm() -> psutil.Process:
    """The JVM of this process's Spark session (spark-submit's java, a child of this process)."""
    for child in psutil.Process().children(recursive=True):
        try:
            if "org.apache.spark.deploy.SparkSubmit" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    raise RuntimeError("the Spark JVM was not found among this process's children")


def _own_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def _audit(args: argparse.Namespace, config_path: Path) -> tuple[float, list[Rate], list[str]]:
    """Start Spark, audit the flow ``--runs`` times; return the start's seconds, each run's rate, and any fault."""
    config = load_config(config_path, env={})
    flow = config.flows[0]
    started = time.monotonic()
    spark = spark_session(args.master, app_name="ferryman-bench-audit")
    start_s = time.monotonic() - started
    _log(f"Spark session ({args.master}) started in {start_s:.1f} s")
    why_not = compiled_path()
    reader = "compiled (_spanread)" if why_not is None else f"consume() ({why_not})"
    _log(
        f"this process's audit paths (executors import the same package): span reader {reader}, codes {CODER}, "
        f"pairing {PAIRING}"
    )
    rates: list[Rate] = []
    faults: list[str] = []
    try:
        jvm = TreeSampler([_spark_jvm().pid])
        for n in range(1, args.runs + 1):
            cpu_before, own_before = jvm.sample(), _own_cpu_s()
            began = time.monotonic()
            report = run_audit(spark, config, flow, AuditRange(kind="offsets"))
            seconds = time.monotonic() - began
            cpu = jvm.sample() - cpu_before + _own_cpu_s() - own_before
            totals = report.totals()
            label = f"audit run {n}" + (" (cold Python workers)" if n == 1 else "")
            rates.append(Rate(label, totals["expected"], seconds, cpu))
            _log(f"{label}: {report.verdict}, {totals['expected']:,} in {seconds:.1f} s ({rates[-1].per_s:,.0f}/s)")
            clean = report.verdict == "EXACTLY_ONCE" and totals["expected"] == totals["found"] == args.records
            if not clean:
                faults.append(f"{label}: {report.verdict}, totals {totals}")
        jvm.stop()
    finally:
        spark.stop()
    return start_s, rates, faults


def _table(replication: Sequence[Rate], audits: Sequence[Rate], start_s: float) -> list[list[str]]:
    baseline = replication[0].per_s
    cells = [
        [
            r.label,
            f"{r.records:,}",
            f"{r.seconds:.1f}",
            f"{r.per_s:,.0f}",
            f"{r.cpu_s_per_m:.2f}",
            f"{r.per_s / baseline:.2f}x",
        ]
        for r in (*replication, *audits)
    ]
    cells.append(["Spark session start (once per scheduler)", "", f"{start_s:.1f}", "", "", ""])
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 1 when an audit is not clean, 2 when the set-up or the copy failed."""
    args = _parse(argv)
    base = (args.dir / time.strftime("%Y%m%d-%H%M%S")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    _log(f"{args.records:,} records x {args.value_bytes} B, {args.partitions} partitions; work dir {base}")
    code = code_version()
    _log(f"code measured: {code.describe() if code else 'not a git checkout'}")
    tune_gc()  # as bench.replication: this process reads every copied record back while the row runs
    clusters: list[LocalCluster] = []
    try:
        if args.source:
            source, destination = args.source, args.destination
        else:
            clusters = start_clusters(["source", "destination"], base_dir=base / "clusters")
            source, destination = clusters[0].bootstrap_servers, clusters[1].bootstrap_servers
        topic = f"bench-audit-{uuid.uuid4().hex[:6]}"
        create_topics(source, [topic], args.partitions, {"retention.ms": "-1"})
        budget = _PRELOAD_BASE_S + args.records / _PRELOAD_RECORDS_PER_S
        loaded = preload(
            source, [topic], split_counts(args.records, args.partitions), args.value_bytes, budget_s=budget
        )
        _log(f"preloaded {topic}: {loaded.records:,} records in {loaded.seconds:.1f} s")
        if args.warmup_seconds > 0:
            warm_up(source, destination, f"{topic}-warmup", args.partitions, args.warmup_seconds, args.value_bytes)
        work = base / "ferryman"
        work.mkdir()
        try:
            steady, whole, config_path = _replicate(args, source, destination, topic, work)
        except RuntimeError as exc:
            _log(f"the copy failed: {exc}")
            return 2
        _log(f"ferryman: {whole.records:,} replicated, steady {steady.per_s:,.0f}/s, {whole.cpu_s_per_m:.2f} CPU s/M")
        start_s, audits, faults = _audit(args, config_path)
    finally:
        for c in clusters:
            c.stop()
            shutil.rmtree(c.data_dir, ignore_errors=True)  # gigabytes per run; the broker logs stay
    print()
    header = ["phase", "records", "seconds", "records/s", "CPU s/M", "vs ferryman steady"]
    title = f"Audit rate: {args.records:,} records x {args.value_bytes} B, {args.partitions} partitions, {args.master}"
    print_tables([(title, header, _table((steady, whole), audits, start_s))])
    # The fastest run after the first: identical runs here differ by 2x with the machine's other load, while their
    # CPU per record stays within ~10 % (which is why the CPU ratio is printed too).
    warm = min(audits[1:] or audits, key=lambda r: r.seconds)
    print(
        f"\naudit / replication: {warm.per_s / steady.per_s:.2f}x (goal >= 1.0x: the fastest warm audit against "
        f"Ferryman's steady rate; {warm.per_s / whole.per_s:.2f}x against its rate from launch); CPU per record "
        f"{warm.cpu_s_per_m / whole.cpu_s_per_m:.1f}x Ferryman's"
    )
    if args.json:
        _write_json(args, code, start_s, (steady, whole, *audits), faults)
        _log(f"raw figures in {args.json}")
    for fault in faults:
        _log(f"NOT CLEAN: {fault}")
    return 1 if faults else 0


def _write_json(
    args: argparse.Namespace, code: CodeVersion | None, start_s: float, phases: Sequence[Rate], faults: list[str]
) -> None:
    path: Path = args.json
    path.parent.mkdir(parents=True, exist_ok=True)
    figures = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "code": asdict(code) if code else None,
        "cpus": os.cpu_count(),
        "spark_start_s": start_s,
        "phases": [asdict(r) | {"per_s": r.per_s, "cpu_s_per_m": r.cpu_s_per_m} for r in phases],
        "faults": faults,
    }
    path.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
