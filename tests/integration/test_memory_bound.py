"""Large records: each service's memory stays within what its configuration allows (issue 29).

The README's formula: a service's peak RSS is its interpreter and libraries, plus
``queued.max.messages.kbytes`` of prefetched records (overshot by at most one
fetch, which librdkafka caps at the same size), plus its data producer's
``queue.buffering.max.kbytes``, plus the consumed batch in hand and what is
built from it (each at most the prefetch). Here both are set to 16 MiB on both
clusters and ten times that much data is replicated: a wrapper whose source
reads ran ahead of the staging hop without a bound on its producer's queue
(librdkafka's 1 GiB default, which made the pair peak at 1.27 GB with 10 KB
records) would hold most of it, and so did a deduper that kept every envelope of
its open transaction alive until the commit (``envelope.verify``'s source copy).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from tests.helpers.kafka import KafkaCluster, assert_sequences, create_topic, produce_sequences, read_all
from tests.helpers.procstatus import status_kib
from tests.helpers.services import ServiceProcess, flow_config, write_config

pytestmark = pytest.mark.integration

#: Prefetch and producer queue of every client of both services.
QUEUE_KBYTES = 16 * 1024
VALUE_BYTES = 100 * 1024
PARTITIONS = 4
PER_PARTITION = 400  # 160 MB in all: ten times the bound's queues
#: What the allocator keeps of memory freed. Measured growth with it all: 46-75 MiB (wrapper), 51-63 (deduper);
#: the deduper that held its transaction's envelopes: 139-146 with these 1 s transactions. 2026-12-06, alone:
#: 31-84 MiB either service; in a parallel integration run the wrapper once 96.008 MiB.
ALLOCATOR_SLACK_KBYTES = 16 * 1024
#: The produce requests in flight to the one destination broker, outside the producer queue's count: their
#: encoded batches (librdkafka keeps 5 per connection, ``batch.size`` 1,000,000 bytes each, and these values
#: do not compress) beside the records the queue counts until their delivery.
IN_FLIGHT_KBYTES = 5 * 1_000_000 // 1024
REPLICATION_TIMEOUT_S = 180.0


def _rss_kb(proc: ServiceProcess, field: str) -> int:
    """A memory field of the service's process (VmRSS: now, VmHWM: its peak), in KiB."""
    assert proc.proc is not None and proc.alive, f"{proc.kind} is not running:\n{proc.output()[-4000:]}"
    return status_kib(field, proc.proc.pid)


def _produce_incompressible(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    """PER_PARTITION random values of VALUE_BYTES to each partition; the values per partition, in order.

    Random, because the staging hop compresses (lz4) and a fetch is sized in compressed bytes: with values
    that shrink a hundredfold (``produce_sequences``' padding) one fetch overshoots the prefetch bound by
    as much, and the peak measures the data's compression ratio, not the configuration.
    """
    rnd = random.Random(topic)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i in range(PER_PARTITION):
        for p in range(PARTITIONS):
            value = rnd.randbytes(VALUE_BYTES)
            while True:
                try:
                    producer.produce(topic, value, key=b"%d:%d" % (p, i), partition=p, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
            values[p].append(value)
        producer.poll(0)
    assert producer.flush(120) == 0, f"{topic}: records not acknowledged within 120 s"
    assert not errors, f"{topic}: {len(errors)} records failed, first: {errors[0]}"
    return values


def test_large_records_are_replicated_within_the_configured_memory(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("large")
    flow = unique_name("flow")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    config = flow_config(
        source_bootstrap=source_cluster.bootstrap_servers,
        destination_bootstrap=destination_cluster.bootstrap_servers,
        flow=flow,
        topics=[topic],
        # Transactions of a second, as long as a backlog stretches them (the deduper held every envelope
        # its open transaction wrote until the commit, through each envelope's source).
        deduper={"transaction_interval_ms": 1000},
    )
    for cluster in config["clusters"].values():
        cluster["client_config"] = {
            "queued.max.messages.kbytes": QUEUE_KBYTES,
            "queue.buffering.max.kbytes": QUEUE_KBYTES,
        }
    path = write_config(tmp_path / f"{flow}.yaml", config)
    wrapper = ServiceProcess("wrapper", path, tmp_path).start()
    deduper = ServiceProcess("deduper", path, tmp_path, args=["--instance-id", "d1"]).start()
    try:
        # A first record per partition, small, through the whole path: both services have made all
        # their clients before their resting size is read.
        first = produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 1)
        read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=PARTITIONS, timeout_s=90)
        resting = {s.kind: _rss_kb(s, "VmRSS") for s in (wrapper, deduper)}

        expected = _produce_incompressible(source_cluster.bootstrap_servers, topic)
        copied = read_all(
            destination_cluster.bootstrap_servers,
            f"src.{topic}",
            expected=PARTITIONS * (PER_PARTITION + 1),
            timeout_s=REPLICATION_TIMEOUT_S,
        )
        peaks = {s.kind: _rss_kb(s, "VmHWM") for s in (wrapper, deduper)}
    finally:
        wrapper.stop()
        deduper.stop()

    # Exactly once and in order, byte for byte.
    assert_sequences(copied, {p: first[p] + expected[p] for p in first})

    data_kb = PARTITIONS * PER_PARTITION * VALUE_BYTES // 1024
    # Prefetch and its one-fetch overshoot, the batch in hand and what is built from it (four prefetches),
    # the producer's queue, its requests in flight, and what the allocator keeps.
    bound_kb = 4 * QUEUE_KBYTES + QUEUE_KBYTES + IN_FLIGHT_KBYTES + ALLOCATOR_SLACK_KBYTES
    for kind, peak in peaks.items():
        grew = peak - resting[kind]
        assert grew <= bound_kb, (
            f"{kind}: peak RSS {peak // 1024} MiB, {grew // 1024} MiB above its resting {resting[kind] // 1024} MiB, "
            f"over the configured bound of {bound_kb // 1024} MiB (data {data_kb // 1024} MiB)"
        )
