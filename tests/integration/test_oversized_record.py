"""A source record larger than its destination topic accepts, on real clusters.

Operators often make destination topics ahead of a flow with the cluster's defaults (``max.message.bytes``
1 MiB) while the source topic takes more. Every transaction that holds such a record fails
(``MSG_SIZE_TOO_LARGE``): the flow cannot go on past it without skipping it, and exactly-once never skips.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from ferryman.status import deduper_status, wrapper_status

from tests.helpers.grpc_clients import local
from tests.helpers.kafka import ConsumedRecord, KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.restarts import grpc_port
from tests.helpers.services import RunningFlow, running_flow, write_flow_config

pytestmark = pytest.mark.integration

MIB = 1 << 20
#: Records per partition before and after the large one (on partition 0).
AROUND = 100

SourceRecords = dict[int, list[ConsumedRecord]]


def _source_with_one_large_record(source: KafkaCluster, topic: str, size: int = 3 * MIB // 2) -> SourceRecords:
    """Two partitions of small records, one of size bytes among them on partition 0; what the source holds."""
    create_topic(source.bootstrap_servers, topic, 2, {"max.message.bytes": str(size + MIB)})
    producer = Producer({"bootstrap.servers": source.bootstrap_servers, "message.max.bytes": size + 2 * MIB})
    for i in range(2 * AROUND + 1):
        for partition in (0, 1):
            value = b"x" * size if (partition, i) == (0, AROUND) else f"{partition}:{i}".encode()
            producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0
    return read_all(source.bootstrap_servers, topic)


def _set_max_message_bytes(cluster: KafkaCluster, topic: str, value: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    change = ConfigEntry("max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[change])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _refused_and_waiting(f: RunningFlow, destination: KafkaCluster, copy: str, src: SourceRecords) -> str:
    """The refusal is named in the log, the status and the wrappers' pause; nothing is written twice meanwhile.

    Returns:
        The deduper's gRPC address.
    """
    f.deduper.wait_for_log("the destination refuses a record as too large", 90)
    address = local(grpc_port(f.deduper))
    reason = wait_until(lambda: deduper_status(address).unavailable_reason, 30, message="a status reason")
    assert "too large" in reason and "max.message.bytes" in reason and "max_message_bytes" in reason, reason
    f.wrapper.wait_for_log("pausing source reads: the destination refuses a record as too large", 30)
    # Each partition holds a prefix of its source, without the large record.
    held = read_all(destination.bootstrap_servers, copy)
    for partition, records in held.items():
        assert [r.value for r in records] == [r.value for r in src[partition][: len(records)]]
        assert len(records) <= (AROUND if partition == 0 else 2 * AROUND + 1)
    assert f.deduper.output().count("refuses a record as too large") <= 3  # ERROR once per 30 s, not per try
    return address


def _copied_once(f: RunningFlow, destination: KafkaCluster, copy: str, src: SourceRecords, address: str) -> None:
    dst = read_all(destination.bootstrap_servers, copy, expected=2 * (2 * AROUND + 1), timeout_s=90)
    assert_exact_copy(src, dst)
    wait_until(lambda: not deduper_status(address).unavailable_reason, 30, message="the status clear again")


def test_a_record_larger_than_the_destination_topic_takes_is_named_waited_for_and_copied_once_allowed(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A 1.5 MiB record for a destination topic made ahead with max.message.bytes 1 MiB.

    Before, the deduper warned of a failed commit every ~3.5 s and told the wrappers (and its status) that
    the destination cluster was unavailable, which it was not. Now one ERROR per 30 s names the refusal and
    the settings to raise, the status and the wrappers' pause say the same, nothing is written twice
    meanwhile, and once the topic takes the record the flow goes on by itself: an exact copy.
    """
    topic = unique_name("large")
    copy = f"src.{topic}"
    src = _source_with_one_large_record(source_cluster, topic)
    create_topic(destination_cluster.bootstrap_servers, copy, 2, {"max.message.bytes": str(MIB)})
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        address = _refused_and_waiting(f, destination_cluster, copy, src)
        _set_max_message_bytes(destination_cluster, copy, 3 * MIB)
        _copied_once(f, destination_cluster, copy, src, address)
        f.deduper.wait_for_log("the destination takes the record it refused as too large now", 30)
        for proc in (f.wrapper, f.deduper):
            assert proc.alive and proc.starts == 1, proc.output()[-4000:]


