"""Records a destination topic's configuration refuses, on real clusters.

Operators often make destination topics ahead of a flow with the cluster's defaults, or with limits the source
topic does not have: ``max.message.bytes`` 1 MiB, ``cleanup.policy=compact`` (no record without a key), a
``message.timestamp.before.max.ms`` that old records fall outside. Every transaction that holds such a record
fails: the flow cannot go on past it without skipping it, and exactly-once never skips.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from ferryman.status import deduper_status, wrapper_status

from tests.helpers.grpc_clients import local
from tests.helpers.kafka import ConsumedRecord, KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.restarts import grpc_port
from tests.helpers.services import RunningFlow, ServiceProcess, running_flow, write_flow_config

pytestmark = pytest.mark.integration

MIB = 1 << 20
#: Records per partition before and after the refused one (on partition 0).
AROUND = 100
#: A day ago, in ms: older than the destination topic takes in the timestamp case.
_DAY_MS = 86_400_000

SourceRecords = dict[int, list[ConsumedRecord]]


def _source_with_one_odd_record(source: KafkaCluster, topic: str, **odd: Any) -> SourceRecords:
    """Two partitions of small keyed records; record AROUND of partition 0 is made with odd's produce() arguments."""
    create_topic(source.bootstrap_servers, topic, 2, {"max.message.bytes": str(12 * MIB)})
    # Idempotent: a retried 9 MiB request must not land ahead of the records produced before it (a CI run
    # without it found the large record at offset 0).
    producer = Producer(
        {"bootstrap.servers": source.bootstrap_servers, "message.max.bytes": 16 * MIB, "enable.idempotence": True}
    )
    for i in range(2 * AROUND + 1):
        for partition in (0, 1):
            record: dict[str, Any] = {"key": f"{partition}:{i}".encode(), "value": f"{partition}:{i}".encode()}
            if (partition, i) == (0, AROUND):
                record.update(odd)
            producer.produce(topic, partition=partition, **record)
    assert producer.flush(30) == 0
    src = read_all(source.bootstrap_servers, topic)
    assert [r.value for r in src[0][:AROUND]] == [f"0:{i}".encode() for i in range(AROUND)]  # the odd one at AROUND
    return src


def _set_topic_config(cluster: KafkaCluster, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    change = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[change])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _refused_and_waiting(
    f: RunningFlow, destination: KafkaCluster, copy: str, src: SourceRecords, words: tuple[str, ...]
) -> str:
    """The refusal is named in the log, the status and the wrappers' pause; nothing is written twice meanwhile.

    Returns:
        The deduper's gRPC address.
    """
    f.deduper.wait_for_log("the destination refuses a record", 90)
    address = local(grpc_port(f.deduper))
    # Named by librdkafka's log line (or produce()), which may be served after the first failure's note.
    named = f"the destination refuses a record for {copy} partition 0 ("

    def named_reason() -> str:
        said = deduper_status(address).unavailable_reason
        return said if named in said else ""

    reason = wait_until(named_reason, 30, message=named)
    assert all(word in reason for word in words), (words, reason)
    refused = deduper_status(address).refused_record  # for the metric and its alert
    assert (refused.topic, refused.partition) == (copy, 0) and f"({refused.error}: " in reason, (refused, reason)
    shown = _cli_status(f.deduper)
    assert f"{copy}-0 refuses a record ({refused.error})" in shown and named in " ".join(shown.split()), shown
    f.wrapper.wait_for_log("pausing source reads: the destination refuses a record", 30)
    # Each partition holds a prefix of its source, without the refused record.
    held = read_all(destination.bootstrap_servers, copy)
    for partition, records in held.items():
        assert [r.value for r in records] == [r.value for r in src[partition][: len(records)]]
        assert len(records) <= (AROUND if partition == 0 else 2 * AROUND + 1)
    errors = [line for line in f.deduper.output().splitlines() if "ERROR" in line and "refuses a record" in line]
    assert len(errors) <= 3, errors  # once per 30 s, not per try (every ~5 s)
    return address


def _cli_status(proc: ServiceProcess) -> str:
    """`ferryman status --server` of proc, as a user runs it (piped: nothing is cut)."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "ferryman"), "status", "--server", local(grpc_port(proc))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def _restart_with(
    f: RunningFlow,
    procs: list[ServiceProcess],
    source: KafkaCluster,
    destination: KafkaCluster,
    log_dir: Path,
    flow: str,
    topic: str,
    **config: Any,
) -> None:
    """Stop procs, write the flow's configuration again with config (``wrapper=``, ``deduper=``), start them."""
    for proc in procs:
        assert proc.terminate() == 0
    write_flow_config(source, destination, log_dir, flow=flow, topics=[topic], **config)
    for proc in procs:
        proc.start().wait_for_log("gRPC server listening on port", 60)


