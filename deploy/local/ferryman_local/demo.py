"""``ferryman-demo``: exactly-once replication between two local clusters, with crashes.

1. starts two local Apache Kafka clusters (source, destination);
2. streams a sample topic ``orders`` into the source (null keys, tombstones,
   repeated headers included) while
3. ``ferryman-wrapper`` and ``ferryman-deduper`` run as real processes joined
   by their gRPC control link, and each is killed with SIGKILL mid-stream and
   restarted;
4. reads both topics back and prints the verdict, next to the one of ``ferryman audit run``
   (a PySpark job, when the auditor is installed); exit 0 only when both say exact.

With ``--observe`` a local Prometheus server (Debian's ``prometheus``) scrapes
both services from the start, with Ferryman's alert rules when the checkout
has them, and a local Zipkin server (``LocalZipkin``) receives the spans of
both services, which trace ``TRACE_RATIO`` of the records; both URLs are
printed, with a link to one record's trace. The demo's own check then leaves
``traceparent`` headers out on both sides (a traced record's copy carries the
deduper's), so every other byte of every record is still compared. On a
terminal both stay up after the verdict until Enter or Ctrl-C, to look at the
run (restarts, duplicates dropped, lag, traces). Without ``--observe`` tracing
is off and the check is byte for byte.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ferryman_local import reserve_port
from ferryman_local._cluster import LocalCluster, start_clusters
from ferryman_local._prometheus import LocalPrometheus
from ferryman_local._zipkin import LocalZipkin
from ferryman_local.verify import compare, read_topic, without_header

_BIN = Path(sys.executable).parent
PARTITIONS = 4
#: The audit of the demo's 60 k records takes ~10-30 s here, most of it Spark's start; far more is a hang.
_AUDIT_TIMEOUT_S = 300.0
#: Ferryman's alert rules, when running from a checkout (the installed package does not carry deploy/).
_ALERT_RULES = Path(__file__).resolve().parents[2] / "prometheus" / "ferryman-alerts.yml"
#: Queries printed with --observe, as links to Prometheus's graph page.
#: Share of the records traced with --observe: ~600 traces of the default 60 k records (100x the services' default
#: ratio, which is set for the CPU of a busy flow; here there is plenty to look at).
TRACE_RATIO = 0.01
#: The header a traced record's copy carries (README "Operations: tracing").
_TRACEPARENT = "traceparent"
_OBSERVE_QUERIES = (
    "rate(ferryman_deduper_records_written_total[10s])",
    "ferryman_deduper_duplicates_dropped_total",
    "ferryman_deduper_lag_records",
    "up",
)


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _Stream(threading.Thread):
    """Writes `records` sample orders at `rate` records/s."""

    def __init__(self, bootstrap: str, topic: str, records: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.records, self.rate = bootstrap, topic, records, rate
        self.sent = 0

    def run(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 10})
        start = time.monotonic()
        for i in range(self.records):
            key = None if i % 17 == 0 else f"customer-{i % 500}".encode()
            value = None if i % 23 == 0 else f'{{"order": {i}, "amount": {i % 997}}}'.encode()
            headers: list[tuple[str, str | bytes | None]] | None = (
                [("source", b"demo"), ("source", b"repeated"), ("trace", None)] if i % 5 == 0 else None
            )
            p.produce(self.topic, value=value, key=key, partition=i % PARTITIONS, headers=headers)
            self.sent += 1
            if i % 500 == 0:
                p.poll(0)
                ahead = self.sent / self.rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)  # pace the stream so the crashes land mid-stream
        p.flush(60)


class _Service:
    def __init__(self, kind: str, config: Path, logs: Path, *args: str) -> None:
        self.kind, self.config, self.logs, self.args = kind, config, logs, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.logs / f"{self.kind}-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [str(_BIN / f"ferryman-{self.kind}"), "--config", str(self.config), *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def _observe(work_dir: Path, wrapper_metrics: str, deduper_metrics: str) -> LocalPrometheus:
    """Start Prometheus scraping both services' metrics addresses and print where to look."""
    rules = [_ALERT_RULES] if _ALERT_RULES.exists() else []
    prometheus = LocalPrometheus.start(
        work_dir / f"prometheus-{int(time.time())}",
        {"ferryman-wrapper": [wrapper_metrics], "ferryman-deduper": [deduper_metrics]},
        rule_files=rules,
    )
    _say(f"Prometheus: {prometheus.url} (scraping the wrapper at {wrapper_metrics}, the deduper at {deduper_metrics})")
    for expr in _OBSERVE_QUERIES:
        print(f"    {prometheus.url}/graph?g0.expr={urllib.parse.quote(expr)}&g0.tab=0&g0.range_input=5m", flush=True)
    return prometheus


def _linger(prometheus: LocalPrometheus, zipkin: LocalZipkin | None) -> None:
    """On a terminal, keep Prometheus and Zipkin up until Enter or Ctrl-C, so that the run can be looked at."""
    if not sys.stdin.isatty():
        return
    traces = f", Zipkin its traces at {zipkin.url}/zipkin/" if zipkin is not None else ""
    _say(f"Prometheus keeps the run's figures at {prometheus.url}{traces}; press Enter (or Ctrl-C) to stop them")
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.readline()


