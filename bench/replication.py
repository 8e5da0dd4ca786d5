"""Replication benchmark: Ferryman vs a bare copy loop vs MirrorMaker 2, same clusters, same data.

``python -m bench.replication [--records 1000000] [--value-bytes 100] [--partitions 8]
[--rows ferryman,copyloop,mm2,mm2-eos] [--wrapper-procs 1] [--deduper-procs 1]
[--latency-rate R] [--latency-seconds S] [--json out.json] [--smoke]``

For each row, in one run on the same two local clusters (or ``--source``/``--destination``):

1. throughput: a preloaded source topic (identical data per row) is replicated; the
   rate is counted from the first record visible to a read_committed consumer of the
   destination to the last (steady state), and from process start; CPU seconds of the
   replicator's processes per million records and their peak RSS are sampled;
   every record is checked present and (for exactly-once rows) not duplicated;
2. latency: records are produced at a fixed rate below the maximum and the
   destination consumer measures visible time minus the record's create time.

It is a benchmark, not a test: it prints a table and writes raw figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from ferryman_local import LocalCluster, start_clusters

from bench.measure import DestinationWatcher, ProcessSampler, percentile
from bench.rows import SOURCE_ALIAS, CopyLoopRow, FerrymanRow, MirrorMakerRow, Row, RowContext

ROWS = ("ferryman", "copyloop", "mm2", "mm2-eos")


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})])[topic].result(30)


def _preload(bootstrap: str, topic: str, records: int, partitions: int, value_bytes: int) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    pad = b"x" * value_bytes
    for i in range(records):
        part = i % partitions
        value = (str(i // partitions).encode() + b":" + pad)[:value_bytes]
        while True:
            try:
                p.produce(topic, value, f"k{i % 1000}".encode(), partition=part)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def _make_row(name: str, ctx: RowContext, partitions: int) -> Row:
    if name == "ferryman":
        return FerrymanRow(ctx)
    if name == "copyloop":
        return CopyLoopRow(ctx)
    return MirrorMakerRow(ctx, exactly_once=name == "mm2-eos", tasks=min(partitions, 2))


def _run_row(name: str, args: argparse.Namespace, src: str, dst: str, base: Path) -> dict[str, Any]:
    tag = f"{name.replace('-', '')}{uuid.uuid4().hex[:6]}"
    tp_topic, lat_topic = f"bench-tp-{tag}", f"bench-lat-{tag}"
    for t in (tp_topic, lat_topic):
        _create(src, t, args.partitions)
    t0 = time.time()
    _preload(src, tp_topic, args.records, args.partitions, args.value_bytes)
    print(f"  [{name}] preloaded {args.records} records in {time.time() - t0:.1f}s", flush=True)
    work = base / tag
    work.mkdir(parents=True)
    ctx = RowContext(
        name=tag,
        source=src,
        destination=dst,
        topic_pattern=f"bench-.*-{tag}",
        topics=[tp_topic, lat_topic],
        work_dir=work,
        wrapper_procs=args.wrapper_procs,
        deduper_procs=args.deduper_procs,
        ferryman_txn_ms=args.ferryman_txn_ms,
    )
    row = _make_row(name, ctx, args.partitions)
    watcher = DestinationWatcher(dst, f"{SOURCE_ALIAS}.{tp_topic}", args.partitions, args.records)
    started = time.time()
    row.start()
    sampler = ProcessSampler([p.pid for p in row.procs])
    out: dict[str, Any] = {"row": name, "exactly_once": row.exactly_once}
    try:
        complete = watcher.wait(args.timeout)
        w = watcher.stop()
        cpu_tp = sampler.stop()
        out.update(complete=complete, records=w.records, duplicates=w.duplicates)
        if w.first_visible and w.last_visible and w.last_visible > w.first_visible:
            steady = w.last_visible - w.first_visible
            out["steady_rps"] = w.records / steady
            out["steady_mbps"] = w.records * args.value_bytes / steady / 1e6
            out["from_start_rps"] = w.records / (w.last_visible - started)
        out["cpu_s_per_million"] = cpu_tp / max(1, w.records) * 1e6
        out["peak_rss_mb"] = sampler.peak_rss / 1e6
        print(
            f"  [{name}] throughput phase: {json.dumps({k: v for k, v in out.items() if k != 'row'}, default=str)}",
            flush=True,
        )
        if args.latency_seconds > 0 and complete:
            out.update(_latency(args, src, dst, lat_topic))
    finally:
        row.stop()
    return out


def _latency(args: argparse.Namespace, src: str, dst: str, topic: str) -> dict[str, Any]:
    total = int(args.latency_rate * args.latency_seconds)
    watcher = DestinationWatcher(dst, f"{SOURCE_ALIAS}.{topic}", args.partitions, total, latency=True)
    p = Producer({"bootstrap.servers": src, "linger.ms": 1})
    start = time.monotonic()
    pad = b"y" * args.value_bytes
    for i in range(total):
        ahead = i / args.latency_rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)  # offered load: a fixed rate, by design
        part = i % args.partitions
        p.produce(topic, (str(i // args.partitions).encode() + b":" + pad)[: args.value_bytes], partition=part)
        p.poll(0)
    p.flush(30)
    watcher.wait(60)
    w = watcher.stop()
    lat = w.latencies_ms
    return {
        "latency_rate": args.latency_rate,
        "latency_records": len(lat),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
    }


def _table(results: list[dict[str, Any]]) -> str:
    by = {r["row"]: r for r in results}
    copy = by.get("copyloop", {}).get("steady_rps")
    mm2 = by.get("mm2", {}).get("steady_rps")
    mm2eos = by.get("mm2-eos", {}).get("steady_rps")
    copy_cpu = by.get("copyloop", {}).get("cpu_s_per_million")
    cols = [
        "row",
        "ok",
        "rec/s",
        "MB/s",
        "rec/s from start",
        "CPU s/M",
        "peak RSS MB",
        "p50 ms",
        "p99 ms",
        "x copyloop",
        "x mm2",
        "x mm2-eos",
        "CPU x copyloop",
        "dups",
    ]
    lines = [cols]

    def f(v: Any, fmt: str = "{:,.0f}") -> str:
        return "-" if v is None or v != v else fmt.format(v)

    for r in results:
        rps = r.get("steady_rps")
        ok = r.get("complete") and (not r["exactly_once"] or r.get("duplicates", 0) == 0)
        lines.append(
            [
                r["row"],
                "yes" if ok else "FAILED",
                f(rps),
                f(r.get("steady_mbps"), "{:.1f}"),
                f(r.get("from_start_rps")),
                f(r.get("cpu_s_per_million"), "{:.1f}"),
                f(r.get("peak_rss_mb")),
                f(r.get("p50_ms")),
                f(r.get("p99_ms")),
                f(rps / copy if rps and copy else None, "{:.2f}"),
                f(rps / mm2 if rps and mm2 else None, "{:.2f}"),
                f(rps / mm2eos if rps and mm2eos else None, "{:.2f}"),
                f(r["cpu_s_per_million"] / copy_cpu if copy_cpu and r.get("cpu_s_per_million") else None, "{:.2f}"),
                str(r.get("duplicates", "-")),
            ]
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(cols))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit 1 if any row's copy is incomplete (or duplicated, for exactly-once rows)."""
    ap = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--wrapper-procs", type=int, default=1)
    ap.add_argument("--deduper-procs", type=int, default=1)
    ap.add_argument("--ferryman-txn-ms", type=int, default=100, help="deduper transaction_interval_ms")
    ap.add_argument("--latency-rate", type=float, default=5000.0, help="offered load of the latency phase, rec/s")
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=900.0, help="throughput phase deadline per row, seconds")
    ap.add_argument("--source", help="existing source bootstrap servers (default: start local clusters)")
    ap.add_argument("--destination", help="existing destination bootstrap servers")
    ap.add_argument("--dir", type=Path, default=Path(".ferryman/bench"))
    ap.add_argument("--json", type=Path, help="write raw figures here")
    ap.add_argument("--smoke", action="store_true", help="tiny configuration that only checks the bench works")
    args = ap.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) unwinds through the finally blocks that stop processes and clusters.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.smoke:
        args.records, args.partitions, args.latency_seconds, args.latency_rate = 20_000, 4, 3.0, 1000.0
        if args.rows == ",".join(ROWS):
            args.rows = "ferryman,copyloop"
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROWS)}")
    base = args.dir / time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    clusters: list[LocalCluster] = []
    if args.source and args.destination:
        src, dst = args.source, args.destination
    else:
        clusters = start_clusters(["source", "destination"], base_dir=base / "clusters")
        src, dst = clusters[0].bootstrap_servers, clusters[1].bootstrap_servers
    print(
        f"bench: {args.records} records x {args.value_bytes} B, {args.partitions} partitions; rows {rows}", flush=True
    )
    results = []
    try:
        for name in rows:
            results.append(_run_row(name, args, src, dst, base))
    finally:
        for c in clusters:
            c.stop()
    print()
    print(_table(results))
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2, default=str)
        )
    failed = [r["row"] for r in results if not r.get("complete") or (r["exactly_once"] and r.get("duplicates", 0))]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
