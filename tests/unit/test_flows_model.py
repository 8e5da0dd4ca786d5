"""The Flow resource: conversion, validation naming the field, updates by mask, etags, cycles."""

from __future__ import annotations

import pytest
from ferryman.config import DEFAULT_TOPICS_EXCLUDE, FlowConfig, NamingConfig
from ferryman.errors import FlowFieldError, FlowNotLiveError
from ferryman.flows import canonical, check_change, etag_of, find_cycle, merged, to_config, to_proto
from ferryman.flows._model import check_aliases, stamp
from ferryman.naming import TopicFilter
from ferryman.v1 import flows_pb2
from google.protobuf import field_mask_pb2, timestamp_pb2


def _flow(**fields: object) -> flows_pb2.Flow:
    base: dict[str, object] = {"name": "f1", "source_alias": "a", "target_alias": "b"}
    base.update(fields)
    return flows_pb2.Flow(**base)  # type: ignore[arg-type]


def _cfg(
    name: str, source: str, target: str, policy: str = "prefix", rename: dict[str, str] | None = None
) -> FlowConfig:
    return FlowConfig(
        name=name,
        source=source,
        target=target,
        naming=NamingConfig(policy=policy, rename=rename or {}),  # type: ignore[arg-type]
    )


def test_defaults_are_the_yaml_defaults_and_round_trip() -> None:
    config = to_config(_flow())
    assert config == FlowConfig(name="f1", source="a", target="b")
    assert list(to_proto(config).topics_exclude) == list(DEFAULT_TOPICS_EXCLUDE)
    assert to_config(to_proto(config)) == config
    assert to_config(_flow(no_default_excludes=True)).topics_exclude == []


@pytest.mark.parametrize(
    ("flow", "field"),
    [
        (_flow(name="bad name"), "name"),
        (_flow(topics=["orders[("]), "topics"),
        (_flow(topics_exclude=["(("]), "topics_exclude"),
        (_flow(topic_configs_exclude=["(("]), "topic_configs_exclude"),
        (_flow(replication_factor=-3), "replication_factor"),
        (_flow(naming=flows_pb2.Naming(policy=7)), "naming.policy"),  # type: ignore[arg-type]
    ],
)
def test_a_refused_value_names_its_field(flow: flows_pb2.Flow, field: str) -> None:
    with pytest.raises(FlowFieldError) as info:
        to_config(flow)
    assert info.value.field == field


def test_aliases_must_be_known_and_the_target_the_store_cluster() -> None:
    with pytest.raises(FlowFieldError, match="unknown cluster alias 'x'") as info:
        check_aliases(to_config(_flow(source_alias="x")), {"a", "b"}, "b")
    assert info.value.field == "source_alias"
    with pytest.raises(FlowFieldError) as info:
        check_aliases(to_config(_flow(target_alias="a")), {"a", "b"}, "b")
    assert info.value.field == "target_alias"


def test_mask_takes_only_the_named_fields() -> None:
    current = canonical(_flow(topics=["t1"], paused=False))
    patch = _flow(topics=["t2", "t3"], paused=True)
    out = merged(current, patch, field_mask_pb2.FieldMask(paths=["topics"]))
    assert list(out.topics) == ["t2", "t3"] and not out.paused
    with pytest.raises(FlowFieldError, match="unknown field path") as info:
        merged(current, patch, field_mask_pb2.FieldMask(paths=["nope"]))
    assert info.value.field == "update_mask"
    with pytest.raises(FlowFieldError, match="output only"):
        merged(current, patch, field_mask_pb2.FieldMask(paths=["etag"]))


def test_immutable_and_not_live_fields_are_refused_naming_them() -> None:
    before = to_config(_flow())
    with pytest.raises(FlowFieldError) as info:
        check_change(before, to_config(_flow(staging_partitions=3)))
    assert info.value.field == "staging_partitions"
    with pytest.raises(FlowFieldError) as info:
        check_change(before, to_config(_flow(target_alias="c")))
    assert info.value.field == "target_alias"
    with pytest.raises(FlowNotLiveError) as live:
        check_change(before, to_config(_flow(exactly_once=False)))
    assert live.value.field == "exactly_once"
    check_change(before, to_config(_flow(topics=["x"], paused=True, naming=flows_pb2.Naming(renames={"a": "b"}))))


def test_every_write_changes_the_etag() -> None:
    t1, t2 = timestamp_pb2.Timestamp(seconds=1), timestamp_pb2.Timestamp(seconds=2)
    first = stamp(canonical(_flow()), None, t1)
    second = stamp(canonical(_flow()), first, t2)
    assert first.version == 1 and second.version == 2
    assert first.etag != second.etag and second.create_time == t1
    assert etag_of(second) == second.etag


def test_identity_both_ways_is_a_cycle_and_prefix_both_ways_is_not() -> None:
    ab = _cfg("ab", "a", "b", "identity")
    assert find_cycle([ab], _cfg("ba", "b", "a", "identity")) is not None
    assert find_cycle([ab], _cfg("ba", "b", "a", "prefix")) is not None  # ab brings topics back as themselves
    assert find_cycle([_cfg("ab", "a", "b")], _cfg("ba", "b", "a")) is None
    assert find_cycle([_cfg("ab", "a", "b")], _cfg("ba", "b", "a", rename={"x": "y"})) is not None
    assert find_cycle([ab], _cfg("ab", "b", "a", "identity")) is None  # replaces the flow of its name


def test_a_longer_cycle_is_found_and_a_chain_is_not() -> None:
    flows = [_cfg("ab", "a", "b", "identity"), _cfg("bc", "b", "c", "identity")]
    cycle = find_cycle(flows, _cfg("ca", "c", "a", "identity"))
    assert cycle is not None and [f.name for f in cycle] == ["ca", "ab", "bc"]
    assert find_cycle(flows, _cfg("cd", "c", "d", "identity")) is None


def test_prefix_flows_never_replicate_topics_that_came_from_their_target() -> None:
    f = TopicFilter.of(_cfg("ba", "b", "a"))
    assert f.matches("orders") and f.matches("c.orders")
    assert not f.matches("a.orders") and not f.matches("c.a.orders")
    assert f.matches("orders.a")  # the last part is the topic itself
    assert TopicFilter.of(_cfg("ba", "b", "a", "identity")).matches("a.orders")
