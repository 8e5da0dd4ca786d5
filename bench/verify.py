"""Read destination topics back (read_committed) and check them against what the source holds.

Two readers share one ``Tally``:

* ``LiveWatcher`` follows the destination while a replicator runs and time-stamps
  when records become visible (first, last, and per record for latency);
* ``audit`` reads topics from the beginning to their end once the replicator has
  stopped, so late duplicates count too. Its tally is the verdict of a row.

Both read the copies of one or several source topics through one consumer. The
records say which source partition they come from, numbered across the topics
(``bench.records``), so one tally covers them all.
"""

from __future__ import annotations

import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, groupby

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)
from ferryman.client_config import STREAMING_CONSUMER_DEFAULTS
from ferryman.topics import watermark_offsets

from bench.readcols import NO_LATENCY, NO_OTHER_TYPE, WHY_NOT, Columns, DirectReader, columns_of
from bench.records import SEQ_MODULUS
from bench.topics import describe

#: Longest wait of one read. consume() returns early only when its batch is full, so this
#: bounds how late "visible" can be stamped through it; the compiled reader returns as soon
#: as records are there.
_CONSUME_TIMEOUT_S = 0.01
#: Records fetched per consume() call: one Python/C crossing per batch.
_CONSUME_BATCH = 10_000
#: How often a destination topic's existence is re-checked while a replicator starts.
_TOPIC_PROBE_INTERVAL_S = 0.02
#: Budget of one metadata request.
_METADATA_TIMEOUT_S = 5.0
#: At most this many missing (partition, seq) pairs are kept as examples.
_MISSING_EXAMPLES = 10

#: confluent-kafka's timestamp type codes, by the name Kafka gives them.
_TIMESTAMP_TYPES = {
    TIMESTAMP_NOT_AVAILABLE: "none",
    TIMESTAMP_CREATE_TIME: "CreateTime",
    TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime",
}


def _consumer(bootstrap: str, *, eof: bool, isolation: str = "read_committed") -> Consumer:
    return Consumer(
        {
            # The services' streaming settings (fetch.queue.backoff.ms: a fast reader would
            # otherwise idle for 1 s whenever 100 k records are prefetched).
            **STREAMING_CONSUMER_DEFAULTS,
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",  # assign() only; never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": isolation,
            "enable.partition.eof": eof,
            # The broker answers a fetch as soon as there is data (any amount, unlike the services'
            # streaming consumers), or after 10 ms: visibility is stamped within ~10 ms of the
            # records becoming readable (default 500 ms).
            "fetch.min.bytes": 1,
            "fetch.wait.max.ms": 10,
        }
    )


