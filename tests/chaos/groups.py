"""The chaos run's consumer group: read at the source throughout, synced to the destination by the flow.

A reader group consumes the ``txn`` topic (transaction markers and aborted records make its offsets differ
on either side) and auto-commits through every fault, and the flow syncs it (``SYNC_FLOW``). At the end,
with the reader stopped, the destination group must stand after exactly as many records of each partition
as the source group: a group moved there then reads nothing twice and skips nothing. Counting records on
both sides (read_committed) is the check, since the checker already proves they are the same records in
the same order.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

_log = logging.getLogger(__name__)

GROUP = "chaos-readers"
#: The flow's group-sync settings in a chaos run.
SYNC_FLOW = {"sync_group_offsets": True, "groups": [GROUP], "sync_group_offsets_interval_s": 10.0}
#: How long the destination group may take to reach the source group's position after the reader stops.
SETTLE_BUDGET_S = 90.0


class GroupReader:
    """Reads one source topic as `GROUP`, auto-committing every second (a thread of its own)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 1000,
                "log_level": 3,
            }
        )
        self._consumer.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-group-reader", daemon=True)
        self.read = 0

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def stop(self) -> None:
        """Stop reading; closing commits the final positions."""
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            self._consumer.close()
        except KafkaException as exc:
            _log.warning("chaos: closing the group reader: %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = self._consumer.consume(500, timeout=0.5)
            except KafkaException:
                continue  # a broker restart: the consumer rides it out
            self.read += sum(1 for m in msgs if m.error() is None)


def _committed(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


def records_before(bootstrap: str, topic: str, offsets: dict[int, int], budget_s: float = 120.0) -> dict[int, int]:
    """Per partition, how many records a read_committed reader sees before the offset given."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-group-count",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    counts = dict.fromkeys(offsets, 0)
    open_ = {p for p, o in offsets.items() if o > 0}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(open_)])
        deadline = time.monotonic() + budget_s
        while open_ and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                p = int(msg.partition() or 0)
                if p not in open_:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_.discard(p)
                    continue
                if int(msg.offset() or 0) >= offsets[p]:
                    open_.discard(p)
                else:
                    counts[p] += 1
    finally:
        consumer.close()
    if open_:
        raise AssertionError(f"{topic}: partitions {sorted(open_)} not read to their offsets in {budget_s:g} s")
    return counts


def check_synced(src: str, dst: str, topic: str, dest_topic: str, partitions: int) -> tuple[str, list[str]]:
    """(summary, problems): whether the destination group stands where the source group does, record for record."""
    at_source = _committed(src, topic, partitions)
    if not at_source:
        return "group sync: the reader group committed nothing at the source", ["group sync: no source commits"]
    want = records_before(src, topic, at_source)
    deadline = time.monotonic() + SETTLE_BUDGET_S
    started = time.monotonic()
    got: dict[int, int] = {}
    while True:
        at_destination = _committed(dst, dest_topic, partitions)
        if at_destination.keys() == at_source.keys():
            got = records_before(dst, dest_topic, at_destination)
            if got == want:
                summary = (
                    f"group sync: {GROUP} at the destination after the same records as at the source on "
                    f"{len(want)} partitions ({sum(want.values())} records read), "
                    f"{time.monotonic() - started:.1f} s after the reader stopped"
                )
                return summary, []
        if time.monotonic() >= deadline:
            problem = (
                f"group sync: {GROUP} did not reach the source group's position in {SETTLE_BUDGET_S:g} s: "
                f"records before, source {want}, destination {got or at_destination}"
            )
            return problem, [problem]
        time.sleep(2)
