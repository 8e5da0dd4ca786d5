"""Restoring a deduper's state while a transaction on the state topic is still ending (real brokers).

A transaction's commit markers reach its partitions one by one after the
coordinator's decision: a CI chaos run saw a state partition's marker written
0.2 s after the staging offsets' one, and the deduper that took the staging
partition meanwhile restored no state and wrote its records again. A marker on
its way looks, to a reader, like an open transaction: the last stable offset
stops before its records. These tests hold a transaction open on the state
partition, end it from another thread, and check that the restore waits for
it and reads its records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman import envelope
from ferryman.config import ClusterConfig, FlowConfig
from ferryman.errors import KafkaOperationError
from ferryman.health import ClusterHealth
from ferryman.naming import FlowNames
from ferryman.renewing_admin import RenewingAdmin
from ferryman.state import COMPACTED_TOPIC_CONFIGS, PartitionKey, read_compacted
from ferryman.v1 import state_pb2
from ferryman_deduper._flow_topics import FlowTopics
from ferryman_deduper._gaps import GapTracker
from ferryman_deduper._partitions import StagingPartitions, staging_offsets_metadata

from tests.helpers.kafka import KafkaCluster, create_topic, wait_until

pytestmark = pytest.mark.integration

_CLUSTER = "source-cluster-id"
_KEY = PartitionKey("orders", 3)
_PARTITIONS = 2


def _state(watermark: int, gap_to: int | None = None) -> bytes:
    st = state_pb2.WatermarkState(watermark=watermark, destination_topic="src.orders", topic_id=b"t" * 16)
    if gap_to is not None:
        st.gap_to = gap_to
    return st.SerializeToString()


def _producer(bootstrap: str, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 60_000})
    p.init_transactions(30)
    return p


def _write(p: Producer, topic: str, partition: int, watermark: int, gap_to: int | None = None) -> None:
    p.produce(topic, key=_KEY.encode(_CLUSTER), value=_state(watermark, gap_to), partition=partition)
    p.flush(30)


def _staging_partitions(
    bootstrap: str,
    staging: str,
    state_topic: str,
    group: str,
    *,
    gaps: GapTracker | None = None,
    staging_id: Callable[[], bytes | None] = lambda: None,
    check_state: Callable[[], None] = lambda: None,
) -> StagingPartitions:
    """A deduper's staging partitions with a plain consumer of group (not subscribed: restores only)."""
    parts = StagingPartitions(
        make_consumer=lambda: _group_consumer(bootstrap, group),
        staging_topic=staging,
        state_topic=state_topic,
        staging_partitions=_PARTITIONS,
        instance_id="d1",
        restore_config=lambda: {"bootstrap.servers": bootstrap, "group.id": f"{group}-restore"},
        check_state=check_state,
        commit_for_revoke=lambda _lost: None,
        health=ClusterHealth("destination", ClusterConfig(bootstrap_servers=bootstrap)),
        gaps=gaps if gaps is not None else GapTracker(),
        staging_id=staging_id,
    )
    parts.consumer = _group_consumer(bootstrap, group)
    return parts


def _group_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})


@contextmanager
def _ended_later(p: Producer, delay_s: float, *, commit: bool) -> Iterator[list[float]]:
    """End p's open transaction delay_s from now, from another thread; yields [monotonic time it ended]."""
    ended: list[float] = []

    def end() -> None:
        time.sleep(delay_s)
        (p.commit_transaction if commit else p.abort_transaction)(30)
        ended.append(time.monotonic())

    t = threading.Thread(target=end, name="end-transaction")
    t.start()
    try:
        yield ended
    finally:
        t.join(60)


def _read(bootstrap: str, topic: str, partition: int, *, settle: bool, timeout_s: float = 30) -> dict[bytes, bytes]:
    conf = {"bootstrap.servers": bootstrap, "group.id": f"restore-{topic}"}
    out = read_compacted(conf, topic, [partition], timeout_s, settle=settle)[partition]
    return {k: v for k, v in out.items() if v is not None}


