"""librdkafka client configurations, built from typed config in one place."""

from __future__ import annotations

from typing import Any

from ferryman.config import ClusterConfig


def base_config(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    """Common properties for any client on cluster (security etc. from client_config)."""
    conf: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap_servers, "client.id": client_id}
    conf.update(cluster.client_config)
    return conf


def admin_config(cluster: ClusterConfig, client_id: str) -> dict[str, Any]:
    """AdminClient properties."""
    return base_config(cluster, client_id)
