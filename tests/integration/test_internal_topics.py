"""Internal topics on a real cluster: created together, a few round trips in all, existing ones checked first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from ferryman.config import load_config
from ferryman.errors import TopicShapeError
from ferryman.naming import FlowNames
from ferryman.state import COMPACTED_TOPIC_CONFIGS
from ferryman.topics import InternalTopic, describe_topics, ensure_internal_topics

from tests.helpers.kafka import KafkaCluster, create_topic
from tests.helpers.services import ServiceProcess, write_flow_config

pytestmark = pytest.mark.integration

_TIMEOUT_S = 30.0


def _admin(cluster: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def _configs(admin: AdminClient, name: str) -> dict[str, str]:
    res = ConfigResource(ResourceType.TOPIC, name)
    entries = admin.describe_configs([res], request_timeout=_TIMEOUT_S)[res].result(timeout=_TIMEOUT_S)
    return {k: e.value for k, e in entries.items() if e.value is not None}


def test_missing_topics_are_created_with_their_own_shapes_and_existing_ones_are_kept(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    admin = _admin(destination_cluster)
    staging, state, specs = unique_name("staging"), unique_name("state"), unique_name("specs")
    # One of the three exists already, with the right shape: it is checked, not re-created.
    create_topic(destination_cluster.bootstrap_servers, state, 4, dict(COMPACTED_TOPIC_CONFIGS))
    wanted = [
        InternalTopic(staging, 4, {"cleanup.policy": "delete", "max.message.bytes": "2097152"}, "staging"),
        InternalTopic(state, 4, COMPACTED_TOPIC_CONFIGS, "state"),
        InternalTopic(specs, 1, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
    ]
    ensure_internal_topics(admin, wanted, _TIMEOUT_S)
    found = describe_topics(admin, [staging, state, specs], _TIMEOUT_S)
    assert {name: info.partitions for name, info in found.items()} == {staging: 4, state: 4, specs: 1}
    assert _configs(admin, staging)["cleanup.policy"] == "delete"
    assert _configs(admin, staging)["max.message.bytes"] == "2097152"
    assert _configs(admin, specs)["cleanup.policy"] == "compact"
    ensure_internal_topics(admin, wanted, _TIMEOUT_S)  # a restart finds them all as they should be
    assert describe_topics(admin, [staging], _TIMEOUT_S)[staging].topic_id == found[staging].topic_id


@pytest.mark.parametrize(
    ("existing_partitions", "existing_configs", "complaint"),
    [
        (3, {"cleanup.policy": "compact"}, "has 3 partitions but the flow is configured for 4"),
        (4, {"cleanup.policy": "delete"}, "has cleanup.policy=delete, expected compact"),
        (4, {"cleanup.policy": "compact", "max.message.bytes": "1000"}, "has max.message.bytes=1000, below the 2000"),
    ],
)
def test_an_existing_topic_of_the_wrong_shape_is_named_and_nothing_is_created(
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    existing_partitions: int,
    existing_configs: dict[str, str],
    complaint: str,
) -> None:
    admin = _admin(destination_cluster)
    good, bad = unique_name("good"), unique_name("bad")
    create_topic(destination_cluster.bootstrap_servers, bad, existing_partitions, existing_configs)
    wanted = [
        InternalTopic(good, 4, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
        InternalTopic(bad, 4, {"cleanup.policy": "compact", "max.message.bytes": "2000"}, "state"),
    ]
    with pytest.raises(TopicShapeError) as caught:
        ensure_internal_topics(admin, wanted, _TIMEOUT_S)
    assert str(caught.value).startswith(f"state topic {bad} {complaint}")
    # The bad topic is left as it was, and nothing was created: a corrected configuration must not find
    # topics created for the wrong one.
    found = describe_topics(admin, [good, bad], _TIMEOUT_S)
    assert good not in found
    assert found[bad].partitions == existing_partitions


def test_the_deduper_refuses_a_state_topic_that_would_be_deleted_instead_of_compacted(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    cfg = write_flow_config(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=["nothing"],
        staging_partitions=4,
    )
    names = FlowNames.of(load_config(cfg).flows[0])
    state_topic = names.state_topic
    create_topic(destination_cluster.bootstrap_servers, state_topic, 4, {"cleanup.policy": "delete"})
    deduper = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "d1"]).start()
    assert deduper.wait_exit(60) == 1
    out = deduper.output()
    assert f"state topic {state_topic} has cleanup.policy=delete, expected compact" in out
    assert "Traceback" not in out
    others = [names.staging_topic, names.specs_topic, names.offset_map_topic]
    assert describe_topics(_admin(destination_cluster), others, _TIMEOUT_S) == {}  # it stopped before creating them
