"""Names (ferryman.naming): destination topics, the topic filter, a flow's internal names."""

from __future__ import annotations

import random
import string

import pytest
from ferryman.config import DEFAULT_TOPICS_EXCLUDE, FlowConfig, NamingConfig, validated
from ferryman.naming import FlowNames, NamingPolicy, TopicFilter


def flow(**kw: object) -> FlowConfig:
    return validated(FlowConfig, {"name": "f1", "source": "east", "target": "west", **kw})


# ---------------------------------------------------------------- naming policy


def test_prefix_policy_is_mirror_maker_2s_default() -> None:
    policy = NamingPolicy("east", NamingConfig())
    assert policy.destination_topic("orders") == "east.orders"
    assert policy.destination_topic("a.b-c_d") == "east.a.b-c_d"


def test_prefix_policy_with_another_separator() -> None:
    assert NamingPolicy("east", NamingConfig(separator="_")).destination_topic("orders") == "east_orders"
    assert NamingPolicy("east", NamingConfig(separator="--")).destination_topic("orders") == "east--orders"


def test_identity_policy_keeps_the_name() -> None:
    policy = NamingPolicy("east", NamingConfig(policy="identity"))
    for topic in ("orders", "east.orders", "x" * 249):
        assert policy.destination_topic(topic) == topic


@pytest.mark.parametrize("policy", ["prefix", "identity"])
def test_explicit_renames_win_over_the_policy(policy: str) -> None:
    naming = validated(NamingConfig, {"policy": policy, "rename": {"orders": "orders-copy", "pay": "east.pay"}})
    names = NamingPolicy("east", naming)
    assert names.destination_topic("orders") == "orders-copy"
    assert names.destination_topic("pay") == "east.pay"
    expected = "east.other" if policy == "prefix" else "other"
    assert names.destination_topic("other") == expected


def test_renames_match_whole_names_only() -> None:
    names = NamingPolicy("east", NamingConfig(rename={"orders": "o"}))
    assert names.destination_topic("orders2") == "east.orders2"
    assert names.destination_topic("my.orders") == "east.my.orders"


# ---------------------------------------------------------------- topic filter


@pytest.mark.parametrize(
    "topic",
    [
        "__consumer_offsets",
        "__transaction_state",
        "__anything",
        "foo.internal",
        "foo-internal",
        "mm2-offsets.east.internal",
        "connect-configs-internal",
        "x.replica",
        "orders.replica",
    ],
)
def test_default_excludes_keep_internal_topics_out(topic: str) -> None:
    assert not TopicFilter.of(flow()).matches(topic)


@pytest.mark.parametrize(
    "topic",
    ["orders", "internal", "internal.orders", "foo_internal", "foo.internals", "replica", "x-replica", "_single"],
)
def test_default_excludes_are_full_matches_not_searches(topic: str) -> None:
    assert TopicFilter.of(flow()).matches(topic)


def test_default_excludes_are_mirror_maker_2s() -> None:
    # MM2 DefaultTopicFilter: topics.exclude = .*[\-\.]internal, .*\.replica, __.*
    assert set(DEFAULT_TOPICS_EXCLUDE) == {r"__.*", r".*[-.]internal", r".*\.replica"}


def test_includes_are_full_matches() -> None:
    topics = TopicFilter.of(flow(topics=["orders", r"pay\..*"]))
    assert topics.matches("orders")
    assert topics.matches("pay.eu")
    for other in ("orders2", "my-orders", "pay", "payXeu", "xpay.eu"):
        assert not topics.matches(other), other


def test_excludes_win_over_includes() -> None:
    topics = TopicFilter.of(flow(topics=[r"orders.*"], topics_exclude=[r"orders\.tmp.*"]))
    assert topics.matches("orders.eu")
    assert not topics.matches("orders.tmp")
    assert not topics.matches("orders.tmp2")


def test_explicit_empty_excludes_let_internal_topics_through() -> None:
    topics = TopicFilter.of(flow(topics=["audit.internal"], topics_exclude=[]))
    assert topics.matches("audit.internal")


def test_no_includes_match_nothing() -> None:
    assert not TopicFilter.of(flow(topics=[])).matches("orders")


# ---------------------------------------------------------------- a flow's own names


def _flow_names(n: int) -> list[str]:
    rng = random.Random(5)
    alphabet = string.ascii_letters + string.digits + "._-"
    return ["f1", "a", "east-to-west", "x.y_z"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)
    ]


@pytest.mark.parametrize("name", _flow_names(40))
def test_internal_topics_end_in_internal_and_are_never_replicated(name: str) -> None:
    f = flow(name=name)
    names = FlowNames.of(f)
    internal = [names.staging_topic, names.state_topic, names.specs_topic, names.offset_map_topic, names.audit_topic]
    assert len(set(internal)) == 5
    any_topic = TopicFilter.of(flow(name="other", topics=[".*"]))
    for topic in internal:
        assert topic.endswith(".internal")
        assert topic.startswith(f"ferryman.{name}.")
        assert not any_topic.matches(topic)  # another flow on the same cluster leaves them alone


def test_flow_names_defaults() -> None:
    names = FlowNames.of(flow(name="f1"))
    assert names.staging_topic == "ferryman.f1.staging.internal"
    assert names.state_topic == "ferryman.f1.state.internal"
    assert names.specs_topic == "ferryman.f1.topics.internal"
    assert names.offset_map_topic == "ferryman.f1.offset-map.internal"
    assert names.audit_topic == "ferryman.f1.audit.internal"
    assert names.wrapper_group == "ferryman-wrapper.f1"
    assert names.deduper_group == "ferryman-deduper.f1"
    assert names.transactional_id("d-1") == "ferryman-deduper.f1.d-1"


def test_flow_names_overrides() -> None:
    names = FlowNames.of(flow(staging_topic="proxy"), wrapper_group="wg", deduper_group="dg")
    assert (names.staging_topic, names.wrapper_group, names.deduper_group) == ("proxy", "wg", "dg")
    assert names.state_topic == "ferryman.f1.state.internal"


def test_transactional_ids_differ_per_instance_and_per_flow() -> None:
    a, b = FlowNames.of(flow(name="a")), FlowNames.of(flow(name="b"))
    ids = {a.transactional_id("1"), a.transactional_id("2"), b.transactional_id("1")}
    assert len(ids) == 3