@pytest.fixture
def state_topic(destination_cluster: KafkaCluster, unique_name: Callable[[str], str]) -> str:
    topic = unique_name("state")
    create_topic(destination_cluster.bootstrap_servers, topic, _PARTITIONS, COMPACTED_TOPIC_CONFIGS)
    return topic


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_settled_read_waits_for_a_transaction_ending_and_reads_what_it_committed(
    destination_cluster: KafkaCluster, state_topic: str, unique_name: Callable[[str], str], commit: bool
) -> None:
    bootstrap = destination_cluster.bootstrap_servers
    p = _producer(bootstrap, unique_name("txn"))
    p.begin_transaction()
    _write(p, state_topic, 0, 100)
    p.commit_transaction(30)
    p.begin_transaction()
    _write(p, state_topic, 0, 200)
    # What the restore read before the fix: the state before the open transaction, at once.
    assert _read(bootstrap, state_topic, 0, settle=False) == {_KEY.encode(_CLUSTER): _state(100)}
    with _ended_later(p, 1.5, commit=commit) as ended:
        got = _read(bootstrap, state_topic, 0, settle=True)
        read_at = time.monotonic()
    assert got == {_KEY.encode(_CLUSTER): _state(200 if commit else 100)}
    assert ended and read_at >= ended[0]
    # The other partition, never written, is read at once.
    assert _read(bootstrap, state_topic, 1, settle=True) == {}


def test_settled_read_names_the_open_transaction_when_it_outlives_the_budget(
    destination_cluster: KafkaCluster, state_topic: str, unique_name: Callable[[str], str]
) -> None:
    bootstrap = destination_cluster.bootstrap_servers
    p = _producer(bootstrap, unique_name("txn"))
    p.begin_transaction()
    _write(p, state_topic, 0, 5)
    started = time.monotonic()
    with pytest.raises(KafkaOperationError) as info:
        _read(bootstrap, state_topic, 0, settle=True, timeout_s=2)
    assert 1.5 <= time.monotonic() - started < 15
    assert "for the transactions open on 1 partition to end" in str(info.value)
    assert f"{state_topic} [0] last stable offset 0 < high watermark 1" in str(info.value)
    p.abort_transaction(30)


