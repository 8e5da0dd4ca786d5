"""Process-level tuning shared by both services: streaming consumer settings and the GC."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
from confluent_kafka import Producer
from ferryman.client_config import (
    PRODUCER_QUEUE_MAX_KBYTES,
    STREAMING_CONSUMER_DEFAULTS,
    connected_producer,
    data_producer_config,
    streaming_consumer_config,
)
from ferryman.config import ClusterConfig
from ferryman.errors import ConfigError
from ferryman.service import tune_gc


def test_streaming_consumers_never_idle_on_a_full_prefetch_queue() -> None:
    conf = streaming_consumer_config(ClusterConfig(bootstrap_servers="k:9092"), "w-1-source")
    assert conf["fetch.queue.backoff.ms"] == 5  # librdkafka's 1 s default starved the wrapper
    assert conf["fetch.wait.max.ms"] == 20
    assert conf["fetch.min.bytes"] == 1 << 20  # a paced load no longer wakes every consumer per append
    assert conf["queued.max.messages.kbytes"] == 16 * 1024  # a quarter of librdkafka's prefetch held the rate
    assert (conf["bootstrap.servers"], conf["client.id"]) == ("k:9092", "w-1-source")


def test_a_clusters_client_config_overrides_the_streaming_defaults() -> None:
    cluster = ClusterConfig(
        bootstrap_servers="k:9092", client_config={"fetch.queue.backoff.ms": "100", "security.protocol": "SSL"}
    )
    conf = streaming_consumer_config(cluster, "d-1-staging")
    assert conf["fetch.queue.backoff.ms"] == "100"
    assert conf["security.protocol"] == "SSL"
    assert conf["fetch.wait.max.ms"] == STREAMING_CONSUMER_DEFAULTS["fetch.wait.max.ms"]


def test_data_producers_are_memory_bound_unless_the_cluster_says_otherwise() -> None:
    eight_mib = 8 << 20
    conf = data_producer_config(ClusterConfig(bootstrap_servers="k:9092"), "w-1-staging", max_message_bytes=eight_mib)
    # librdkafka's default is 1 GiB: a wrapper reading ahead of the staging hop filled it (issue 29).
    assert conf["queue.buffering.max.kbytes"] == PRODUCER_QUEUE_MAX_KBYTES == 16 * 1024
    assert (conf["bootstrap.servers"], conf["client.id"]) == ("k:9092", "w-1-staging")
    cluster = ClusterConfig(bootstrap_servers="k:9092", client_config={"queue.buffering.max.kbytes": "262144"})
    conf = data_producer_config(cluster, "d-1-producer", max_message_bytes=eight_mib)
    assert conf["queue.buffering.max.kbytes"] == "262144"


def test_a_producer_queue_always_holds_two_of_the_largest_messages() -> None:
    # A record larger than the whole queue would be refused for ever: the bound grows with message.max.bytes.
    cluster = ClusterConfig(bootstrap_servers="k:9092")
    conf = data_producer_config(cluster, "d-1-producer", max_message_bytes=(100 << 20) + 1)
    assert conf["queue.buffering.max.kbytes"] == 2 * (100 * 1024 + 1)


def test_a_cluster_queue_too_small_for_one_message_is_refused_naming_the_setting() -> None:
    cluster = ClusterConfig(bootstrap_servers="k:9092", client_config={"queue.buffering.max.kbytes": "4096"})
    with pytest.raises(ConfigError, match=r"queue\.buffering\.max\.kbytes 4096 cannot hold one message of 8,388,608"):
        data_producer_config(cluster, "w-1-staging", max_message_bytes=8 << 20)


def test_a_full_bounded_queue_is_a_buffer_error_to_wait_out_not_growth() -> None:
    # What the services rely on: past the bound librdkafka refuses the record (BufferError), which the wrapper
    # waits out with poll() and the deduper's direct path hands to produce(), which does the same.
    cluster = ClusterConfig(bootstrap_servers="127.0.0.1:1")
    conf = data_producer_config(cluster, "w-1-staging", max_message_bytes=1 << 20)
    conf["queue.buffering.max.kbytes"] = 1024  # 1 MiB: the same mechanism at a size a unit test can fill
    producer = Producer(conf)
    value = b"x" * 100_000

    def fill() -> None:
        for _ in range(100):  # 10 MB, ten times the bound
            producer.produce("t", value=value)

    with pytest.raises(BufferError):
        fill()
    producer.purge()


def test_a_producer_no_broker_answers_is_returned_and_the_wait_logged(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens on port 1: both metadata requests time out, and the service goes on
    # with the producer exactly as librdkafka would have left it.
    producer = connected_producer({"bootstrap.servers": "127.0.0.1:1", "client.id": "w-1-staging"}, "t", budget_s=0.2)
    assert isinstance(producer, Producer)
    assert "producer w-1-staging: no broker answered within 0.2 s" in caplog.text
    assert producer.flush(0) == 0


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_the_start_up_heap_and_collects_young_objects_rarely() -> None:
    alive = [object() for _ in range(10)]  # stand-in for the start-up heap
    _g0, g1, g2 = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > len(alive)
    assert gc.get_threshold() == (50_000, g1, g2)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_turns_the_gc_back_on_after_a_start_up_without_it() -> None:
    gc.disable()  # what the services' entry points do before their modules load
    tune_gc()
    assert gc.isenabled()


@pytest.mark.parametrize("service", ["ferryman_wrapper", "ferryman_deduper"])
def test_the_entry_point_module_loads_nothing_before_main_switches_the_gc_off(service: str) -> None:
    """The console script imports ``<service>.cli``; the service's own modules must wait for main()."""
    probe = (
        f"import sys, {service}.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"('ferryman', '{service}', 'confluent_kafka', 'grpc', 'google', 'msgspec', 'yaml') and m != '{service}.cli' "
        f"and m != '{service}'))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_audit_span_readers_never_idle_on_a_full_prefetch_queue() -> None:
    from ferryman_auditor.kafka_source._reader import consumer_config  # noqa: PLC0415 -- the auditor's package

    conf = consumer_config({"bootstrap.servers": "k:9092"})
    assert conf["fetch.queue.backoff.ms"] == 5  # the 1 s default kept a 5 M audit at ~1 of 2 cores
    assert (conf["auto.offset.reset"], conf["enable.partition.eof"]) == ("error", True)
    assert consumer_config({"fetch.queue.backoff.ms": "50"})["fetch.queue.backoff.ms"] == "50"  # the read's own wins
