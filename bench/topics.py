"""The bench's topics: creating them, and naming a list of them in a log line (one home for both)."""

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


def describe(topics: Sequence[str]) -> str:
    """``topics`` for a log line: the name of a single topic, else the count and the first and last names."""
    if len(topics) == 1:
        return topics[0]
    return f"{len(topics)} topics {topics[0]} .. {topics[-1]}"