def _high_watermarks(bootstrap: str, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Each ``(topic, partition)``'s high watermark. A read_committed consumer would answer with
    the last stable offset instead, which lags while commit markers are still being written."""
    probe = _consumer(bootstrap, eof=False, isolation="read_uncommitted")
    try:
        return {(t, p): watermark_offsets(probe, t, p, budget_s=_METADATA_TIMEOUT_S)[1] for t, p in partitions}
    finally:
        probe.close()


@dataclass
class Tally:
    """What a reader saw, checked against the records each source partition holds.

    Attributes:
        counts: records expected per source partition (sequence numbers 0..n-1); with several
            source topics, topic after topic, indexed as the records number their partition
            (``bench.records``: partition p of the i-th topic is ``i * P + p``).
        topics: how many source topics ``counts`` covers, each with ``len(counts) // topics``
            partitions (P).
        unique: distinct expected records seen.
        duplicates: records seen more than once (beyond the first copy).
        misplaced: records on another destination partition than their source partition, or,
            where the reader says which topic they were read from, in another topic's copy.
        disordered: first copies that arrived after a higher sequence number of their partition.
        foreign: records that do not decode or are out of range.
    """

    counts: Sequence[int]
    topics: int = 1
    unique: int = 0
    duplicates: int = 0
    misplaced: int = 0
    disordered: int = 0
    foreign: int = 0
    _seen: bytearray = field(init=False, repr=False)
    _base: list[int] = field(init=False, repr=False)
    _last: list[int] = field(init=False, repr=False)
    _partitions: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.topics < 1 or len(self.counts) % self.topics:
            raise ValueError(f"{len(self.counts)} partition counts cannot be split evenly over {self.topics} topics")
        self._partitions = len(self.counts) // self.topics
        self._base = list(accumulate(self.counts, initial=0))[:-1]
        self._seen = bytearray(sum(self.counts))
        self._last = [-1] * len(self.counts)

    @property
    def expected(self) -> int:
        """Records the source holds."""
        return len(self._seen)

    @property
    def complete(self) -> bool:
        """Every source record was seen at least once."""
        return self.unique == self.expected

    def add(self, msgs: list[Message], topic: int | None = None) -> int:
        """Count a consumed batch (error events are skipped); return how many records it held.

        ``topic``: the index of the source topic whose copy the batch was read from, if the
        reader knows it (see ``add_columns``).
        """
        return self.add_columns(columns_of(msgs), topic)

    def add_columns(self, cols: Columns, topic: int | None = None) -> int:
        """Count a batch read as columns; return how many records it held.

        librdkafka hands out each partition's records in contiguous runs. A run that
        is exactly what a correct replicator writes (its own partition's next records,
        in order, none seen before) is counted at once (``_add_run``); any other run
        is looked at record by record (``_add_each``), with the same result.

        ``topic``: the index of the source topic whose copy every record of the batch was
        read from; a record of another topic's is then misplaced. None: unknown (a reader of
        several topics through one queue), and only the partition is checked.
        """
        headers = cols.headers
        for partition, start, stop, consecutive in cols.runs:
            if not (consecutive and self._add_run(partition, topic, headers[start], stop - start)):
                self._add_each(partition, topic, headers[start:stop])
        return len(headers)

    def _add_run(self, partition: int, topic: int | None, first: int, k: int) -> bool:
        """Count headers ``first..first+k-1`` found on ``partition`` if they are records ``seq..seq+k-1``
        of that partition, all new, after any seen there; otherwise count nothing and return False."""
        p, seq = divmod(first, SEQ_MODULUS)
        if not 0 <= p < len(self.counts) or seq <= self._last[p] or seq + k > self.counts[p]:
            return False
        t, q = divmod(p, self._partitions)
        if q != partition or (topic is not None and t != topic):
            return False
        i = self._base[p] + seq
        if self._seen.find(1, i, i + k) >= 0:
            return False
        self._seen[i : i + k] = b"\x01" * k
        self.unique += k
        self._last[p] = seq + k - 1
        return True

    def _add_each(self, partition: int, topic: int | None, headers: Iterable[int]) -> None:
        """Count the records with these headers, found on ``partition`` (of ``topic``'s copy), one by one."""
        seen, base, counts, last, partitions = self._seen, self._base, self.counts, self._last, self._partitions
        for header in headers:
            p, seq = divmod(header, SEQ_MODULUS)
            if header < 0 or p >= len(counts) or seq >= counts[p]:
                self.foreign += 1
                continue
            i = base[p] + seq
            if seen[i]:
                self.duplicates += 1
                continue
            seen[i] = 1
            self.unique += 1
            if seq < last[p]:
                self.disordered += 1
            else:
                last[p] = seq
            t, q = divmod(p, partitions)
            if partition != q or (topic is not None and t != topic):
                self.misplaced += 1

    def missing_examples(self) -> list[tuple[int, int]]:
        """A few ``(partition, seq)`` never seen (partitions numbered across the topics, as ``counts``)."""
        out: list[tuple[int, int]] = []
        start = 0
        while len(out) < _MISSING_EXAMPLES:
            i = self._seen.find(0, start)
            if i < 0:
                break
            p = max(q for q, b in enumerate(self._base) if b <= i and self.counts[q] > 0)
            out.append((p, i - self._base[p]))
            start = i + 1
        return out


def _wait_for_topic(consumer: Consumer, topic: str, partitions: int, stop: threading.Event, deadline: float) -> bool:
    """Poll metadata until ``topic`` exists with ``partitions`` partitions (the replicator creates it)."""
    while not stop.is_set() and time.monotonic() < deadline:
        md = consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) >= partitions:
            return True
        stop.wait(_TOPIC_PROBE_INTERVAL_S)
    return False


