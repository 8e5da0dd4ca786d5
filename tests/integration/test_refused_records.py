"""Records a destination topic's configuration refuses, on real clusters.

Operators often make destination topics ahead of a flow with the cluster's defaults, or with limits the source
topic does not have: ``max.message.bytes`` 1 MiB, ``cleanup.policy=compact`` (no record without a key), a
``message.timestamp.before.max.ms`` that old records fall outside. Every transaction that holds such a record
fails: its source partition cannot go on past it without skipping it, and exactly-once never skips. The
deduper holds the staging partition that carries it (``ferryman_deduper._holds``): the source partitions of
that staging partition wait, the others go on.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from ferryman.status import deduper_status, wrapper_status
from ferryman.v1 import control_pb2

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


def _held_while_the_rest_goes_on(
    f: RunningFlow, destination: KafkaCluster, copy: str, src: SourceRecords, words: tuple[str, ...]
) -> str:
    """Partition 0 is held at the refused record, named in the log and the status; partition 1 is copied in full.

    Partition 1's staging partition is the next one after partition 0's (``envelope.staging_partition``), so
    the hold of partition 0's leaves it alone. Nothing is written twice meanwhile, and the deduper serves.

    Returns:
        The deduper's gRPC address.
    """
    f.deduper.wait_for_log("the destination refuses a record", 90)
    # Named by librdkafka's log line (or produce()), which may be served after the first failure's note: until
    # then the whole flow waits, and the try after it holds the partition.
    f.deduper.wait_for_log(f"at the record {copy}-0 refuses", 60)
    address = local(grpc_port(f.deduper))

    def held_alone() -> control_pb2.GetDeduperStatusResponse | None:
        status = deduper_status(address)
        return status if len(status.held_staging_partitions) == 1 and not status.unavailable_reason else None

    status = wait_until(held_alone, 30, message="one staging partition held, the deduper serving")
    assert status is not None
    [hold] = status.held_staging_partitions
    assert (hold.refused_record.topic, hold.refused_record.partition) == (copy, 0), hold
    assert all(word in hold.reason for word in words) and f"({hold.refused_record.error}: " in hold.reason, hold
    assert [(s.topic, s.partition) for s in hold.source_partitions] == [(copy.removeprefix("src."), 0)], hold
    assert status.refused_record == hold.refused_record  # for the metric and its alert
    shown = " ".join(_cli_status(f.deduper).split())
    assert f"{copy}-0 refuses a record ({hold.refused_record.error}): see held_staging_partitions" in shown, shown
    assert f"held at the record {copy}-0 refuses" in shown, shown

    # Partition 1 in full, partition 0 a prefix without the refused record (what shared its failed transaction
    # waits with it).
    def partition_1_in_full() -> SourceRecords | None:  # at least: a test may write more to it meanwhile
        copied = read_all(destination.bootstrap_servers, copy)
        return copied if len(copied.get(1, [])) >= 2 * AROUND + 1 else None

    copied = wait_until(partition_1_in_full, 90, message="partition 1 copied in full while partition 0 is held")
    assert copied is not None
    for partition, records in copied.items():
        expected = [r.value for r in src[partition]]
        assert [r.value for r in records[: len(expected)]] == expected[: len(records)]
    assert len(copied.get(0, [])) <= AROUND
    errors = [line for line in f.deduper.output().splitlines() if "ERROR" in line and "refuses a record" in line]
    assert len(errors) <= 3, errors  # once per 30 s, not per try
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
    status = deduper_status(address)
    assert not status.HasField("refused_record") and not status.held_staging_partitions, status


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
    unavailable, which it was not; later the whole flow waited at the record, every partition of every topic.
    Now one ERROR per 30 s names the refusal and the config to change, the record's staging partition alone
    is held (the status says which, and the source partitions waiting), the rest goes on, nothing is written
    twice meanwhile, and once the topic takes the record the held partition goes on by itself: an exact copy.
    """
    topic = unique_name("refused")
    copy = f"src.{topic}"
    src = _source_with_one_odd_record(source_cluster, topic, **odd)
    create_topic(destination_cluster.bootstrap_servers, copy, 2, dict([refusing]))
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        address = _held_while_the_rest_goes_on(f, destination_cluster, copy, src, words)
        _set_topic_config(destination_cluster, copy, *taking)
        _copied_once(f, destination_cluster, copy, src, address)
        f.deduper.wait_for_log("the destination takes the record it refused now", 30)
        for proc in (f.wrapper, f.deduper):
            assert proc.alive and proc.starts == 1, proc.output()[-4000:]


