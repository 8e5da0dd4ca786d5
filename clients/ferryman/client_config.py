"""librdkafka client configurations, built from typed config in one place."""

from __future__ import annotations

from typing import Any

from ferryman.config import ClusterConfig


def base_config(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    """Common properties for any client on cluster (security etc. from client_config)."""
    conf: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap_servers, "client.id": client_id}
    conf.update(cluster.client_config)
    return conf


#: Consumer settings of both services' streaming reads (source records, staging
#: envelopes). A cluster's ``client_config`` overrides any of them.
STREAMING_CONSUMER_DEFAULTS: dict[str, Any] = {
    # End-to-end latency: the broker answers a fetch within 20 ms when there is
    # little data, instead of holding it up to 500 ms (librdkafka's default).
    "fetch.wait.max.ms": 20,
    # librdkafka stops fetching for fetch.queue.backoff.ms (1 s by default)
    # whenever its prefetch queue is over queued.min.messages. Our loops drain
    # that queue within milliseconds, so a 1 s pause only starves them: it
    # capped the wrapper at ~160 k records/s here, with the CPU ~60% idle.
    "fetch.queue.backoff.ms": 5,
}


def streaming_consumer_config(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    """Properties of a consumer that streams records (STREAMING_CONSUMER_DEFAULTS, then the cluster's)."""
    return {**STREAMING_CONSUMER_DEFAULTS, **base_config(cluster, client_id)}


def admin_config(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    """AdminClient properties."""
    return base_config(cluster, client_id)
