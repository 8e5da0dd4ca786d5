"""The replication bench's settings: ``BenchConfig``, the named scenarios, and the command line that fills them.

``bench.replication`` is the entry point; this is its edge: the flags, their defaults (``--scenario``,
``--smoke``) and the checks on what was given, parsed once into a frozen ``BenchConfig``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cpucap import CpuCaps
from bench.errors import BenchError
from bench.records import MAX_PARTITIONS, MIN_VALUE_BYTES
from bench.rows import DEFAULT_ROWS, ROWS, RowOptions

#: Throughput-phase deadline when --timeout is not given: start-up (MirrorMaker 2
#: needs ~10 s, more on a loaded machine) plus the records at 5 k/s, far below any row.
_DEFAULT_TIMEOUT_BASE_S = 180.0
_DEFAULT_TIMEOUT_RECORDS_PER_S = 5_000
#: --latency-rate value asking for half of the Ferryman row's steady rate.
_HALF_FERRYMAN = "half-ferryman"
#: Offered load of the latency phase: well below every row's maximum here (MirrorMaker 2
#: exactly-once manages ~25-40 k rec/s), so it measures latency, not queueing.
DEFAULT_LATENCY_RATE = 5000.0
#: --smoke: a light load, the phase only has to work.
_SMOKE_LATENCY_RATE = 1000.0
_SMOKE_ROWS = ("copyloop", "ferryman")
#: Default rehearsal size cap: enough for the brokers to compile each row's paths.
_REHEARSAL_MAX_RECORDS = 200_000
#: Rounds of the throughput phase in a full run (one in --smoke would leave the rounds untested: two).
_DEFAULT_ROUNDS = 3
_SMOKE_ROUNDS = 2
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


def parse_args(argv: Sequence[str] | None, description: str | None = None) -> BenchConfig:
    ap = argparse.ArgumentParser(
        prog="python -m bench.replication",
        description=description,
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
        "--cpu-per-process",
        type=float,
        metavar="CORES",
        help="confine every process of every row to this many cores, each by a cgroup of its own (needs root): "
        "small stand-ins for GIL-bound processes on cores of their own, for the scale-out scenario on a machine "
        "whose cores the brokers fill (default: uncapped)",
    )
    ap.add_argument(
        "--latency-rate",
        help=f"offered load of the latency phase, rec/s, or {_HALF_FERRYMAN} (default: {_HALF_FERRYMAN} when the "
        f"ferryman row runs, else {DEFAULT_LATENCY_RATE:.0f}; --smoke: {_SMOKE_LATENCY_RATE:.0f})",
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
        default = _HALF_FERRYMAN if "ferryman" in rows else str(DEFAULT_LATENCY_RATE)
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
    if args.cpu_per_process is not None:
        try:
            CpuCaps(args.cpu_per_process, "check")  # a cap that cannot be set fails here, not in the first row
        except BenchError as exc:
            ap.error(str(exc))
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
            cpu_per_process=args.cpu_per_process,
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