def test_a_record_larger_than_the_deduper_may_produce_is_named_and_copied_once_after_a_restart_with_more(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The same record against the deduper's own producer limit (deduper.max_message_bytes 1 MiB): librdkafka
    refuses it at produce(), before any broker sees it. Named the same way; a restart with a larger
    deduper.max_message_bytes copies it, once.
    """
    topic, flow = unique_name("large"), unique_name("flow")
    copy = f"src.{topic}"
    src = _source_with_one_large_record(source_cluster, topic)
    create_topic(destination_cluster.bootstrap_servers, copy, 2, {"max.message.bytes": str(3 * MIB)})
    small = {"max_message_bytes": MIB}
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic], deduper=small) as f:
        _refused_and_waiting(f, destination_cluster, copy, src)
        assert f.deduper.terminate() == 0
        write_flow_config(
            source_cluster,
            destination_cluster,
            tmp_path,
            flow=flow,
            topics=[topic],
            deduper={"max_message_bytes": 4 * MIB},
        )
        f.deduper.start().wait_for_log("gRPC server listening on port", 60)
        _copied_once(f, destination_cluster, copy, src, local(grpc_port(f.deduper)))


def test_a_record_too_large_to_stage_holds_its_partition_only_named_until_a_restart_with_more(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A 9 MiB source record against the wrapper's staging limit (wrapper.staging_max_message_bytes, 8 MiB).

    Before, the wrapper failed its step, rewound every partition and tried again about four times a second
    for ever, two warnings each time. Now that partition alone is held at the record (paused and sought
    back to it), one ERROR per 30 s names it, its offset and the setting, and the wrapper's status lists it;
    the other partition is copied in full meanwhile. A restart with larger limits copies the rest, once.
    """
    topic, flow = unique_name("huge"), unique_name("flow")
    copy, staging = f"src.{topic}", f"ferryman.{flow}.staging.internal"
    src = _source_with_one_large_record(source_cluster, topic, size=9 * MIB)
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic]) as f:
        held = read_all(destination_cluster.bootstrap_servers, copy, expected=AROUND + 2 * AROUND + 1, timeout_s=90)
        assert len(held[0]) == AROUND and len(held[1]) == 2 * AROUND + 1, {p: len(r) for p, r in held.items()}
        assert_exact_copy({0: src[0][:AROUND], 1: src[1]}, held)
        f.wrapper.wait_for_log(f"source partition {topic}-0 is held at offset {AROUND}", 30)
        status = wrapper_status(local(grpc_port(f.wrapper)))
        [part] = status.held_partitions
        assert (part.topic, part.partition, part.offset) == (topic, 0, AROUND) and part.envelope_bytes > 9 * MIB
        assert not status.unavailable_reason  # the wrapper serves: one partition waits, the rest go on
        assert f.wrapper.output().count("is held at offset") <= 2  # once per 30 s, not per try
        shown = subprocess.run(
            [str(Path(sys.executable).parent / "ferryman"), "status", "--server", local(grpc_port(f.wrapper))],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert f"{topic}-0 held at {AROUND} (" in shown and "raise wrapper.staging_max_message_bytes" in shown, shown

        for proc in (f.wrapper, f.deduper):
            assert proc.terminate() == 0
        # The deduper's start-up names the dead-letter topic too (it holds records near its limit, wrapped).
        for name in (staging, copy, f"ferryman.{flow}.dlq.internal"):
            _set_max_message_bytes(destination_cluster, name, 17 * MIB)
        larger = {"staging_max_message_bytes": 16 * MIB}
        write_flow_config(
            source_cluster,
            destination_cluster,
            tmp_path,
            flow=flow,
            topics=[topic],
            wrapper=larger,
            deduper={"max_message_bytes": 16 * MIB},
        )
        f.wrapper.start()
        f.deduper.start()
        dst = read_all(destination_cluster.bootstrap_servers, copy, expected=2 * (2 * AROUND + 1), timeout_s=90)
        assert_exact_copy(src, dst)
