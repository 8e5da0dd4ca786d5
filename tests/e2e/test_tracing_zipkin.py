"""Traces on a real Zipkin: source producer -> wrapper -> deduper -> destination consumer, across kill -9.

Both services run as processes exporting to a Zipkin server started by the
harness (``ferryman_local.LocalZipkin``). The test's producer starts a trace
per record (``traceparent`` header) and its consumer continues the trace from
the destination record's header; Zipkin's API must then hold one connected
trace per record, with exactly one destination span, also for records
replayed after a kill -9 of the wrapper (resent, dropped as duplicates) and of
the deduper (its open transaction lost). One trace is opened in the Zipkin UI
in headless Chromium; the screenshot path is printed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from ferryman.config import load_config
from ferryman.naming import FlowNames
from ferryman.status import deduper_status
from ferryman.tracing import context_of, parent_context, traceparent_of
from ferryman_local import LocalZipkin
from opentelemetry.exporter.zipkin.json import ZipkinExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from tests.helpers.grpc_clients import local
from tests.helpers.kafka import KafkaCluster, create_topic, wait_until
from tests.helpers.services import BIN, ServiceProcess, running_flow

pytestmark = pytest.mark.e2e

PER_BATCH = 8


@pytest.fixture(scope="module")
def zipkin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZipkin]:
    with LocalZipkin.start(tmp_path_factory.mktemp("zipkin")) as server:
        yield server


def _provider(zipkin: LocalZipkin, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(ZipkinExporter(endpoint=zipkin.spans_endpoint)))
    return provider


def _produce(bootstrap: str, topic: str, provider: TracerProvider, first: int) -> list[str]:
    """PER_BATCH records, each in a trace of its own started by a PRODUCER span; their trace ids."""
    tracer = provider.get_tracer("test-producer")
    producer = Producer({"bootstrap.servers": bootstrap})
    ids = []
    for i in range(first, first + PER_BATCH):
        with tracer.start_as_current_span(f"{topic} publish", kind=SpanKind.PRODUCER) as span:
            producer.produce(
                topic,
                key=b"k%d" % i,
                value=b"v%d" % i,
                partition=0,
                headers=[("traceparent", traceparent_of(span).encode())],
            )
            ids.append(f"{span.get_span_context().trace_id:032x}")
    producer.flush(30)
    return ids


def _consume_all(bootstrap: str, topic: str, n: int, provider: TracerProvider, group: str) -> list[Any]:
    """Read n records (read_committed), continuing each record's trace with a CONSUMER span."""
    tracer = provider.get_tracer("test-consumer")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + 120
    try:
        while len(got) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=1.0):
                if msg.error() is None:
                    ctx = context_of(msg.headers() or [])
                    assert ctx is not None, f"destination record {msg.offset()} has no traceparent: {msg.headers()}"
                    with tracer.start_as_current_span(
                        f"{topic} process", context=parent_context(ctx), kind=SpanKind.CONSUMER
                    ):
                        pass
                    got.append(msg)
    finally:
        consumer.close()
    assert len(got) == n, f"read {len(got)} of {n} records"
    return got


def _replay_staging(bootstrap: str, config: Path, group: str) -> int:
    """Produce every staging record again, as they are (envelopes and their record traces): duplicates."""
    cfg = load_config(config, env={})
    staging = FlowNames.of(cfg.flows[0], wrapper_group=cfg.wrapper.group_id, deduper_group=cfg.deduper.group_id)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([staging.staging_topic])
    msgs = [m for m in consumer.consume(num_messages=1000, timeout=10) if m.error() is None]
    consumer.close()
    producer = Producer({"bootstrap.servers": bootstrap})
    for m in msgs:
        producer.produce(str(m.topic()), key=m.key(), value=m.value(), partition=m.partition() or 0)
    producer.flush(30)
    return len(msgs)