class LiveWatcher:
    """Follows destination topics on a thread while a replicator runs.

    Stamps (``time.monotonic()``) every batch that brought new records (``timeline``:
    time and records visible so far) and, with ``latency`` set, for every record
    the wall-clock visible time minus its timestamp: the source broker's append
    time, on this same machine. A replicator keeps it as the copy's timestamp
    (CreateTime at the destination); a record whose timestamp type is not the one
    ``latency`` names was stamped somewhere else, so its latency would measure
    something else: the watcher stops with an error.

    All the topics are read through one consumer, which does not say which topic
    a record was read from: the tally checks each record's partition, not its topic
    (``audit`` checks both).

    Args:
        bootstrap: destination cluster.
        topics: destination topics, the copies of the source topics in their order
            (created by the replicator; waited for).
        counts: records per source partition, topic after topic (``Tally``).
        deadline: ``time.monotonic()`` after which the watcher gives up.
        latency: collect per-record latencies from records whose timestamp type
            (``confluent_kafka.TIMESTAMP_*``) is this one; None: no latencies.
        on_first: called on the watcher thread when the first records are visible.
        direct: read through the compiled reader (``bench.readcols.DirectReader``)
            when it is available; False, or where it is not: ``consume()``. The
            reader shares the machine with what it measures, and reading directly
            costs it a fraction of the CPU.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        counts: Sequence[int],
        deadline: float,
        *,
        latency: int | None = None,
        on_first: Callable[[], None] | None = None,
        direct: bool = True,
    ) -> None:
        self.tally = Tally(counts, len(topics))
        #: Whether the records are read through the compiled reader.
        self.direct = direct and WHY_NOT is None
        self.first_visible: float | None = None
        self.first_batch_records = 0
        self.timeline: list[tuple[float, int]] = []
        self.last_visible: float | None = None
        self.last_progress = time.monotonic()
        self.latencies_ms = array("d")
        self.error: str | None = None
        self.done = threading.Event()
        self._bootstrap, self._topics, self._deadline = bootstrap, tuple(topics), deadline
        self._name = describe(topics)  # for messages
        self._latency, self._on_first = latency, on_first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{topics[0]}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        consumer = _consumer(self._bootstrap, eof=False)
        reader: DirectReader | None = None
        try:
            parts = len(self.tally.counts) // len(self._topics)
            for topic in self._topics:
                if not _wait_for_topic(consumer, topic, parts, self._stop, self._deadline):
                    self.error = f"destination topic {topic} did not appear"
                    return
            if self.direct:
                reader = DirectReader(consumer)
                for topic in self._topics:
                    reader.attach(topic, range(parts))  # before assign(): librdkafka keeps the forward
            consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in self._topics for p in range(parts)])
            tally, lat = self.tally, self.latencies_ms
            latency_type = NO_LATENCY if self._latency is None else self._latency
            while not self._stop.is_set() and not tally.complete and time.monotonic() < self._deadline:
                if reader is not None:
                    cols = reader.read(_CONSUME_BATCH, _CONSUME_TIMEOUT_S, latency_type, lat)
                else:
                    cols = columns_of(consumer.consume(_CONSUME_BATCH, _CONSUME_TIMEOUT_S), latency_type, lat)
                if cols.other_type != NO_OTHER_TYPE:
                    found = cols.other_type
                    self.error = (
                        f"{self._name}: a record's timestamp is {_TIMESTAMP_TYPES.get(found, found)}, expected "
                        f"{_TIMESTAMP_TYPES.get(latency_type, latency_type)}: it is not the source broker's "
                        "append time, so its latency would measure something else"
                    )
                    return
                if not cols.headers:
                    continue
                now = time.monotonic()
                before = tally.unique
                tally.add_columns(cols)
                self.last_visible = self.last_progress = now
                self.timeline.append((now, tally.unique))
                if self.first_visible is None:
                    self.first_visible = now
                    self.first_batch_records = tally.unique - before
                    if self._on_first is not None:
                        self._on_first()
        except Exception as exc:  # reported with the row, not raised on a thread nobody joins
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if reader is not None:
                reader.close()  # the reader first, then the consumer
            else:
                consumer.close()
            self.done.set()

    def stop(self, budget_s: float) -> None:
        """Stop following and wait (up to budget_s) for the thread to close its consumer."""
        self._stop.set()
        self._thread.join(budget_s)


@dataclass(frozen=True)
class Audit:
    """A full read of topics after their replicator stopped."""

    tally: Tally
    read_to_end: bool
    seconds: float
    error: str | None = None


#: The topic a consumed message was read from.
_topic_of: Callable[[Message], str | None] = Message.topic


def audit(bootstrap: str, topics: Sequence[str], counts: Sequence[int], budget_s: float) -> Audit:
    """Read ``topics`` read_committed from the beginning to the end of every partition.

    Unlike ``LiveWatcher``, it knows which topic each record was read from: a record
    of one source topic found in another's copy counts as misplaced.

    Args:
        bootstrap: cluster holding the topics.
        topics: the topics, the copies of the source topics in their order.
        counts: records expected per source partition, topic after topic (``Tally``).
        budget_s: time allowed for the whole read.

    Returns:
        The tally; ``read_to_end`` is False if the budget ran out first (e.g. an open
        transaction holds the last stable offset back).
    """
    tally = Tally(counts, len(topics))
    index = {t: i for i, t in enumerate(topics)}
    start = time.monotonic()
    deadline = start + budget_s
    consumer = _consumer(bootstrap, eof=True)
    try:
        pending: set[tuple[str, int]] = set()
        for topic in topics:
            md = consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
            if md is None or md.error is not None:
                return Audit(tally, False, time.monotonic() - start, f"topic {topic} does not exist")
            pending.update((topic, p) for p in md.partitions)
        # commit_transaction() returns before the coordinator has written the commit
        # markers, so right after a commit a partition's read_committed end (its last
        # stable offset) can still lag its records: an end-of-partition only counts
        # once it is at or past the high watermark seen when the read began.
        ends = _high_watermarks(bootstrap, pending)
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in pending])
        while pending and time.monotonic() < deadline:
            msgs = consumer.consume(_CONSUME_BATCH, _CONSUME_TIMEOUT_S)
            # One count per stretch of one topic's records: few, librdkafka hands them out partition by partition.
            added = sum(tally.add(list(run), index.get(t or "")) for t, run in groupby(msgs, _topic_of))
            if added == len(msgs):
                continue
            for m in msgs:  # the batch holds events too: end-of-partition or errors
                err = m.error()
                if err is None:
                    continue
                if err.code() != KafkaError._PARTITION_EOF:
                    return Audit(tally, False, time.monotonic() - start, str(err))
                at = (m.topic() or "", m.partition() or 0)
                if (m.offset() or 0) >= ends[at]:
                    pending.discard(at)
        return Audit(tally, not pending, time.monotonic() - start)
    finally:
        consumer.close()
