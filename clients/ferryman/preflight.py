"""Start-up checks of settings against what the brokers allow, before any record moves.

A setting the brokers would refuse later (in the middle of a transaction, or
only under load) is a clear configuration error at start-up instead, naming the
setting and the broker limit.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from ferryman.errors import ConfigError
from ferryman.kafka_errors import authorization_error
from ferryman.topics import answer

_log = logging.getLogger(__name__)


def broker_setting(admin: AdminClient, name: str, timeout_s: float) -> str | None:
    """The value of broker setting name on one broker of the cluster (the controller's view of a uniform setting).

    Returns:
        The value, or None when it cannot be read (no DescribeConfigs permission: the check is skipped, logged).
    """
    cluster = answer(admin.describe_cluster(request_timeout=timeout_s), timeout_s, "describe cluster", admin=admin)
    if not cluster.nodes:
        return None
    resource = ConfigResource(ResourceType.BROKER, str(cluster.nodes[0].id))
    try:
        futures = admin.describe_configs([resource], request_timeout=timeout_s)
        entries = answer(futures[resource], timeout_s, "describe broker configs", admin=admin)
    except KafkaException as exc:
        if authorization_error(exc, operation="describe broker configs") is None:
            raise
        _log.warning("cannot read the brokers' %s (no DescribeConfigs permission): not checked", name)
        return None
    entry = entries.get(name)
    return None if entry is None or entry.value is None else str(entry.value)


def check_transaction_timeout(admin: AdminClient, timeout_ms: int, setting: str, timeout_s: float) -> None:
    """Raise ConfigError when timeout_ms exceeds the brokers' ``transaction.max.timeout.ms``.

    The brokers refuse such a producer's InitProducerId (INVALID_TRANSACTION_TIMEOUT);
    saying so at start-up names the setting to change.
    """
    value = broker_setting(admin, "transaction.max.timeout.ms", timeout_s)
    if value is not None and timeout_ms > int(value):
        raise ConfigError(
            f"{setting} is {timeout_ms} ms, above the destination brokers' transaction.max.timeout.ms ({value} ms): "
            f"the brokers would refuse the transactional producer. Lower {setting} to at most {value}, or raise "
            f"transaction.max.timeout.ms on the brokers"
        )
