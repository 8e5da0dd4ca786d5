"""The bench's topics: creating, listing and deleting them, and naming a list of them in a log line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient, NewTopic

#: Budget for the broker to create the topics.
_CREATE_TIMEOUT_S = 30.0
#: Budget to list or delete topics.
_ADMIN_TIMEOUT_S = 60.0


def _admin(bootstrap: str) -> AdminClient:
    # log_level 4 (warning): the client's informational line at destruction is noise here.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def create_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, config: Mapping[str, str] | None = None
) -> None:
    """Create ``topics`` (replication factor 1, single-node clusters) and wait until they exist."""
    admin = _admin(bootstrap)
    new = [NewTopic(t, partitions, 1, config=dict(config or {})) for t in topics]
    for future in admin.create_topics(new, operation_timeout=_CREATE_TIMEOUT_S).values():
        future.result(_CREATE_TIMEOUT_S)


def list_topics(bootstrap: str) -> set[str]:
    """The names of the cluster's topics, Kafka's own (``__consumer_offsets``...) left out."""
    names = _admin(bootstrap).list_topics(timeout=_ADMIN_TIMEOUT_S).topics
    return {t for t in names if not t.startswith("__")}


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    """Delete ``topics`` and wait for the controller to accept it (the broker removes their files later)."""
    if not topics:
        return
    admin = _admin(bootstrap)  # held until the futures resolve: a dropped client cancels its requests (_DESTROY)
    for future in admin.delete_topics(list(topics), operation_timeout=_ADMIN_TIMEOUT_S).values():
        future.result(_ADMIN_TIMEOUT_S)


def describe(topics: Sequence[str]) -> str:
    """``topics`` for a log line: the name of a single topic, else the count and the first and last names."""
    if len(topics) == 1:
        return topics[0]
    return f"{len(topics)} topics {topics[0]} .. {topics[-1]}"
