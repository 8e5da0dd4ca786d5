"""The offset map: every committed record's exact source offset -> destination offset."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ferryman.state import PartitionKey, mapped_source_offsets
from ferryman.v1 import state_pb2

from tests.helpers.kafka import KafkaCluster, assert_exact_copy, create_topic, produce_sequences, read_all
from tests.helpers.services import running_flow

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("transactional", [True, False], ids=["offsets-with-holes", "consecutive-offsets"])
def test_offset_map_maps_every_record_exactly(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    transactional: bool,
) -> None:
    topic = unique_name("omap")
    create_topic(source_cluster.bootstrap_servers, topic, 3)
    # Transactional source: markers leave gaps in source offsets, so the map is not an identity shift and
    # lists source offsets; a plain source has none, and the map gives each run as its first offset and count.
    produce_sequences(
        source_cluster.bootstrap_servers, topic, 3, 700, transactional=transactional, records_per_transaction=50
    )
    flow = unique_name("flow")
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic]):
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=2100, timeout_s=90)
    maps = read_all(destination_cluster.bootstrap_servers, f"ferryman.{flow}.offset-map.internal")
    src_by_offset = {(p, r.offset): r.value for p, recs in src.items() for r in recs}
    dst_by_offset = {(p, r.offset): r.value for p, recs in dst.items() for r in recs}
    mapped: dict[tuple[int, int], int] = {}
    listed = 0
    for recs in maps.values():
        for rec in recs:
            assert rec.value is not None
            m = state_pb2.OffsetMapping.FromString(rec.value)
            assert m.source.topic == topic
            assert m.destination_topic == f"src.{topic}"
            assert m.destination_partition == m.source.partition
            listed += bool(m.source_offsets)
            assert m.record_count == len(mapped_source_offsets(m))
            for i, so in enumerate(mapped_source_offsets(m)):
                key = (m.source.partition, so)
                assert key not in mapped, f"source offset {key} mapped twice"
                mapped[key] = m.first_destination_offset + i
    # Every source record is mapped, to the destination record with the same content.
    assert set(mapped) == set(src_by_offset)
    for (p, so), do in mapped.items():
        assert dst_by_offset[(p, do)] == src_by_offset[(p, so)]
    if transactional:
        assert any(so != do for (_, so), do in mapped.items())
        assert listed, "offsets with holes must be listed"
    else:
        assert not listed, "consecutive source offsets are stored as first offset and count"
    # The committed state of each source partition names the destination offset of the record at its
    # watermark (the state and the map are written in the same transaction).
    states: dict[int, state_pb2.WatermarkState] = {}
    for recs in read_all(destination_cluster.bootstrap_servers, f"ferryman.{flow}.state.internal").values():
        for rec in recs:  # in offset order: the last record of a key is its latest state
            assert rec.key is not None and rec.value is not None
            _cluster, state_key = PartitionKey.decode(rec.key)
            states[state_key.partition] = state_pb2.WatermarkState.FromString(rec.value)
    assert set(states) == {0, 1, 2}
    for p, st in states.items():
        assert st.watermark == max(so for (q, so) in src_by_offset if q == p)
        assert st.destination_offset == mapped[(p, st.watermark)], f"partition {p}: {st}"


def test_without_offset_map_the_copy_is_exact_and_states_name_no_destination_offset(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("nomap")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, 500)
    flow = unique_name("flow")
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=flow,
        topics=[topic],
        extra_flow={"emit_offset_mappings": False},
    ):
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=1000, timeout_s=90)
    assert_exact_copy(src, dst)
    maps = read_all(destination_cluster.bootstrap_servers, f"ferryman.{flow}.offset-map.internal")
    assert sum(len(r) for r in maps.values()) == 0
    states = [
        state_pb2.WatermarkState.FromString(rec.value)
        for recs in read_all(destination_cluster.bootstrap_servers, f"ferryman.{flow}.state.internal").values()
        for rec in recs
        if rec.value is not None
    ]
    assert states, "no state written"
    assert {st.destination_offset for st in states} == {-1}
    assert {st.watermark for st in states} >= {499}