def run(work_dir: Path, records: int, rate: float, *, observe: bool = False) -> bool:
    """Run the demo; True when the replica is exact. observe: start Prometheus and Zipkin beside it."""
    work_dir.mkdir(parents=True, exist_ok=True)
    logs = work_dir / "logs"
    logs.mkdir(exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Zipkin (a Spring Boot server: 15 s or more) starts while the brokers do.
        zipkin_start = pool.submit(LocalZipkin.start, work_dir / f"zipkin-{int(time.time())}") if observe else None
        if zipkin_start is not None:
            _say("starting a Zipkin server (first run downloads its jar from Maven Central)")
        _say("starting two local Apache Kafka clusters (first run downloads the broker jars from Maven Central)")
        clusters: list[LocalCluster] = []
        services: list[_Service] = []
        prometheus: LocalPrometheus | None = None
        zipkin: LocalZipkin | None = None
        try:
            clusters = start_clusters(["source", "destination"], base_dir=work_dir / f"clusters-{int(time.time())}")
            zipkin = zipkin_start.result() if zipkin_start is not None else None
            if zipkin is not None:
                _say(f"Zipkin: {zipkin.url}/zipkin/ ({TRACE_RATIO:.0%} of the records traced)")
            # Fixed metrics ports when observed (Prometheus must know them), free ones otherwise.
            ports = (f"127.0.0.1:{reserve_port()}", f"127.0.0.1:{reserve_port()}")
            metrics = ports if observe else ("127.0.0.1:0",) * 2
            prometheus = _observe(work_dir, *metrics) if observe else None
            exact = _replicate(
                *clusters,
                work_dir=work_dir,
                logs=logs,
                records=records,
                rate=rate,
                services=services,
                metrics=metrics,
                zipkin=zipkin,
            )
            if prometheus is not None:
                _linger(prometheus, zipkin)
            return exact
        finally:
            for s in services:
                s.stop()
            if prometheus is not None:
                prometheus.stop()
            if zipkin_start is not None:
                with contextlib.suppress(Exception):  # a failed start has nothing to stop
                    zipkin_start.result().stop()  # a start still in progress is waited for, then stopped
            for c in clusters:
                c.stop()


def _tracing(zipkin: LocalZipkin | None) -> dict[str, object]:
    """The services' tracing section: off, or TRACE_RATIO of the records to zipkin."""
    if zipkin is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "sampler_ratio": TRACE_RATIO,
        "exporter": "zipkin",
        "endpoint": zipkin.spans_endpoint,
        "ui_url_template": zipkin.ui_url("{trace_id}"),
    }


def _replicate(
    src: LocalCluster,
    dst: LocalCluster,
    *,
    work_dir: Path,
    logs: Path,
    records: int,
    rate: float,
    services: list[_Service],
    metrics: tuple[str, str],
    zipkin: LocalZipkin | None,
) -> bool:
    _say(f"source {src.bootstrap_servers} (cluster {src.cluster_id}), destination {dst.bootstrap_servers}")
    topic = "orders"
    admin = AdminClient({"bootstrap.servers": src.bootstrap_servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"retention.ms": "604800000"})])[topic].result(30)
    config = work_dir / "ferryman.yaml"
    control = f"127.0.0.1:{reserve_port()}"
    config.write_text(
        yaml.safe_dump(
            {
                "clusters": {
                    "source": {"bootstrap_servers": src.bootstrap_servers},
                    "destination": {"bootstrap_servers": dst.bootstrap_servers},
                },
                "flows": [{"name": "demo", "source": "source", "target": "destination", "topics": ["orders"]}],
                "wrapper": {
                    "instance_id": "demo-w1",
                    "listen_address": "127.0.0.1:0",
                    "deduper_addresses": [control],
                    "metrics_address": metrics[0],
                },
                "deduper": {"instance_id": "demo-1", "listen_address": control, "metrics_address": metrics[1]},
                "tracing": _tracing(zipkin),
            },
            sort_keys=False,
        )
    )
    _say(f"configuration: {config}")
    wrapper = _Service("wrapper", config, logs)
    deduper = _Service("deduper", config, logs)
    services.extend([wrapper, deduper])
    deduper.start()
    wrapper.start()
    stream = _Stream(src.bootstrap_servers, topic, records, rate)
    stream.start()
    _say(f"streaming {records} records into source topic '{topic}' ({PARTITIONS} partitions) at ~{rate:.0f}/s")
    for victim, at in ((wrapper, 0.35), (deduper, 0.65)):
        while stream.sent < records * at and stream.is_alive():
            time.sleep(0.05)
        victim.kill9()
        _say(f"kill -9 {victim.kind} after {stream.sent} records were produced; restarting it")
        victim.start()
    stream.join()
    _say("stream done; waiting for the destination to catch up")
    expected = read_topic(src.bootstrap_servers, topic)
    total = sum(len(v) for v in expected.values())
    deadline = time.monotonic() + 180
    actual = read_topic(dst.bootstrap_servers, f"source.{topic}")
    while sum(len(v) for v in actual.values()) < total and time.monotonic() < deadline:
        time.sleep(1.0)  # polling the destination's progress
        actual = read_topic(dst.bootstrap_servers, f"source.{topic}")
    for s in services:
        s.stop()  # SIGTERM: each flushes its spans on the way out
    traced_line = ""
    if zipkin is not None:
        expected, _ = without_header(expected, _TRACEPARENT)
        actual, traced = without_header(actual, _TRACEPARENT)
        traced_line = f" ({_TRACEPARENT} headers left out: {traced} records traced)"
        _sample_trace(zipkin, config, f"source.{topic}", dst.bootstrap_servers)
    verdict = compare(expected, actual)
    _say(
        f"destination topic 'source.{topic}' compared with the source, partition by partition{traced_line}; "
        "then audited"
    )
    audited, audit_line = _audit(config, logs)
    print(f"\n    demo's own check: {verdict}\n    ferryman audit:   {audit_line}\n", flush=True)
    _say(f"service logs: {logs}")
    return verdict.exact and audited is not False


