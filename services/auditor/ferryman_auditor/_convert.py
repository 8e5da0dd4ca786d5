"""The audit API's messages from and to the auditor's own types (ranges, reports), converted once, here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferryman.errors import ConfigError
from ferryman.v1 import audit_pb2

from ferryman_auditor._plan import AuditRange
from ferryman_auditor._report import EXACTLY_ONCE, AuditReport, PartitionReport

_COUNTS = ("expected", "found", "missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")


def range_from_proto(message: audit_pb2.AuditRange) -> AuditRange:
    """The `AuditRange` a request asks for, checked as ``ferryman audit run`` checks its flags.

    Raises:
        ConfigError: a bad range; the message names the field (``range.offsets.end_offsets[0]``).
    """
    topics = tuple(message.topics) or None
    for i, topic in enumerate(message.topics):
        if not topic:
            raise ConfigError(f"range.topics[{i}] is empty")
    kind = message.WhichOneof("kind")
    if kind == "offsets":
        start, end = dict(message.offsets.start_offsets), dict(message.offsets.end_offsets)
        for name, offsets in (("start_offsets", start), ("end_offsets", end)):
            for partition, offset in offsets.items():
                field = f"range.offsets.{name}[{partition}]"
                if partition < 0:
                    raise ConfigError(f"{field}: a partition is not negative")
                if offset < 0:
                    raise ConfigError(f"{field} = {offset}: an offset is not negative")
        for partition, first in start.items():
            if partition in end and end[partition] < first:
                raise ConfigError(
                    f"range.offsets.end_offsets[{partition}] = {end[partition]} is before "
                    f"range.offsets.start_offsets[{partition}] = {first}"
                )
        return AuditRange(kind="offsets", start_offsets=start or None, end_offsets=end or None, topics=topics)
    if kind == "time_window":
        window = message.time_window
        if window.start_ms < 0:
            raise ConfigError(f"range.time_window.start_ms = {window.start_ms} is before the epoch")
        end_ms = window.end_ms if window.HasField("end_ms") else None
        if end_ms is not None and end_ms < window.start_ms:
            raise ConfigError(
                f"range.time_window.end_ms = {end_ms} is before range.time_window.start_ms = {window.start_ms}"
            )
        return AuditRange(kind="time", start_ms=window.start_ms, end_ms=end_ms, topics=topics)
    return AuditRange(topics=topics)


def range_to_proto(described: Mapping[str, object]) -> audit_pb2.AuditRange:
    """A range as reports store it (`AuditRange.describe`) as the API's message."""
    message = audit_pb2.AuditRange(topics=[str(t) for t in _as_list(described.get("topics"))])
    kind = described.get("kind")
    if kind == "offsets":
        for name in ("start_offsets", "end_offsets"):
            offsets = getattr(message.offsets, name)
            for partition, offset in _as_map(described.get(name)).items():
                offsets[int(partition)] = int(offset)
        message.offsets.SetInParent()
    elif kind == "time":
        message.time_window.start_ms = int(_as_int(described.get("start_ms")))
        end_ms = described.get("end_ms")
        if end_ms is not None:
            message.time_window.end_ms = _as_int(end_ms)
        message.time_window.SetInParent()
    return message


def counts(values: Mapping[str, int]) -> audit_pb2.AuditCounts:
    """Counts by name (a report's totals, an alignment's counts) as the API's message."""
    return audit_pb2.AuditCounts(**{k: int(values.get(k, 0)) for k in _COUNTS})


def verdict(name: str) -> audit_pb2.Verdict.ValueType:
    """EXACTLY_ONCE or VIOLATED as the API's enum."""
    return audit_pb2.VERDICT_EXACTLY_ONCE if name == EXACTLY_ONCE else audit_pb2.VERDICT_VIOLATED


def _partition(p: PartitionReport) -> audit_pb2.PartitionAudit:
    message = audit_pb2.PartitionAudit(
        topic=p.topic,
        partition=p.partition,
        destination_topic=p.destination_topic,
        counts=counts({k: getattr(p, k) for k in _COUNTS}),
        unverifiable_ranges=[_span(r) for r in p.unverifiable_ranges],
        source_range=_span(p.source_range),
        destination_range=_span(p.destination_range),
        alignments_agree=p.alignments_agree,
        verdict=verdict(p.verdict),
    )
    if p.offset_map is not None:
        message.offset_map_counts.CopyFrom(counts(p.offset_map))
    return message


def _span(pair: list[int]) -> audit_pb2.OffsetSpan:
    return audit_pb2.OffsetSpan(from_offset=pair[0], to_offset=pair[1]) if len(pair) == 2 else audit_pb2.OffsetSpan()


def run_of_report(report: AuditReport, *, with_partitions: bool = True) -> audit_pb2.AuditRun:
    """A finished (stored) run as the API's message."""
    return audit_pb2.AuditRun(
        run_id=report.run_id,
        flow=report.flow,
        state=audit_pb2.AUDIT_STATE_FINISHED,
        verdict=verdict(report.verdict),
        range=range_to_proto(report.range),
        started_at_ms=report.started_at_ms,
        finished_at_ms=report.finished_at_ms,
        totals=counts(report.totals()),
        partitions=[_partition(p) for p in report.partitions] if with_partitions else [],
        partition_count=len(report.partitions),
    )


def _as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _as_map(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _as_int(value: object) -> int:
    return int(value) if isinstance(value, int | float | str) else 0
