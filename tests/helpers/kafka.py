"""Kafka helpers for tests: create topics, produce known sequences, read everything back, compare exactly.

Exactly-once is asserted the way Kafka's own system tests do it: known
sequences per partition in (``produce_sequences``), everything read back with
``read_committed`` (``read_all``), then no record missing, none duplicated,
order kept (``assert_exact_copy`` / ``assert_sequences``).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from ferryman.topics import watermark_offsets

T = TypeVar("T")
Isolation = Literal["read_committed", "read_uncommitted"]

# Re-check interval while waiting for a condition: short enough not to slow tests, long
# enough not to flood a broker on 2 cores with metadata requests.
_POLL_INTERVAL_S = 0.2
# consume() returns early only when its batch is full, so it always blocks this long otherwise:
# short, so that reading a small topic takes a fraction of a second.
_CONSUME_BLOCK_S = 0.05
#: How long a read_committed read follows a transaction still being completed at its end.
_MARKERS_SETTLE_S = 1.0
_MARKERS_POLL_S = 0.02


class KafkaCluster(Protocol):
    """What tests may rely on from the ``source_cluster`` / ``destination_cluster`` fixtures."""

    @property
    def name(self) -> str:
        """Label of the cluster."""
        ...

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` list for ``bootstrap.servers``."""
        ...

    @property
    def cluster_id(self) -> str:
        """The cluster id the brokers report."""
        ...


@dataclass(frozen=True)
class ExternalCluster:
    """A cluster the test run did not start (``FERRYMAN_TEST_*_BOOTSTRAP``): cannot be restarted or killed."""

    name: str
    bootstrap_servers: str
    cluster_id: str


@dataclass(frozen=True)
class ConsumedRecord:
    """One record as read back: everything byte-faithful replication must preserve, plus where it was."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int
    timestamp_type: int
    """``confluent_kafka.TIMESTAMP_CREATE_TIME`` or ``TIMESTAMP_LOG_APPEND_TIME``."""

    def content(self) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]:
        """What must be equal between a source record and its copy (offsets differ by design)."""
        return (self.key, self.value, self.headers, self.timestamp_ms)


def unique_name(test_name: str, prefix: str) -> str:
    """A topic, group or flow name unique to one call: ``prefix-<test name>-<random>``.

    Only characters legal in topic names are kept (``[A-Za-z0-9._-]``), and the
    test part is cut to 60 characters (topic names may be 249 long, and
    Ferryman adds its own prefixes).
    """
    test = re.sub(r"[^A-Za-z0-9._-]+", "-", test_name).strip("-.")[-60:].strip("-.")
    return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}" if test else f"{prefix}-{uuid.uuid4().hex[:8]}"


def recent_create_time_ms() -> int:
    """A create time for records a test sets explicitly: an hour ago.

    The local clusters check retention every second and keep 7 days by default, and
    time retention judges a segment by its newest create time (the active segment
    included): records dated further back can be deleted between the write and the read.
    """
    return int(time.time() * 1000) - 3_600_000


def wait_until(
    predicate: Callable[[], T], timeout_s: float, interval_s: float = _POLL_INTERVAL_S, message: str = "condition"
) -> T:
    """Call predicate until it returns something truthy, and return that.

    Raises:
        AssertionError: still falsy after timeout_s (``message`` says what was awaited).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message}: not met within {timeout_s:g}s")
        time.sleep(interval_s)


