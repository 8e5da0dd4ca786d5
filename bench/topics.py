"""The bench's topics: creating, listing and deleting them, and naming a list of them in a log line."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence

from confluent_kafka.admin import AdminClient, NewTopic

#: Budget for the broker to create the topics.
_CREATE_TIMEOUT_S = 30.0
#: Budget for the broker to delete topics and for its metadata to stop naming them (a row's copies at 1,000
#: partitions went in a few seconds here).
_DELETE_TIMEOUT_S = 120.0
#: Between two looks at the metadata while topics are being deleted.
_DELETE_POLL_S = 0.5


def create_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, config: Mapping[str, str] | None = None
) -> None:
    """Create ``topics`` (replication factor 1, single-node clusters) and wait until they exist."""
    # log_level 4 (warning): the client's informational line at destruction is noise here.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    new = [NewTopic(t, partitions, 1, config=dict(config or {})) for t in topics]
    for future in admin.create_topics(new, operation_timeout=_CREATE_TIMEOUT_S).values():
        future.result(_CREATE_TIMEOUT_S)


def list_topics(bootstrap: str) -> dict[str, int]:
    """Every topic of the cluster, internal ones included, with its partition count."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    return {name: len(t.partitions) for name, t in admin.list_topics(timeout=_CREATE_TIMEOUT_S).topics.items()}


def delete_topics(bootstrap: str, topics: Collection[str]) -> None:
    """Delete ``topics`` and wait until the metadata names none of them."""
    if not topics:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    for future in admin.delete_topics(sorted(topics), operation_timeout=_DELETE_TIMEOUT_S).values():
        future.result(_DELETE_TIMEOUT_S)
    deadline = time.monotonic() + _DELETE_TIMEOUT_S
    while set(topics) & set(admin.list_topics(timeout=_CREATE_TIMEOUT_S).topics):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics still listed {_DELETE_TIMEOUT_S:g} s after their deletion")
        time.sleep(_DELETE_POLL_S)


def describe(topics: Sequence[str]) -> str:
    """``topics`` for a log line: the name of a single topic, else the count and the first and last names."""
    if len(topics) == 1:
        return topics[0]
    return f"{len(topics)} topics {topics[0]} .. {topics[-1]}"
