"""The bench's ``--drop-copies`` on a real cluster: a row's topics go, the others stay."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.row_run import drop_copies
from bench.topics import list_topics
from tests.helpers.kafka import KafkaCluster, create_topic

pytestmark = pytest.mark.integration


def test_dropping_a_rows_copies_deletes_the_topics_created_since_and_only_those(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    bootstrap = destination_cluster.bootstrap_servers
    kept = unique_name("kept")
    create_topic(bootstrap, kept, 2)
    before = set(list_topics(bootstrap))
    copies = {unique_name("copy-a"), unique_name("copy-b")}
    for topic in copies:
        create_topic(bootstrap, topic, 3)
    drop_copies("row", {bootstrap: before})
    after = set(list_topics(bootstrap))  # delete_topics waited until the metadata no longer names them
    assert kept in after
    assert not copies & after
    assert after == before
