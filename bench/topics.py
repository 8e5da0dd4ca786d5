"""Creating the bench's topics (one helper for every module that needs one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient, NewTopic

#: Budget for the broker to create the topics.
_CREATE_TIMEOUT_S = 30.0


def create_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, config: Mapping[str, str] | None = None
) -> None:
    """Create ``topics`` (replication factor 1, single-node clusters) and wait until they exist."""
    # log_level 4 (warning): the client's informational line at destruction is noise here.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    new = [NewTopic(t, partitions, 1, config=dict(config or {})) for t in topics]
    for future in admin.create_topics(new, operation_timeout=_CREATE_TIMEOUT_S).values():
        future.result(_CREATE_TIMEOUT_S)
