"""librdkafka client configurations, built from typed config in one place."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer

from ferryman.config import ClusterConfig
from ferryman.errors import ConfigError
from ferryman.kafka_log import LibrdkafkaLog

_log = logging.getLogger(__name__)

#: How long a new producer may wait for its first broker connection before it is
#: used anyway (it then connects, and asks for its producer id, on its own).
PRODUCER_CONNECT_BUDGET_S = 5.0


def base_config(
    cluster: ClusterConfig,
    client_id: str,
    *,
    on_session_timeout: Callable[[], None] | None = None,
    on_produce_failed: Callable[[str, int, str], None] | None = None,
) -> dict[str, Any]:
    """Common properties for any client on cluster (security etc. from client_config).

    librdkafka's log goes through Python logging (``ferryman.kafka_log``), not stderr;
    ``on_session_timeout`` is called when a consumer's log says its group session timed out,
    ``on_produce_failed`` when a transactional producer's log names the partition that failed a transaction.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "client.id": client_id,
        "logger": LibrdkafkaLog(cluster.bootstrap_servers, on_session_timeout, on_produce_failed=on_produce_failed),
        # Ferryman makes every topic it writes itself, with the shape the flow needs. librdkafka's producers
        # (and the Python AdminClient, a producer inside) ask metadata with auto-creation allowed by default,
        # so on a broker with auto.create.topics.enable (Kafka's default) a deleted state, staging or
        # destination topic came back at the next write or probe with the broker's default partitions (an
        # empty state read by the rewind: duplicates once the counts match; tests/integration/
        # test_auto_creating_destination.py).
        "allow.auto.create.topics": False,
    }
    conf.update(cluster.client_config)
    return conf


#: Consumer settings of both services' streaming reads (source records, staging
#: envelopes). A cluster's ``client_config`` overrides any of them.
STREAMING_CONSUMER_DEFAULTS: dict[str, Any] = {
    # End-to-end latency: the broker answers a fetch within 20 ms when there is
    # little data, instead of holding it up to 500 ms (librdkafka's default).
    "fetch.wait.max.ms": 20,
    # ...but not for every few records: with fetch.min.bytes=1 (librdkafka's default) each
    # small append to the partitions a consumer follows completes its waiting fetch, so at a
    # paced load it fetched, woke and handed over records ~1000 times a second. Measured on
    # warm local clusters (2 interleaved pairs, 15 s each): at 1 k rec/s the wrapper went
    # from 0.17 to 0.07 cores, the deduper 0.14-0.16 to 0.09, the source broker 0.42-0.46 to
    # 0.23-0.27; at 10 k the wrapper 0.23-0.25 to 0.08-0.09; p50 latency unchanged (141-173
    # against 142-147 ms at 1 k). A fetch waits for 1 MiB or fetch.wait.max.ms: 64 KB
    # still completed ~300 fetches a second per consumer at 150 k rec/s; with 1 MiB
    # (4 interleaved pairs on warm clusters) the wrapper went from 0.22-0.23 to 0.18-0.20
    # cores at 150 k and 0.13-0.14 to 0.10-0.11 at 50 k, the machine from 1.72-1.86 to
    # 1.63-1.68 busy at 150 k, p50 within 10 ms; in bulk the fetches are full either way.
    "fetch.min.bytes": 1 << 20,
    # librdkafka stops fetching for fetch.queue.backoff.ms (1 s by default)
    # whenever its prefetch queue is over queued.min.messages. Our loops drain
    # that queue within milliseconds, so a 1 s pause only starves them: it
    # capped the wrapper at ~160 k records/s here, with the CPU ~60% idle.
    "fetch.queue.backoff.ms": 5,
    # Prefetch: 16 MiB instead of librdkafka's 64 MiB (the bound is the consumer's, not a partition's). The
    # services' peak RSS is about four times it (README, "Memory"), and a quarter held the rate: side by side
    # (2026-11-30, 2-3 rounds each, prefetch and producer queue 16 MiB against 64), 1 M x 100 B at 8 partitions
    # 397-488 k against 363-433 k rec/s at the same CPU, 1 KB 94 / 49 k against 93 / 51 k, 10 KB 11.1 / 5.9 k
    # against 10.5 / 5.5 k, 100 KB 923 / 572 against 899 / 682; the pair's peak RSS 350-363 against 450-457 MB,
    # 313-332 against 586-615, 333-335 against 606-623 and 320-339 against 578-600 MB.
    "queued.max.messages.kbytes": 16 * 1024,
}


