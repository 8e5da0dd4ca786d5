"""Group-offset sync, pure logic: which groups, which partitions, only forward; the flow's fields both ways."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from ferryman import envelope
from ferryman.config import DEFAULT_GROUPS_EXCLUDE, FlowConfig
from ferryman.errors import FlowFieldError, PreconditionError
from ferryman.flows import merged, to_config, to_proto
from ferryman.naming import GroupFilter
from ferryman.v1 import control_pb2, flows_pb2
from ferryman_deduper import _group_sync
from ferryman_deduper._group_sync import GroupSync, forward_only
from ferryman_wrapper._checkpoints import checkpoint
from google.protobuf import field_mask_pb2


def _flow(**fields: Any) -> FlowConfig:
    return FlowConfig(name="f", source="a", target="b", **fields)


def test_the_filter_takes_the_chosen_groups_and_never_ferrymans_own() -> None:
    chosen = GroupFilter.of(_flow(groups=["billing.*", "audit"], groups_exclude=["billing-test"]), "my-wrappers")
    assert chosen.matches("billing") and chosen.matches("billing-prod") and chosen.matches("audit")
    assert not chosen.matches("billing-test")  # excluded
    assert not chosen.matches("audits")  # full match only
    assert not chosen.matches("ferryman-wrapper.f") and not chosen.matches("ferryman.anything")
    assert not GroupFilter.of(_flow(), "my-wrappers").matches("my-wrappers.resend")  # a renamed wrapper group
    defaults = GroupFilter.of(_flow())
    assert defaults.matches("orders-app")
    assert not any(defaults.matches(g) for g in ("console-consumer-4711", "connect-sink", "__internal", ""))


def test_only_offsets_ahead_of_the_destination_group_are_committed() -> None:
    translated = {("t", 0): 10, ("t", 1): 20, ("t", 2): 30}
    current = {("t", 0): 10, ("t", 1): 25}  # partition 0 there already, 1 past (read further there), 2 never
    assert forward_only(translated, current) == {("t", 2): 30}
    assert forward_only(translated, {}) == translated


def test_the_flow_fields_round_trip_and_default_off() -> None:
    assert not _flow().sync_group_offsets and _flow().groups == [".*"]
    assert _flow().groups_exclude == list(DEFAULT_GROUPS_EXCLUDE)
    config = _flow(sync_group_offsets=True, groups=["a.*"], groups_exclude=[], sync_group_offsets_interval_s=2.5)
    message = to_proto(config)
    assert message.sync_group_offsets_interval_ms == 2500 and message.no_default_groups_exclude
    assert to_config(message) == config
    assert to_config(flows_pb2.Flow(name="f", source_alias="a", target_alias="b")) == _flow()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"groups": ["(("]}, "groups"),
        ({"groups_exclude": ["[x"]}, "groups_exclude"),
        ({"sync_group_offsets": True, "emit_offset_mappings": False}, "sync_group_offsets"),
    ],
)
def test_a_refused_group_setting_names_its_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(FlowFieldError) as info:
        to_config(flows_pb2.Flow(name="f", source_alias="a", target_alias="b", **fields))
    assert info.value.field == field


def test_an_update_emptying_groups_exclude_keeps_no_excludes() -> None:
    current = to_proto(_flow())
    patch = flows_pb2.Flow(name="f", sync_group_offsets=True, no_default_groups_exclude=True)
    mask = field_mask_pb2.FieldMask(paths=["sync_group_offsets", "groups_exclude"])
    after = to_config(merged(current, patch, mask))
    assert after.sync_group_offsets and after.groups_exclude == []


def test_a_checkpoint_carries_the_last_records_known() -> None:
    message = checkpoint("g", {("t", 1): 9, ("t", 0): 5}, {("t", 0): 3})
    assert [(o.partition, o.offset) for o in message.offsets] == [(0, 5), (1, 9)]
    assert message.offsets[0].last_record_offset == 3 and not message.offsets[1].HasField("last_record_offset")


class _Translator:
    """Stands in for GroupTranslator: destination offset = source offset + 100 (the rows are not used)."""

    def __init__(self) -> None:
        self.asked: list[list[tuple[str, int]]] = []

    def positions(
        self, group: str, offsets: Sequence[control_pb2.GroupOffset], budget_s: float
    ) -> tuple[list[control_pb2.TranslatedGroupOffset], dict[tuple[str, int], int]]:
        self.asked.append([(o.topic, o.partition) for o in offsets])
        return [], {(f"dst.{o.topic}", o.partition): o.offset + 100 for o in offsets}


def test_a_deduper_syncs_only_its_staging_partitions_and_counts_the_outcomes(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 4
    mine = {p for p in range(8) if envelope.staging_partition("t", p, n) in {0, 1}}
    assert mine and len(mine) < 8
    translator = _Translator()
    committed: list[dict[tuple[str, int], int]] = []
    current: dict[str, dict[tuple[str, int], int]] = {}
    members = {"busy"}

    def commit(_conf: object, group: str, offsets: dict[tuple[str, int], int], _budget: float) -> None:
        if group in members:
            raise PreconditionError("has members")
        committed.append(dict(offsets))
        current.setdefault(group, {}).update(offsets)

    monkeypatch.setattr(_group_sync, "commit_group_offsets", commit)
    monkeypatch.setattr(_group_sync, "read_group_offsets", lambda _conf, group, *_a: dict(current.get(group, {})))
    sync = GroupSync(
        translator=lambda: translator,  # type: ignore[arg-type,return-value]
        consumer_config=dict,
        owned=lambda: {0, 1},
        staging_partitions=n,
    )
    offsets = [control_pb2.GroupOffset(topic="t", partition=p, offset=10) for p in range(8)]
    assert sync.sync("g", offsets) == "committed"
    assert sorted(p for _, p in translator.asked[0]) == sorted(mine)
    assert committed == [{("dst.t", p): 110 for p in mine}]
    assert sync.sync("g", offsets) == "unchanged"  # already there
    assert sync.sync("busy", offsets) == "active"
    assert sync.sync("g", [o for o in offsets if o.partition not in mine]) == "unchanged"  # not its partitions