def _copied_once(f: RunningFlow, destination: KafkaCluster, copy: str, src: SourceRecords, address: str) -> None:
    dst = read_all(destination.bootstrap_servers, copy, expected=2 * (2 * AROUND + 1), timeout_s=90)
    assert_exact_copy(src, dst)
    wait_until(lambda: not deduper_status(address).unavailable_reason, 30, message="the status clear again")
    assert not deduper_status(address).HasField("refused_record")


#: (odd record's produce() arguments, destination topic config, the config that takes it, words of the reason).
REFUSALS = [
    pytest.param(
        {"value": b"x" * (3 * MIB // 2)},
        ("max.message.bytes", str(MIB)),
        ("max.message.bytes", str(3 * MIB)),
        ("too large", "max.message.bytes", "deduper.max_message_bytes"),
        id="too-large",
    ),
    pytest.param(
        {"key": None},
        ("cleanup.policy", "compact"),
        ("cleanup.policy", "delete"),
        ("cleanup.policy", "without a key"),
        id="no-key-for-a-compacted-topic",
    ),
    pytest.param(
        {"timestamp": int(time.time() * 1000) - _DAY_MS},  # a day before the test run
        ("message.timestamp.before.max.ms", str(3_600_000)),
        ("message.timestamp.before.max.ms", str(2**63 - 1)),
        ("timestamp", "message.timestamp.before.max.ms"),
        id="timestamp-too-old",
    ),
]


@pytest.mark.parametrize(("odd", "refusing", "taking", "words"), REFUSALS)
def test_a_record_the_destination_topic_refuses_is_named_waited_for_and_copied_once_taken(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    odd: dict[str, Any],
    refusing: tuple[str, str],
    taking: tuple[str, str],
    words: tuple[str, ...],
) -> None:
    """A destination topic made ahead with a config that refuses one source record.

    Before, the deduper rebuilt its producer and tried again three to five times a second (a warning and an
    init_transactions each time), and told the wrappers (and its status) that the destination cluster was
    unavailable, which it was not. Now one ERROR per 30 s names the refusal and the config to change, the
    status and the wrappers' pause say the same, it tries again every 5 s, nothing is written twice meanwhile,
    and once the topic takes the record the flow goes on by itself: an exact copy.
    """
    topic = unique_name("refused")
    copy = f"src.{topic}"
    src = _source_with_one_odd_record(source_cluster, topic, **odd)
    create_topic(destination_cluster.bootstrap_servers, copy, 2, dict([refusing]))
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        address = _refused_and_waiting(f, destination_cluster, copy, src, words)
        _set_topic_config(destination_cluster, copy, *taking)
        _copied_once(f, destination_cluster, copy, src, address)
        f.deduper.wait_for_log("the destination takes the record it refused now", 30)
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
    src = _source_with_one_odd_record(source_cluster, topic, value=b"x" * (3 * MIB // 2))
    create_topic(destination_cluster.bootstrap_servers, copy, 2, {"max.message.bytes": str(3 * MIB)})
    small = {"max_message_bytes": MIB}
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic], deduper=small) as f:
        _refused_and_waiting(f, destination_cluster, copy, src, ("too large", "deduper.max_message_bytes = 1048576"))
        bigger = {"max_message_bytes": 4 * MIB}
        _restart_with(f, [f.deduper], source_cluster, destination_cluster, tmp_path, flow, topic, deduper=bigger)
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
    src = _source_with_one_odd_record(source_cluster, topic, value=b"x" * (9 * MIB))
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
        shown = _cli_status(f.wrapper)
        assert f"{topic}-0 held at {AROUND} (" in shown and "raise wrapper.staging_max_message_bytes" in shown, shown

        # The deduper's start-up names the dead-letter topic too (it holds records near its limit, wrapped).
        for name in (staging, copy, f"ferryman.{flow}.dlq.internal"):
            _set_topic_config(destination_cluster, name, "max.message.bytes", str(17 * MIB))
        larger = {"wrapper": {"staging_max_message_bytes": 16 * MIB}, "deduper": {"max_message_bytes": 16 * MIB}}
        _restart_with(f, [f.wrapper, f.deduper], source_cluster, destination_cluster, tmp_path, flow, topic, **larger)
        dst = read_all(destination_cluster.bootstrap_servers, copy, expected=2 * (2 * AROUND + 1), timeout_s=90)
        assert_exact_copy(src, dst)