#: Memory bound of both services' data producers (staging, destination), raised to two of the largest
#: messages the producer may send. A cluster's ``client_config`` overrides it. librdkafka's default is 1 GiB,
#: and a wrapper whose source reads run ahead of the staging hop filled it: with 10 KB records the pair
#: peaked at 1.27 GB against the copy loop's 374 MB (issue 29). 16 MiB (64 until 2026-11-30; the figures are
#: at ``queued.max.messages.kbytes`` above) is still 0.16 s of data at 100 MB/s: a full queue is waited out
#: (the wrapper polls, the deduper's direct path hands the row to produce(), which waits) while the broker
#: acknowledges what is sent, so the rate does not depend on it. With it, a service's peak RSS is bounded by
#: its configuration (README, "Memory"; tests/integration/test_memory_bound.py).
PRODUCER_QUEUE_MAX_KBYTES = 16 * 1024


def data_producer_config(
    cluster: ClusterConfig,
    client_id: str,
    *,
    max_message_bytes: int,
    on_produce_failed: Callable[[str, int, str], None] | None = None,
) -> dict[str, Any]:
    """Properties of a service's data producer: the memory bound, then the cluster's (which may change it).

    Raises:
        ConfigError: the cluster's ``queue.buffering.max.kbytes`` cannot hold one message of
            ``max_message_bytes``: librdkafka would refuse such a record for ever (the services would wait).
    """
    message_kbytes = -(-max_message_bytes // 1024)  # rounded up
    conf = {"queue.buffering.max.kbytes": max(PRODUCER_QUEUE_MAX_KBYTES, 2 * message_kbytes)}
    conf.update(base_config(cluster, client_id, on_produce_failed=on_produce_failed))
    if int(conf["queue.buffering.max.kbytes"]) < message_kbytes:
        raise ConfigError(
            f"client_config of {cluster.bootstrap_servers}: queue.buffering.max.kbytes "
            f"{conf['queue.buffering.max.kbytes']} cannot hold one message of {max_message_bytes:,} bytes "
            f"(the producer's message.max.bytes); raise it to at least {message_kbytes}"
        )
    return conf


def streaming_consumer_config(
    cluster: ClusterConfig, client_id: str, *, on_session_timeout: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Properties of a consumer that streams records (STREAMING_CONSUMER_DEFAULTS, then the cluster's)."""
    return {**STREAMING_CONSUMER_DEFAULTS, **base_config(cluster, client_id, on_session_timeout=on_session_timeout)}


def admin_config(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    """AdminClient properties."""
    return base_config(cluster, client_id)


def connected_producer(conf: Mapping[str, Any], topic: str, budget_s: float = PRODUCER_CONNECT_BUDGET_S) -> Producer:
    """A Producer with a connection to a cluster broker up before it is used.

    An idempotent or transactional producer asks for its producer id as soon as
    it starts; with no broker connected, librdkafka backs off 500 ms before
    asking again. Measured here: ``init_transactions()`` took 516-525 ms on a
    fresh producer, and an idempotent producer's first delivery 506-519 ms, so
    every start, and every rebuild after a fence or a fatal error, lost half a
    second.

    Two metadata requests for one topic (``topic`` need not exist): the first is
    answered over the bootstrap connection, which librdkafka then drops in favour
    of the brokers the answer names; the second waits for one of those. With one
    request, ``init_transactions()`` still took 100-500 ms in half the tries (the
    real broker was not up yet); with two, 54-58 ms of metadata and then 4-15 ms.

    Best effort: if no broker answers within ``budget_s`` the producer is
    returned anyway, exactly as librdkafka would have left it.
    """
    producer = Producer(dict(conf))
    deadline = time.monotonic() + budget_s
    try:
        for _bootstrap_then_broker in range(2):
            producer.list_topics(topic, timeout=max(0.0, deadline - time.monotonic()))
    except KafkaException as exc:
        _log.warning("producer %s: no broker answered within %g s (%s); going on", conf.get("client.id"), budget_s, exc)
    return producer