def static_member_config(bootstrap: str, group: str, instance_id: str, **extra: Any) -> dict[str, Any]:
    """A group member configured as the services configure theirs: static (``group.instance.id``),
    cooperative-sticky, read_committed, a 6 s session; ``extra`` adds or overrides settings."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.instance.id": instance_id,
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 6000,
        "isolation.level": "read_committed",
        **extra,
    }


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create a topic (replication factor 1) and wait until metadata shows every partition with a leader.

    Raises:
        KafkaException: the creation failed (for instance, the topic exists).
        AssertionError: the partitions did not all show up within timeout_s.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))], request_timeout=timeout_s)[
        name
    ].result(timeout_s)

    def ready() -> bool:
        topic = admin.list_topics(name, timeout=timeout_s).topics.get(name)
        return (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        )

    wait_until(ready, timeout_s, message=f"topic {name} with {partitions} partitions visible in metadata")


def sequence_value(topic: str, partition: int, index: int, value_size: int = 64) -> bytes:
    """The deterministic value ``produce_sequences`` writes: ``topic:partition:index``, dot-padded to value_size."""
    return f"{topic}:{partition}:{index}".encode().ljust(value_size, b".")


def produce_sequences(
    bootstrap: str,
    topic: str,
    partitions: int | Sequence[int],
    per_partition: int,
    *,
    value_size: int = 64,
    start: int = 0,
    keyed: bool = True,
    transactional: bool = False,
    records_per_transaction: int = 500,
    timeout_s: float = 60.0,
    producer_config: Mapping[str, str | int | float | bool] | None = None,
) -> dict[int, list[bytes]]:
    """Produce known sequences to explicit partitions with an idempotent producer.

    Record ``i`` of partition ``p`` (``start <= i < start + per_partition``) has
    the value ``sequence_value(topic, p, i, value_size)`` and, if keyed, the key
    ``b"p:i"``. Partitions are interleaved, so transactions span all of them.

    Args:
        bootstrap: bootstrap servers.
        topic: an existing topic.
        partitions: a partition count (0..n-1) or the partition numbers.
        per_partition: records per partition.
        value_size: minimum value length in bytes.
        start: first index, to continue a sequence produced earlier.
        keyed: give records keys (else null keys).
        transactional: commit a transaction every records_per_transaction records.
        records_per_transaction: transaction size when transactional.
        timeout_s: budget for the whole call.
        producer_config: extra librdkafka settings.

    Returns:
        The values written, per partition, in order.

    Raises:
        AssertionError: a record was not acknowledged within timeout_s.
        KafkaException: the producer failed.
    """
    parts = list(range(partitions)) if isinstance(partitions, int) else list(partitions)
    deadline = time.monotonic() + timeout_s
    conf: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
        **dict(producer_config or {}),
    }
    if transactional:
        conf["transactional.id"] = f"{topic}-sequences-{uuid.uuid4().hex[:8]}"
    producer = Producer(conf)
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(f"partition {msg.partition()}: {err}")

    if transactional:
        producer.init_transactions(max(1.0, deadline - time.monotonic()))
        producer.begin_transaction()
    produced: dict[int, list[bytes]] = {p: [] for p in parts}
    in_transaction = 0
    for i in range(start, start + per_partition):
        for p in parts:
            value = sequence_value(topic, p, i, value_size)
            key = f"{p}:{i}".encode() if keyed else None
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
            produced[p].append(value)
            in_transaction += 1
            if transactional and in_transaction >= records_per_transaction:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                producer.begin_transaction()
                in_transaction = 0
        producer.poll(0)
    if transactional:
        producer.commit_transaction(max(1.0, deadline - time.monotonic()))
    remaining = producer.flush(max(0.0, deadline - time.monotonic()))
    if remaining:
        raise AssertionError(f"{topic}: {remaining} records not acknowledged within {timeout_s:g}s")
    if errors:
        raise AssertionError(f"{topic}: {len(errors)} records failed, first: {errors[0]}")
    return produced


def read_all(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout_s: float = 60.0,
    expected: int | None = None,
    client_config: Mapping[str, str] | None = None,
) -> dict[int, list[ConsumedRecord]]:
    """Read every partition of topic from its beginning to its current end.

    The end is each partition's high watermark (``read_uncommitted``) or last
    stable offset (``read_committed``), taken when the read starts. A
    read_committed read that ends below the high watermark (a transaction open,
    or committed with its markers not yet written: ``commit_transaction()``
    returns before they are) follows the stable offset for up to
    ``_MARKERS_SETTLE_S`` more. Partitions are assigned directly: no consumer
    group, nothing committed. A missing topic reads as ``{}``.

    With expected, the read goes on to the moving end (and waits for the topic
    to exist) until at least that many records have been read in total.

    Args:
        bootstrap: bootstrap servers.
        topic: the topic.
        isolation: ``read_committed`` hides aborted and open transactions.
        timeout_s: budget for the whole call.
        expected: minimum total number of records to wait for.
        client_config: more consumer settings (a login on an authenticated cluster).

    Returns:
        Records per partition, in offset order (every partition of the topic is a key).

    Raises:
        AssertionError: the end was not reached, or fewer than expected records
            arrived, within timeout_s (the message gives the counts per partition).
    """
    deadline = time.monotonic() + timeout_s
    reader = _Reader(bootstrap, topic, isolation, client_config)
    try:
        while True:
            reader.read_to_end(deadline)
            if expected is None:
                settle = min(deadline, time.monotonic() + _MARKERS_SETTLE_S)
                while reader.in_doubt() and time.monotonic() < settle:
                    time.sleep(_MARKERS_POLL_S)  # the markers are written by the broker: nothing to wait on
                    reader.read_to_end(deadline)
                return reader.records
            total = reader.total()
            if total >= expected:
                return reader.records
            if time.monotonic() >= deadline:
                counts = {p: len(r) for p, r in sorted(reader.records.items())}
                raise AssertionError(
                    f"{topic}: {total} of {expected} expected records after {timeout_s:g}s (per partition: {counts})"
                )
            time.sleep(_POLL_INTERVAL_S)
    finally:
        reader.close()


class _Reader:
    """Reads a topic incrementally: each round continues where the previous one stopped."""

    def __init__(
        self, bootstrap: str, topic: str, isolation: Isolation, client: Mapping[str, str] | None = None
    ) -> None:
        self.topic = topic
        self.records: dict[int, list[ConsumedRecord]] = {}
        self._client = dict(client or {})
        self._consumer = Consumer(
            {
                **self._client,
                "bootstrap.servers": bootstrap,
                # Required by the client, never used: partitions are assigned, offsets not committed.
                "group.id": f"ferryman-test-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                "auto.offset.reset": "earliest",
                # The broker answers an empty fetch after this long (default 500 ms); the end
                # of a partition is only seen through such an answer, so keep it short.
                "fetch.wait.max.ms": 20,
            }
        )
        self._next: dict[int, int] = {}  # partition -> next offset to read (from EOF or records)
        self._bootstrap, self._isolation = bootstrap, isolation
        # High watermarks, for a read_committed reader to see what is not stable yet (made when first needed).
        self._probe: Consumer | None = None

    def total(self) -> int:
        return sum(len(r) for r in self.records.values())

    def close(self) -> None:
        self._consumer.close()
        if self._probe is not None:
            self._probe.close()

    def in_doubt(self) -> bool:
        """Whether a read_committed read stopped below some partition's high watermark."""
        if self._isolation != "read_committed":
            return False
        if self._probe is None:
            self._probe = Consumer(
                {
                    **self._client,
                    "bootstrap.servers": self._bootstrap,
                    "group.id": f"ferryman-test-probe-{uuid.uuid4().hex[:8]}",
                    "isolation.level": "read_uncommitted",
                }
            )
        for p in self.records:
            stable = self._end(self._consumer, p, 5.0)
            if stable < self._end(self._probe, p, 5.0):
                return True
        return False

    def _end(self, consumer: Consumer, partition: int, budget_s: float) -> int:
        """The partition's end as consumer sees it (high watermark or stable offset)."""
        return watermark_offsets(consumer, self.topic, partition, budget_s=budget_s)[1]

    def read_to_end(self, deadline: float) -> None:
        metadata = self._consumer.list_topics(self.topic, timeout=max(1.0, deadline - time.monotonic()))
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            return
        new = sorted(set(topic.partitions) - set(self.records))
        for p in new:
            self.records[p] = []
            self._next[p] = 0
        if new:
            self._consumer.incremental_assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in new])
        ends = {p: self._end(self._consumer, p, max(1.0, deadline - time.monotonic())) for p in self.records}
        pending = {p for p, end in ends.items() if self._next[p] < end}
        while pending:
            if time.monotonic() >= deadline:
                behind = {p: f"{self._next[p]}/{ends[p]}" for p in sorted(pending)}
                raise AssertionError(f"{self.topic}: partitions not read to their end in time (next/end: {behind})")
            for m in self._consumer.consume(num_messages=10000, timeout=_CONSUME_BLOCK_S):
                p, offset = m.partition(), m.offset()
                if p is None or offset is None:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    # At the end, past any control records and aborted data the reader skipped.
                    self._next[p] = max(self._next[p], offset)
                else:
                    ts_type, ts = m.timestamp()
                    self.records[p].append(
                        ConsumedRecord(
                            partition=p,
                            offset=offset,
                            key=m.key(),
                            value=m.value(),
                            headers=_headers(m),
                            timestamp_ms=ts,
                            timestamp_type=ts_type,
                        )
                    )
                    self._next[p] = offset + 1
                if self._next[p] >= ends[p]:
                    pending.discard(p)