def test_a_deduper_killed_while_it_holds_a_partition_holds_it_again_and_copies_everything_once_taken(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A probe that fails aborts the other partitions' work with it; kill -9 as the next probe is under way.

    Partition 1 is written all along. The first probe meets the refusal again (held again, the next probe 10 s
    later) and aborts the transaction partition 1's records shared with it, which are rewound and written
    again once. The deduper is killed as the second probe starts: a hold is no state of its own, so the
    restarted deduper reads from the last commit, meets the refusal and holds the partition again, while
    partition 1 goes on. Once the topic takes the record, every record is copied exactly once.
    """
    topic = unique_name("refused")
    copy = f"src.{topic}"
    src = _source_with_one_odd_record(source_cluster, topic, value=b"x" * (3 * MIB // 2))
    create_topic(destination_cluster.bootstrap_servers, copy, 2, {"max.message.bytes": str(MIB)})
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        with _writing(source_cluster, topic, partition=1) as written:
            _held_while_the_rest_goes_on(f, destination_cluster, copy, src, ("too large",))
            # A second probe means the first failed (a probe that commits past the record releases the hold).
            wait_until(lambda: f.deduper.output().count("trying held staging partition") >= 2, 40, message="probes")
            f.deduper.kill9()
            at_kill = written()
            f.deduper.start().wait_for_log(f"at the record {copy}-0 refuses", 90)
            wait_until(lambda: written() >= at_kill + 50, 30, message="partition 1 written after the restart")
        goal = 2 * AROUND + 1 + written()
        wait_until(
            lambda: len(read_all(destination_cluster.bootstrap_servers, copy).get(1, [])) == goal,
            90,
            message="partition 1 copied in full while partition 0 is held again",
        )
        _set_topic_config(destination_cluster, copy, "max.message.bytes", str(3 * MIB))
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, copy, expected=sum(map(len, src.values())), timeout_s=90)
        assert_exact_copy(src, dst)
        assert f.wrapper.alive and f.wrapper.starts == 1 and f.deduper.alive, f.deduper.output()[-4000:]


@contextlib.contextmanager
def _writing(source: KafkaCluster, topic: str, *, partition: int) -> Iterator[Callable[[], int]]:
    """Write keyed records to one partition of topic, ~100 a second, until the block ends; yields the count."""
    producer = Producer({"bootstrap.servers": source.bootstrap_servers, "enable.idempotence": True})
    stop, count = threading.Event(), itertools.count()
    written = [0]

    def write() -> None:
        while not stop.wait(0.01):
            n = next(count)
            producer.produce(topic, partition=partition, key=f"w{n}".encode(), value=f"written {n}".encode())
            producer.poll(0)
            written[0] = n + 1

    thread = threading.Thread(target=write, name="writer", daemon=True)
    thread.start()
    try:
        yield lambda: written[0]
    finally:
        stop.set()
        thread.join(10)
        assert producer.flush(30) == 0


def test_a_held_partition_taken_over_by_another_deduper_is_held_there_and_copied_once_taken(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The deduper holding a staging partition leaves; the one that takes its partitions meets the refusal itself.

    A hold is dropped with its partition (no state of its own): d2, joining while d1 holds it, takes every
    staging partition once d1 stops, fails one transaction on the record and holds that partition, while
    partition 1 goes on. Once the topic takes the record, d2 releases it: an exact copy.
    """
    topic = unique_name("refused")
    copy = f"src.{topic}"
    src = _source_with_one_odd_record(source_cluster, topic, value=b"x" * (3 * MIB // 2))
    create_topic(destination_cluster.bootstrap_servers, copy, 2, {"max.message.bytes": str(MIB)})
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        _held_while_the_rest_goes_on(f, destination_cluster, copy, src, ("too large",))
        d2 = ServiceProcess("deduper", f.config, tmp_path, args=["--instance-id", "d2"]).start()
        try:
            d2.wait_for_log("gRPC server listening on port", 60)
            assert f.deduper.terminate() == 0
            d2.wait_for_log(f"at the record {copy}-0 refuses", 120)
            address = local(grpc_port(d2))
            wait_until(lambda: deduper_status(address).held_staging_partitions, 30, message="d2 holds it")
            producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "enable.idempotence": True})
            for i in range(2 * AROUND + 1, 3 * AROUND + 1):
                producer.produce(topic, partition=1, key=f"1:{i}".encode(), value=b"after")
            assert producer.flush(30) == 0
            wait_until(
                lambda: len(read_all(destination_cluster.bootstrap_servers, copy).get(1, [])) == 3 * AROUND + 1,
                90,
                message="partition 1's later records copied by d2 while it holds partition 0",
            )
            _set_topic_config(destination_cluster, copy, "max.message.bytes", str(3 * MIB))
            src = read_all(source_cluster.bootstrap_servers, topic)
            dst = read_all(destination_cluster.bootstrap_servers, copy, expected=2 * AROUND + 1 + 3 * AROUND + 1)
            assert_exact_copy(src, dst)
            d2.wait_for_log("the destination takes the record it refused now", 60)
            assert d2.alive and d2.starts == 1, d2.output()[-4000:]
        finally:
            d2.stop()


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
        words = ("too large", "deduper.max_message_bytes = 1048576")
        _held_while_the_rest_goes_on(f, destination_cluster, copy, src, words)
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