def test_deduper_restore_reads_state_whose_transaction_ends_during_the_restore(
    destination_cluster: KafkaCluster, state_topic: str, unique_name: Callable[[str], str]
) -> None:
    """StagingPartitions.restore: committed offsets first, then the state once its transaction has ended."""
    bootstrap = destination_cluster.bootstrap_servers
    staging = unique_name("staging")
    create_topic(bootstrap, staging, _PARTITIONS)
    group = unique_name("dedupers")
    sp = envelope.staging_partition(_KEY.topic, _KEY.partition, _PARTITIONS)
    parts = _staging_partitions(bootstrap, staging, state_topic, group)
    consumer = parts.consumer
    try:
        # The previous owner's transaction: state and staging offsets, committed.
        p = _producer(bootstrap, unique_name("txn"))
        p.begin_transaction()
        _write(p, state_topic, sp, 41)
        p.send_offsets_to_transaction([TopicPartition(staging, sp, 12)], consumer.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        # Its next one still writing markers when the restore starts: seen as open until it ends.
        p.begin_transaction()
        _write(p, state_topic, sp, 57)
        with _ended_later(p, 1.5, commit=True):
            positions = parts.restore([sp])
        assert positions == {sp: 12}
        state = parts.state_of(_KEY)
        assert state is not None and state.watermark == 57
        assert parts.dest_topics[_KEY] == "src.orders"
    finally:
        consumer.close()


def test_a_restored_state_naming_a_gap_reopens_it_due_at_once_and_a_revoke_drops_it(
    destination_cluster: KafkaCluster, state_topic: str, unique_name: Callable[[str], str]
) -> None:
    """The gap's end is written with the staging offsets that showed it: restored, it is asked for at once.

    Before, gaps lived in memory only. A rewind, a new consumer or a restart forgot them, and the envelopes
    that had shown them were behind the committed staging offsets: with a quiet source nothing showed the
    gap again, and the partition stayed behind for good (a CI run after a staging topic was made again).
    """
    bootstrap = destination_cluster.bootstrap_servers
    staging = unique_name("staging")
    create_topic(bootstrap, staging, _PARTITIONS)
    group = unique_name("dedupers")
    sp = envelope.staging_partition(_KEY.topic, _KEY.partition, _PARTITIONS)
    gaps = GapTracker()
    parts = _staging_partitions(bootstrap, staging, state_topic, group, gaps=gaps)
    consumer = parts.consumer
    try:
        p = _producer(bootstrap, unique_name("txn"))
        p.begin_transaction()
        _write(p, state_topic, sp, 41, gap_to=99)
        p.send_offsets_to_transaction([TopicPartition(staging, sp, 12)], consumer.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        assert parts.restore([sp]) == {sp: 12}
        gap = gaps.get(_KEY)
        assert gap is not None
        assert (gap.missing_from, gap.missing_to) == (42, 99)
        assert (gap.source.cluster_id, gap.source.topic, gap.source.partition) == (_CLUSTER, _KEY.topic, 3)
        assert gap.source.topic_id == b"t" * 16
        assert gaps.due(time.monotonic(), 600.0) == [(_KEY, gap)]
        # Another deduper owns the partition now: its gap goes with it.
        parts.owned.add(sp)
        parts._revoke([TopicPartition(staging, sp)], lost=False)
        assert len(gaps) == 0
        # A gap the watermark has passed is none.
        p.begin_transaction()
        _write(p, state_topic, sp, 120, gap_to=99)
        p.commit_transaction(30)
        parts.restore([sp])
        assert len(gaps) == 0
    finally:
        consumer.close()


def test_after_a_staging_topic_is_made_again_restores_start_at_its_log_start_until_its_offsets_are_committed(
    destination_cluster: KafkaCluster, state_topic: str, unique_name: Callable[[str], str]
) -> None:
    """``read_anew``: every restore reads from the start, not only the first; a commit ends it per partition.

    The new consumer rejoins its group at once after its first assignment. Its second restore resumed at
    the old topic's committed offset, past envelopes of the new topic never read (a CI run).
    """
    bootstrap = destination_cluster.bootstrap_servers
    staging = unique_name("staging")
    create_topic(bootstrap, staging, _PARTITIONS)
    group = unique_name("dedupers")
    parts = _staging_partitions(bootstrap, staging, state_topic, group)
    try:
        p = _producer(bootstrap, unique_name("txn"))
        p.begin_transaction()
        p.send_offsets_to_transaction(
            [TopicPartition(staging, sp, 30) for sp in range(_PARTITIONS)], parts.consumer.consumer_group_metadata(), 30
        )
        p.commit_transaction(30)
        assert parts.restore([0, 1]) == {0: 30, 1: 30}
        parts.read_anew()
        assert parts.reading_anew
        # The new consumer read_anew subscribed is not polled here: restores ask a plain one, as above.
        parts.consumer.close()
        parts.consumer = _group_consumer(bootstrap, group)
        assert parts.restore([0, 1]) == {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING}
        assert parts.restore([0, 1]) == {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING}  # the rejoin's restore
        parts.positions_committed([0])
        assert parts.restore([0, 1]) == {0: 30, 1: OFFSET_BEGINNING}
        parts.positions_committed([1])
        assert not parts.reading_anew
    finally:
        parts.consumer.close()


def test_committed_offsets_naming_another_staging_topic_restore_from_the_log_start(
    destination_cluster: KafkaCluster, state_topic: str, unique_name: Callable[[str], str]
) -> None:
    """Offsets are committed by topic name, with the id of the staging topic read: another id is not this topic's.

    A transaction that commits after the staging topic was deleted (before the deduper saw the new one) leaves the
    old topic's offsets on the new topic; a deduper killed then and restarted resumed at them, past envelopes
    of the new topic never read. Offsets committed without an id (older versions) are taken as they are.
    """
    bootstrap = destination_cluster.bootstrap_servers
    staging = unique_name("staging")
    create_topic(bootstrap, staging, _PARTITIONS)
    group = unique_name("dedupers")
    topic_id = [b"\x01" * 16]
    parts = _staging_partitions(bootstrap, staging, state_topic, group, staging_id=lambda: topic_id[0])
    try:
        p = _producer(bootstrap, unique_name("txn"))
        p.begin_transaction()
        offsets = [
            TopicPartition(staging, 0, 30, metadata=staging_offsets_metadata(b"\x01" * 16)),
            TopicPartition(staging, 1, 40),  # no id
        ]
        p.send_offsets_to_transaction(offsets, parts.consumer.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        assert parts.restore([0, 1]) == {0: 30, 1: 40}
        topic_id[0] = b"\x02" * 16  # the topic made again
        assert parts.restore([0, 1]) == {0: OFFSET_BEGINNING, 1: 40}
        assert 0 not in parts.expected
    finally:
        parts.consumer.close()


def _make_again(bootstrap: str, topic: str) -> None:
    """Delete topic and make it again, empty, with the same shape (as a tool that keeps topics as declared would)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)

    def made() -> bool:
        try:
            create_topic(bootstrap, topic, _PARTITIONS, COMPACTED_TOPIC_CONFIGS)
        except KafkaException as exc:  # the deletion is still under way
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            return False
        return True

    wait_until(made, 30, message=f"topic {topic} made again")


def test_a_restore_from_a_state_topic_made_again_under_the_deduper_is_refused_and_named(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    """Every restore asks, after reading the state, whether the topic read is the one the deduper started on.

    A state topic deleted and made again between two looks of the topic watch (10 s apart) reads as empty:
    restored from, every watermark would be -1 and every record still in the source written again. The same
    id restores; a new one raises before anything read is taken, and the reason the flow stalls names it.
    """
    bootstrap = destination_cluster.bootstrap_servers
    flow = FlowConfig(
        name=unique_name("flow"), source="src", target="dst", staging_partitions=_PARTITIONS, emit_offset_mappings=False
    )
    names = FlowNames.of(flow)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    flow_topics = FlowTopics(names, flow, staging_max_message_bytes=1 << 20, startup_timeout_s=30)
    flow_topics.ensure(admin)
    flow_topics.read_ids(RenewingAdmin(lambda: admin, what="the test's admin client"))

    def check_state() -> None:  # as the deduper's `_check_state_topic`
        if not flow_topics.state_is_original():
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "the state topic is gone"))

    parts = _staging_partitions(
        bootstrap, names.staging_topic, names.state_topic, names.deduper_group, check_state=check_state
    )
    consumer = parts.consumer
    sp = envelope.staging_partition(_KEY.topic, _KEY.partition, _PARTITIONS)
    try:
        p = _producer(bootstrap, unique_name("txn"))
        p.begin_transaction()
        _write(p, names.state_topic, sp, 41)
        p.send_offsets_to_transaction(
            [TopicPartition(names.staging_topic, sp, 12)], consumer.consumer_group_metadata(), 30
        )
        p.commit_transaction(30)
        assert parts.restore([sp]) == {sp: 12}
        restored = parts.state_of(_KEY)
        assert restored is not None and restored.watermark == 41 and not flow_topics.state_lost

        _make_again(bootstrap, names.state_topic)
        assert not read_compacted({"bootstrap.servers": bootstrap}, names.state_topic, [sp], 30)[sp]  # empty
        with pytest.raises(KafkaException, match="the state topic is gone"):
            parts.restore([sp])
        kept = parts.state_of(_KEY)
        assert kept is not None and kept.watermark == 41  # nothing of the empty topic was taken
        assert f"state topic {names.state_topic} was deleted and made again under the running flow" in (
            flow_topics.state_lost
        )
    finally:
        consumer.close()