def _connected(zipkin: LocalZipkin, trace_id: str) -> dict[str, Any] | None:
    """The trace's summary when it is complete and connected, else None (spans still arriving)."""
    spans = zipkin.trace(trace_id)
    ids = {s["id"] for s in spans}
    services = {s.get("localEndpoint", {}).get("serviceName") for s in spans}
    if not {"test-producer", "ferryman-wrapper", "ferryman-deduper", "test-consumer"} <= services:
        return None
    roots = [s for s in spans if "parentId" not in s]
    orphans = [s for s in spans if "parentId" in s and s["parentId"] not in ids]
    if len(roots) != 1 or orphans:
        return None
    by_id = {s["id"]: s for s in spans}
    consumers = [s for s in spans if s["localEndpoint"]["serviceName"] == "test-consumer"]
    chain = []
    node = consumers[0]
    while True:
        chain.append((node["localEndpoint"]["serviceName"], node["name"]))
        if "parentId" not in node:
            break
        node = by_id[node["parentId"]]
    return {"spans": spans, "consumers": consumers, "chain": chain[::-1]}


def _wait_connected(zipkin: LocalZipkin, trace_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while (found := _connected(zipkin, trace_id)) is None:
        if time.monotonic() > deadline:
            spans = [
                (s["localEndpoint"]["serviceName"], s["name"], s["id"], s.get("parentId"))
                for s in zipkin.trace(trace_id)
            ]
            raise AssertionError(f"trace {trace_id} not complete and connected within 90 s: {spans}")
        time.sleep(0.5)  # spans arrive through the exporters' batches: nothing to block on
    return found


def _status_of(service: ServiceProcess) -> Callable[[], Any]:
    """The status call of a running deduper process (its port read from its current log)."""

    def call() -> Any:
        found = re.findall(r"deduper gRPC server listening on port (\d+)", service.logs[-1].read_text())
        assert found, "the deduper has not started its gRPC server"
        return deduper_status(local(int(found[-1])))

    return call


def test_one_connected_trace_per_record_across_kill_9(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    zipkin: LocalZipkin,
) -> None:
    topic = unique_name("traced")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    create_topic(destination_cluster.bootstrap_servers, topic, 1)
    producer_tp, consumer_tp = _provider(zipkin, "test-producer"), _provider(zipkin, "test-consumer")
    env = {
        "OTEL_TRACES_EXPORTER": "zipkin",
        "OTEL_EXPORTER_ZIPKIN_ENDPOINT": zipkin.spans_endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",  # only the records that carry a sampled context
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within 0.2 s: a kill -9 loses little
    }
    ids: list[str] = []
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
        naming={"policy": "identity"},
        wrapper_env=env,
        deduper_env=env,
        # Transactions open 8 s: a deduper killed soon after a batch loses its uncommitted writes.
        deduper={"transaction_interval_ms": 8000},
        extra_flow={"staging_partitions": 1},
    ) as f:
        ids += _produce(source_cluster.bootstrap_servers, topic, producer_tp, 0)
        _consume_all(destination_cluster.bootstrap_servers, topic, PER_BATCH, consumer_tp, unique_name("g1"))
        time.sleep(1.0)  # the exporters' 0.2 s schedule: the batch's spans are out before the kill
        f.wrapper.kill9()
        f.wrapper.start()
        # Batch 1's envelopes written to staging again (as a wrapper replay would): the deduper drops them.
        replayed = _replay_staging(destination_cluster.bootstrap_servers, f.config, unique_name("g0"))
        status = _status_of(f.deduper)
        assert replayed >= 1
        dropped = wait_until(
            lambda: (st := status()).duplicates_dropped >= PER_BATCH and st.transactions_committed,
            60,
            message="the deduper drops the replayed envelopes as duplicates",
        )
        # The transaction the duplicates opened commits (nothing in it): batch 2 then opens a fresh one.
        wait_until(lambda: status().transactions_committed > dropped, 30, message="the duplicates' transaction ends")
        before = status().transactions_committed
        ids += _produce(source_cluster.bootstrap_servers, topic, producer_tp, PER_BATCH)
        wait_until(lambda: status().records_written >= 2 * PER_BATCH, 30, message="batch 2 written")
        last = status()
        f.deduper.kill9()  # batch 2's transaction dies uncommitted: the restart writes it again
        print(f"deduper killed with batch 2 {'un' if last.transactions_committed == before else ''}committed")
        f.deduper.start()
        ids += _produce(source_cluster.bootstrap_servers, topic, producer_tp, 2 * PER_BATCH)
        records = _consume_all(
            destination_cluster.bootstrap_servers, topic, 3 * PER_BATCH, consumer_tp, unique_name("g2")
        )
        assert [m.value() for m in records] == [b"v%d" % i for i in range(3 * PER_BATCH)]
        # The destination consumer above continued each trace a second time (group g2): count per group.
        summaries = {t: _wait_connected(zipkin, t) for t in ids}
        for t, s in summaries.items():
            chain = [svc for svc, _ in s["chain"]]
            assert chain == [
                "test-producer",
                "ferryman-wrapper",
                "ferryman-deduper",
                "ferryman-deduper",
                "test-consumer",
            ], (t, s["chain"])
            publishes = [
                x
                for x in s["spans"]
                if x["localEndpoint"]["serviceName"] == "ferryman-deduper" and x.get("kind") == "PRODUCER"
            ]
            committed = [x for x in publishes if x.get("tags", {}).get("otel.status_code") != "ERROR"]
            assert len(committed) == 1, (t, publishes)  # duplicates dropped made no second destination span
            tags = next(x for x in s["spans"] if x["localEndpoint"]["serviceName"] == "ferryman-wrapper")["tags"]
            assert tags["messaging.system"] == "kafka" and tags["messaging.destination.name"] == topic
        # ferryman trace names the trace of a destination record.
        out = subprocess.run(
            [str(BIN / "ferryman"), "trace", topic, "0", str(records[3].offset()), "--config", str(f.config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert ids[3] in out.stdout and "/zipkin/traces/" in out.stdout
    _screenshot_checks(zipkin.ui_url(ids[PER_BATCH]))  # a record of batch 2, written again after the deduper's kill


#: Where the UI screenshot is kept (git-ignored), beside the repository's other local state.
SCREENSHOTS = Path(__file__).resolve().parents[2] / ".ferryman" / "screenshots"
#: Flags for Zipkin's single-page UI: no proxy lookup (without this flag the page's script never ran here),
#: every compositor stage before the capture, and virtual time for its API calls and rendering.
_CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
    "--run-all-compositor-stages-before-draw",
    "--virtual-time-budget=30000",
    "--window-size=1400,1000",
)


def _screenshot_checks(url: str) -> None:
    """Open the trace in the Zipkin UI as a person would: keep a screenshot, check the page names both services."""
    chromium = shutil.which("chromium")
    assert chromium is not None, "chromium is not installed (Debian: apt-get install chromium)"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"zipkin-trace-{url.rsplit('/', 1)[-1]}.png"
    subprocess.run(
        [chromium, *_CHROMIUM_FLAGS, f"--screenshot={shot}", url], capture_output=True, timeout=300, check=False
    )
    print(f"Zipkin UI screenshot: {shot}")
    # A blank page (the script not run) is ~6 kB; a rendered trace is tens of kB.
    assert shot.exists() and shot.stat().st_size > 20_000, f"blank screenshot of {url}"
    page = subprocess.run(
        [chromium, *_CHROMIUM_FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=300, check=False
    )
    for service in ("test-producer", "ferryman-wrapper", "ferryman-deduper", "test-consumer"):
        assert service in page.stdout, f"{service} not on the page {url}: {page.stdout[-2000:]}"
