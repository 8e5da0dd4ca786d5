"""A destination whose brokers create topics on first use (``auto.create.topics.enable``, Kafka's default).

Ferryman makes every topic it writes itself, with the shape the flow needs, and its clients never let a
metadata request create one (``allow.auto.create.topics`` false: librdkafka's producers and the Python
AdminClient allow it by default). With it allowed, a state topic deleted under a running flow came back at the
deduper's next write with the broker's default partition count (librdkafka: "partition count changed from 6 to
1"), and the deduper's rewind read its watermarks from that empty topic: an empty state duplicates every record
still in the source once the counts match (here the missing partitions stalled the rewind first).

The state topic deleted under the flow stalls it, named in the deduper's log and status, with nothing
duplicated; the procedure the message gives (stop the dedupers, delete the destination and state topics,
start them) copies the source again, exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from ferryman.status import deduper_status
from ferryman_local import LocalCluster

from tests.helpers.grpc_clients import NOT_SERVING, health, local
from tests.helpers.kafka import ConsumedRecord, KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.restarts import grpc_port
from tests.helpers.services import running_flow
from tests.helpers.streams import SequenceProducer

pytestmark = pytest.mark.integration

_PARTITIONS = 2
_PER_PARTITION = 4000


@pytest.fixture(scope="module")
def auto_creating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A one-node cluster that creates a topic, with one partition, when a client's metadata request names it."""
    cluster = LocalCluster.start(
        "autocreate",
        work_dir=tmp_path_factory.mktemp("autocreate"),
        extra_properties={"auto.create.topics.enable": "true", "num.partitions": "1"},
        ready_timeout_s=120,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def _values(records: Mapping[int, Sequence[ConsumedRecord]]) -> dict[int, list[bytes]]:
    return {p: [r.value or b"" for r in recs] for p, recs in records.items()}


def test_a_state_topic_deleted_under_the_flow_stalls_it_named_and_nothing_is_written_twice(
    source_cluster: KafkaCluster, auto_creating: LocalCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("statedel")
    create_topic(source_cluster.bootstrap_servers, topic, _PARTITIONS)
    stream = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], _PARTITIONS, per_partition=_PER_PARTITION, rate_per_s=800
    )
    flow = unique_name("flow")
    dst = auto_creating.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": dst})
    with running_flow(source_cluster, auto_creating, tmp_path, flow=flow, topics=[topic]) as f:
        stream.start()
        read_all(dst, f"src.{topic}", expected=500, timeout_s=90)
        state = f"ferryman.{flow}.state.internal"
        admin.delete_topics([state])[state].result(30)

        f.deduper.wait_for_log(f"state topic {state} was deleted under the running flow", 60)
        address = local(grpc_port(f.deduper))
        assert health(address) == NOT_SERVING
        assert deduper_status(address).unavailable_reason.startswith(f"state topic {state} was deleted")
        stream.join(120)
        assert stream.error is None and not stream.is_alive()
        assert state not in admin.list_topics(timeout=10).topics  # nothing made it again: not even the broker

        # Stalled, not duplicating: each destination partition is a prefix of its source partition.
        src = _values(read_all(source_cluster.bootstrap_servers, topic))
        copied = _values(read_all(dst, f"src.{topic}"))
        assert sum(map(len, copied.values())) < _PARTITIONS * _PER_PARTITION
        for p, values in copied.items():
            assert values == src[p][: len(values)], f"partition {p}: not a prefix of the source"
        for proc in (f.wrapper, f.deduper):
            assert proc.alive and proc.starts == 1, proc.output()[-4000:]

        # What the message says to do: stop the dedupers, delete the destination topics, start them.
        assert f.deduper.terminate() == 0
        admin.delete_topics([f"src.{topic}"])[f"src.{topic}"].result(30)
        wait_until(lambda: f"src.{topic}" not in admin.list_topics(timeout=10).topics, 30, message="copy deleted")
        f.deduper.start()
        expected = _PARTITIONS * _PER_PARTITION
        assert_exact_copy(
            read_all(source_cluster.bootstrap_servers, topic),
            read_all(dst, f"src.{topic}", expected=expected, timeout_s=120),
        )
        assert f.wrapper.alive and f.wrapper.starts == 1
