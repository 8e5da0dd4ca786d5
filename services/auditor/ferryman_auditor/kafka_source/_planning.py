"""Driver-side planning: Kafka partitions and offset bounds to input partitions.

A Kafka partition's offsets are sparse (transaction markers, aborted records,
compaction leave holes), so a span ``[start, end)`` says where to read, never
how many records it holds. Splitting is by offsets, and every split is read by
position: an executor stops when its consumer's position reaches the split's
end, whatever lies at the last offsets of the span.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ferryman_auditor.kafka_source._errors import KafkaSourceError
from ferryman_auditor.kafka_source._options import Bound, BoundSpec, SourceOptions


@dataclass(frozen=True)
class OffsetSpan:
    """Offsets ``[start, end)`` of one partition of a topic."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def empty(self) -> bool:
        """True when the span holds no offset."""
        return self.end <= self.start


@dataclass(frozen=True)
class Watermarks:
    """A partition's low watermark (first offset still stored) and its readable end.

    The end is the high watermark for read_uncommitted and the last stable offset
    for read_committed (what the broker answers the consumer's isolation level).
    """

    low: int
    high: int


def split_span(span: OffsetSpan, max_offsets: int) -> list[OffsetSpan]:
    """Cut a span into consecutive spans of at most max_offsets offsets (none for an empty span)."""
    if max_offsets <= 0:
        raise ValueError(f"max_offsets must be positive, got {max_offsets}")
    return [
        OffsetSpan(span.topic, span.partition, lo, min(lo + max_offsets, span.end))
        for lo in range(span.start, span.end, max_offsets)
    ]


def plan_splits(spans: Iterable[OffsetSpan], max_offsets: int) -> list[OffsetSpan]:
    """The input partitions of a read: each non-empty span cut by split_span, in partition then offset order."""
    return [s for span in sorted(spans, key=lambda s: s.partition) for s in split_span(span, max_offsets)]


def resolve_bound(bound: Bound, marks: Watermarks) -> int:
    """An offset bound as an offset within ``[low, high]``.

    An offset below the low watermark is clamped to it (those records are gone);
    one above the end to the end (nothing is readable there yet).
    """
    if bound == "earliest":
        return marks.low
    if bound == "latest":
        return marks.high
    return min(max(bound, marks.low), marks.high)


def resolve_spans(
    topic: str,
    marks: Mapping[int, Watermarks],
    start: BoundSpec,
    end: BoundSpec,
    *,
    start_times: Mapping[int, int] | None = None,
    end_times: Mapping[int, int] | None = None,
) -> list[OffsetSpan]:
    """The span of each partition from its watermarks and the requested bounds.

    ``start_times``/``end_times`` are the offsets Kafka gave for the specs'
    timestamps (-1 for "no record at or after that time": the end). An end before
    the start gives an empty span.
    """

    def offset(spec: BoundSpec, times: Mapping[int, int] | None, p: int) -> int:
        m = marks[p]
        if spec.timestamp_ms is not None:
            found = (times or {}).get(p, -1)
            return m.high if found < 0 else min(max(found, m.low), m.high)
        return resolve_bound(spec.of(p), m)

    spans = []
    for p in sorted(marks):
        lo = offset(start, start_times, p)
        spans.append(OffsetSpan(topic, p, lo, max(lo, offset(end, end_times, p))))
    return spans


def read_plan(consumer: Consumer, options: SourceOptions) -> list[OffsetSpan]:
    """Ask the cluster for what the options select, and return the span of each selected partition.

    Raises:
        KafkaSourceError: the topic or a requested partition does not exist, or the cluster did not answer.
    """
    timeout_s = options.request_timeout_ms / 1000
    try:
        metadata = consumer.list_topics(options.topic, timeout=timeout_s)
        info = metadata.topics.get(options.topic)
        if info is None or info.error is not None:
            raise KafkaSourceError(f"topic {options.topic!r} does not exist ({info.error if info else 'absent'})")
        existing = sorted(info.partitions)
        parts = existing if options.partitions is None else list(options.partitions)
        absent = sorted(set(parts) - set(existing))
        if absent:
            raise KafkaSourceError(f"topic {options.topic!r} has no partition(s) {absent} (it has {len(existing)})")
        marks = {}
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(options.topic, p), timeout=timeout_s)
            marks[p] = Watermarks(low, high)
        start_times = _offsets_for_time(consumer, options.topic, parts, options.start.timestamp_ms, timeout_s)
        end_times = _offsets_for_time(consumer, options.topic, parts, options.end.timestamp_ms, timeout_s)
    except KafkaException as exc:
        raise KafkaSourceError(f"planning the read of {options.topic!r}: {exc}") from exc
    return resolve_spans(options.topic, marks, options.start, options.end, start_times=start_times, end_times=end_times)


def _offsets_for_time(
    consumer: Consumer, topic: str, parts: Sequence[int], timestamp_ms: int | None, timeout_s: float
) -> dict[int, int] | None:
    """The first offset at or after timestamp_ms per partition (-1: none), or None without a timestamp."""
    if timestamp_ms is None:
        return None
    found = consumer.offsets_for_times([TopicPartition(topic, p, timestamp_ms) for p in parts], timeout=timeout_s)
    return {tp.partition: tp.offset for tp in found}