def _sample_trace(zipkin: LocalZipkin, config: Path, topic: str, bootstrap: str) -> None:
    """Print one traced record's trace as Zipkin has it, and ``ferryman trace`` for that record."""
    found = _first_traced_offset(bootstrap, topic)
    if found is None:
        _say("no record was traced (fewer records than 1/ratio?)")
        return
    partition, offset, traceparent = found
    trace_id = traceparent.split("-")[1]
    deadline = time.monotonic() + 30
    spans = zipkin.trace(trace_id)
    while not spans and time.monotonic() < deadline:
        time.sleep(0.5)  # spans reach Zipkin in the exporters' batches
        spans = zipkin.trace(trace_id)
    names = sorted({s.get("localEndpoint", {}).get("serviceName", "?") for s in spans})
    _say(f"a traced record, {topic}-{partition} offset {offset}: {len(spans)} spans from {', '.join(names)}")
    print(f"    {zipkin.ui_url(trace_id)}", flush=True)
    print(f"    (the same link: ferryman trace {topic} {partition} {offset} --config {config})", flush=True)


def _first_traced_offset(bootstrap: str, topic: str) -> tuple[int, int, str] | None:
    """(partition, offset, traceparent) of the first destination record with a ``traceparent``, or None."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ferryman-demo-trace",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None:
            return None
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(md.partitions)])
        pending = set(md.partitions)
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    pending.discard(m.partition() or 0)  # end of a partition
                    continue
                headers: list[tuple[str, bytes | None]] = list(m.headers() or ())  # type: ignore[arg-type]
                for name, value in headers:
                    if name == _TRACEPARENT and value:
                        return m.partition() or 0, m.offset() or 0, value.decode()
        return None
    finally:
        consumer.close()


def _audit(config: Path, logs: Path) -> tuple[bool | None, str]:
    """``ferryman audit run`` on the demo's flow: (exactly once?, one line), or (None, why not) without the auditor."""
    if importlib.util.find_spec("ferryman_auditor") is None or importlib.util.find_spec("pyspark") is None:
        return None, "skipped (the auditor is not installed: pip install '.[audit]')"
    _say("ferryman audit run: a PySpark job reads both topics and aligns them by the offset map and by content")
    log = logs / "audit.log"
    started = time.monotonic()
    with log.open("wb") as err:
        run = subprocess.run(
            [str(_BIN / "ferryman"), "audit", "run", "--config", str(config), "--output", "json"],
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=_AUDIT_TIMEOUT_S,
            check=False,
        )
    if run.returncode not in (0, 1):
        return False, f"could not run (exit {run.returncode}; log {log})"
    report = json.loads(run.stdout)
    t = report["totals"]
    agree = all(p["alignments_agree"] for p in report["partitions"])
    return report["verdict"] == "EXACTLY_ONCE", (
        f"{report['verdict']}: {t['expected']} source records expected, {t['found']} found intact, "
        f"{t['missing']} missing, {t['duplicated']} duplicated, {t['reordered']} reordered, {t['altered']} altered, "
        f"{t['unexpected']} unexpected; the offset map {'agrees' if agree else 'DISAGREES'} "
        f"({len(report['partitions'])} partitions, {time.monotonic() - started:.0f} s with Spark's start)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point."""
    parser = argparse.ArgumentParser(prog="ferryman-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000, help="records to stream (default 60000)")
    parser.add_argument("--rate", type=float, default=5000.0, help="records per second (default 5000)")
    parser.add_argument("--dir", type=Path, default=Path(".ferryman/demo"), help="work directory")
    parser.add_argument(
        "--observe",
        action="store_true",
        # argparse %-formats help texts: the ratio's percent sign is doubled.
        help=f"start Prometheus (scraping both services) and Zipkin ({TRACE_RATIO * 100:g}%% of records traced) "
        "beside the demo; print their URLs",
    )
    args = parser.parse_args(argv)
    return 0 if run(args.dir, args.records, args.rate, observe=args.observe) else 1


if __name__ == "__main__":
    raise SystemExit(main())
