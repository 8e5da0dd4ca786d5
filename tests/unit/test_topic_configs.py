"""Which source topic configs are not copied (ferryman.topics.EXCLUDED_TOPIC_CONFIGS)."""

from __future__ import annotations

import pytest
from ferryman.topics import EXCLUDED_TOPIC_CONFIGS

#: MirrorMaker 2's DefaultConfigPropertyFilter.CONFIG_PROPERTIES_EXCLUDE_DEFAULT.
MM2_EXCLUDED = (
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "message.timestamp.difference.max.ms",
    "message.timestamp.type",
    "unclean.leader.election.enable",
    "min.insync.replicas",
)


def excluded(name: str) -> bool:
    return any(p.fullmatch(name) for p in EXCLUDED_TOPIC_CONFIGS)


@pytest.mark.parametrize("name", MM2_EXCLUDED)
def test_mirror_maker_2_exclusions_are_excluded(name: str) -> None:
    assert excluded(name)


@pytest.mark.parametrize(
    "name",
    # KIP-937 split message.timestamp.difference.max.ms into these two (Kafka 3.6).
    ["message.timestamp.before.max.ms", "message.timestamp.after.max.ms"],
)
def test_successors_of_excluded_configs_are_excluded(name: str) -> None:
    assert excluded(name)


@pytest.mark.parametrize(
    "name",
    [
        "cleanup.policy",
        "retention.ms",
        "retention.bytes",
        "max.message.bytes",
        "compression.type",
        "segment.bytes",
        "segment.ms",
        "min.compaction.lag.ms",
        "max.compaction.lag.ms",
        "delete.retention.ms",
        "min.cleanable.dirty.ratio",
        "message.downconversion.enable",
        "local.retention.ms",
        "remote.storage.enable",
    ],
)
def test_data_shaping_configs_are_copied(name: str) -> None:
    assert not excluded(name)


@pytest.mark.parametrize(
    "name",
    [
        "min.insync.replicas.extra",
        "xmin.insync.replicas",
        "message_timestamp_type",
        "messageXtimestampXtype",
        "leader.replication.throttled.replicasX",
    ],
)
def test_exclusions_are_full_matches_of_literal_names(name: str) -> None:
    assert not excluded(name)
