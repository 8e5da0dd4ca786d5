"""What a running service takes from its flow's changes in the store (LiveFlow.take), without Kafka."""

from __future__ import annotations

from ferryman.config import AcknowledgedLoss, ClusterConfig, FlowConfig, NamingConfig
from ferryman.flows import UNCHANGED, LiveFlow
from ferryman.flows._live import differing_fields, with_local_fields

FLOW = FlowConfig(name="f", source="a", target="b", topics=["t1"])


def _live() -> LiveFlow:
    return LiveFlow(ClusterConfig(bootstrap_servers="localhost:1"), FLOW, client_id="test")  # never started


def _push(live: LiveFlow, *changes: FlowConfig | None) -> None:
    for change in changes:
        live._changes.put(change)  # what the watcher thread does


def test_only_the_latest_change_is_taken_and_an_equal_one_is_no_change() -> None:
    live = _live()
    assert live.take() == UNCHANGED
    _push(live, FLOW)
    assert live.take() == UNCHANGED
    wider = FlowConfig(name="f", source="a", target="b", topics=["t.*"], paused=True)
    _push(live, FlowConfig(name="f", source="a", target="b", topics=["t2"]), wider)
    assert live.take() == wider and live.flow == wider


def test_deletion_goes_idle_once_and_the_same_flow_back_resumes() -> None:
    live = _live()
    _push(live, None)
    assert live.take() is None and live.deleted
    _push(live, None)
    assert live.take() == UNCHANGED
    _push(live, FLOW)
    assert live.take() == FLOW and not live.deleted


def test_a_definition_the_service_cannot_run_is_taken_as_a_deletion() -> None:
    live = _live()
    _push(live, FlowConfig(name="f", source="a", target="b", topics=["t1"], staging_partitions=3))
    assert live.take() is None and live.deleted and live.flow == FLOW


def test_differences_are_named_as_the_api_names_them() -> None:
    other = FlowConfig(name="f", source="a", target="c", naming=NamingConfig(rename={"x": "y"}))
    assert differing_fields(FLOW, other) == ["target_alias", "topics", "naming.renames"]


def test_acknowledged_losses_of_the_file_survive_the_store_winning() -> None:
    """The Flow resource has no acknowledged losses: the service keeps its file's, through every store change."""
    loss = AcknowledgedLoss(topic="t1", partition=0, through_offset=9, note="INC-1")
    local = FlowConfig(name="f", source="a", target="b", topics=["t1"], acknowledged_losses=[loss])
    stored = FlowConfig(name="f", source="a", target="b", topics=["t.*"])
    assert with_local_fields(stored, local).acknowledged_losses == [loss]
    live = LiveFlow(ClusterConfig(bootstrap_servers="localhost:1"), local, client_id="test")  # never started
    _push(live, stored)
    taken = live.take()
    assert isinstance(taken, FlowConfig)
    assert taken.topics == ["t.*"] and taken.acknowledged_losses == [loss]