def _headers(m: Message) -> tuple[tuple[str, bytes | None], ...]:
    raw = m.headers() or ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs)


def _show(record: ConsumedRecord | None) -> str:
    if record is None:
        return "<none>"
    v = record.value
    shown = None if v is None else v[:48] + (b"..." if len(v) > 48 else b"")
    return (
        f"(offset {record.offset}, key={record.key!r}, value={shown!r}, "
        f"headers={record.headers}, ts={record.timestamp_ms})"
    )


def assert_exact_copy(
    source: Mapping[int, Sequence[ConsumedRecord]], dest: Mapping[int, Sequence[ConsumedRecord]]
) -> None:
    """Assert dest is a byte-faithful copy of source, partition by partition.

    Per partition: same number of records, none missing, none duplicated, same
    order, equal key, value, headers (order, duplicates and null values
    included) and timestamp. Offsets are not compared: they differ by design
    (compacted sources have gaps, transactional destinations have markers).

    Raises:
        AssertionError: the first partition that differs, with counts of missing,
            duplicated and unexpected records, and the first differing index.
    """
    for p in sorted(set(source) | set(dest)):
        src = list(source.get(p, ()))
        dst = list(dest.get(p, ()))
        src_content = [r.content() for r in src]
        dst_content = [r.content() for r in dst]
        if src_content == dst_content:
            continue
        src_count, dst_count = Counter(src_content), Counter(dst_content)
        missing = sum((src_count - dst_count).values())
        surplus = dst_count - src_count
        duplicated = sum(n for c, n in surplus.items() if c in src_count)
        unexpected = sum(n for c, n in surplus.items() if c not in src_count)
        first = next(
            (i for i, (a, b) in enumerate(zip(src_content, dst_content, strict=False)) if a != b),
            min(len(src), len(dst)),
        )
        kind = "reordered" if src_count == dst_count else "differs"
        raise AssertionError(
            f"partition {p} {kind}: source {len(src)} records, destination {len(dst)} "
            f"({missing} missing, {duplicated} duplicated, {unexpected} unexpected); "
            f"first difference at index {first}: source {_show(src[first] if first < len(src) else None)}, "
            f"destination {_show(dst[first] if first < len(dst) else None)}"
        )


def assert_sequences(records: Mapping[int, Sequence[ConsumedRecord]], expected: Mapping[int, Sequence[bytes]]) -> None:
    """Assert records hold exactly the expected values per partition: none missing, none duplicated, in order.

    Use with ``produce_sequences``'s return value (values only; keys, headers and
    timestamps are ``assert_exact_copy``'s business).

    Raises:
        AssertionError: the first partition that differs, with missing and duplicate counts.
    """
    for p in sorted(set(records) | set(expected)):
        got = [r.value for r in records.get(p, ())]
        want: list[bytes | None] = list(expected.get(p, ()))
        if got == want:
            continue
        got_count, want_count = Counter(got), Counter(want)
        missing = sum((want_count - got_count).values())
        surplus = got_count - want_count
        duplicated = sum(n for v, n in surplus.items() if v in want_count)
        unexpected = sum(n for v, n in surplus.items() if v not in want_count)
        first = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
        raise AssertionError(
            f"partition {p}: expected {len(want)} values, got {len(got)} ({missing} missing, {duplicated} duplicated, "
            f"{unexpected} unexpected); first difference at index {first}: expected "
            f"{want[first] if first < len(want) else '<none>'!r}, got {got[first] if first < len(got) else '<none>'!r}"
        )
