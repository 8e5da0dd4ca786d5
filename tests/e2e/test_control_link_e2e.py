"""The control link fails while data streams: a cut network path, then a deduper killed with SIGKILL.

Data never depends on the link (GitHub issue #4): while it is down the
destination keeps growing, the wrapper reconnects by itself when it can, and
the destination ends an exact copy of the source.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from ferryman_local import reserve_port

from tests.helpers.grpc_clients import start_linked_pair
from tests.helpers.kafka import KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e

PARTITIONS = 3
#: Records per second over all partitions: enough that "the destination grows" is
#: visible within a second, little enough for a 2-core runner to carry beside two services.
RATE_PER_S = 300
#: How much the destination must grow to count as "data kept flowing".
GROWTH = 300
#: Growth awaited while the link is cut: about 3 s of the stream.
CUT_GROWTH = 3 * RATE_PER_S
START_TIMEOUT_S = 60.0
#: Noticing a reset link is immediate; a reconnect waits at most connect_backoff_max_s (1 s here).
LINK_TIMEOUT_S = 30.0


class SteadyProducer(threading.Thread):
    """Produces ``topic:partition:i`` round-robin over the partitions at RATE_PER_S until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self._topic = topic
        self._stop_event = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            i = 0
            while not self._stop_event.is_set():
                for p in range(PARTITIONS):
                    self._producer.produce(self._topic, value=f"{self._topic}:{p}:{i}".encode(), partition=p)
                self.sent += PARTITIONS
                i += 1
                self._producer.poll(0)
                # Pacing, not synchronisation: keep the stream steady for the whole scenario.
                ahead = self.sent / RATE_PER_S - (time.monotonic() - started)
                if ahead > 0:
                    self._stop_event.wait(ahead)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> int:
        """Stop, flush, and return the number of records acknowledged."""
        self._stop_event.set()
        self.join(30)
        assert self.error is None, self.error
        assert self._producer.flush(30) == 0
        return self.sent


class CommittedCounter:
    """Counts the records a read_committed reader of a topic sees, incrementally."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"ferryman-test-counter-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.total = 0

    def count(self) -> int:
        """Records seen so far (reads what has arrived since the last call)."""
        while batch := self._consumer.consume(num_messages=10_000, timeout=0.05):
            self.total += sum(1 for m in batch if m.error() is None)
        return self.total

    def grows_by(self, n: int) -> Callable[[], bool]:
        """A predicate: the count is n above what it is now."""
        target = self.count() + n
        return lambda: self.count() >= target

    def close(self) -> None:
        self._consumer.close()


def test_link_cut_and_deduper_kill_never_stop_the_data(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("cut")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    dport = reserve_port()
    with TcpProxy("127.0.0.1", dport) as proxy:
        pair = start_linked_pair(
            tmp_path,
            source_cluster,
            destination_cluster,
            flow=unique_name("flow"),
            topics=[topic],
            link_address=proxy.address,
            deduper_port=dport,
        )
        producer = SteadyProducer(source_cluster.bootstrap_servers, topic)
        counter = CommittedCounter(destination_cluster.bootstrap_servers, f"src.{topic}")
        try:
            wait_until(pair.link_up, START_TIMEOUT_S, message="control link up through the proxy")
            producer.start()
            wait_until(counter.grows_by(GROWTH), START_TIMEOUT_S, message="stream flowing end to end")

            # 1. The network path of the link is cut mid-stream.
            proxy.cut()
            wait_until(pair.link_down, LINK_TIMEOUT_S, message="both sides saw the link go")
            pair.wrapper.wait_for_log(f"control link to {proxy.address} lost; the data path goes on without it", 10)
            # The cut lasts as long as the destination takes to grow by CUT_GROWTH (a few seconds at RATE_PER_S).
            cut_at = counter.count()
            wait_until(counter.grows_by(CUT_GROWTH), LINK_TIMEOUT_S, message="destination grew while the link was cut")
            # Still cut while it grew, the wrapper retrying all along: the growth did not wait for the link.
            assert proxy.is_cut
            w = pair.wrapper_status()
            assert w is not None and not w.control_connected and not w.paused
            assert counter.count() >= cut_at + CUT_GROWTH
            assert pair.wrapper.output().count(f"control link to {proxy.address} down") >= 2

            proxy.restore()
            wait_until(pair.link_up, LINK_TIMEOUT_S, message="link back after the path is restored")

            # 2. The deduper dies without a goodbye, and comes back.
            pair.deduper.kill9()
            wait_until(
                lambda: (s := pair.wrapper_status()) is not None and not s.control_connected,
                LINK_TIMEOUT_S,
                message="wrapper noticed the deduper gone",
            )
            pair.deduper.start()
            wait_until(pair.link_up, START_TIMEOUT_S, message="link back by itself after the deduper restart")
            wait_until(counter.grows_by(GROWTH), START_TIMEOUT_S, message="stream flowing after the restart")

            sent = producer.finish()
            src = read_all(source_cluster.bootstrap_servers, topic)
            assert sum(len(r) for r in src.values()) == sent
            dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=sent, timeout_s=90)
            assert_exact_copy(src, dst)

            ups = pair.wrapper.output().count("control link to deduper d1 at")
            assert ups >= 3, f"link came up {ups} times (first connect, after the cut, after the restart)"
            assert pair.wrapper.alive and pair.deduper.alive
            w = pair.wrapper_status()
            assert w is not None and w.rewinds == 0  # the link's trouble never touched the data path
        finally:
            if producer.is_alive():
                producer.finish()
            counter.close()
            pair.stop()
