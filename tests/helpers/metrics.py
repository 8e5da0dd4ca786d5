"""Sample status snapshots for the metrics collectors, and the metric names they and PromQL refer to."""

from __future__ import annotations

import re

from ferryman.metrics.collectors import DeduperCollector, WrapperCollector, service_registry
from ferryman.v1 import control_pb2
from prometheus_client.registry import Collector

#: A metric name in a PromQL expression: an identifier not followed by "(" (a function) and not a label
#: name inside braces or after by/without/on/ignoring (those are removed first, see metric_names_in).
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_DURATIONS = re.compile(r"\[[^\]]*\]")
#: Numbers and durations (``offset 5m``), which the identifier pattern would read a unit of as a name.
_NUMBERS = re.compile(r"(?<![a-zA-Z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?(?![a-zA-Z0-9_:])")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "inf"}
)


def deduper_status(**overrides: object) -> control_pb2.GetDeduperStatusResponse:
    """A deduper status with every field set (two owned partitions, one with unknown lag)."""
    fields: dict[str, object] = {
        "deduper_id": "d1",
        "flow": "orders",
        "records_written": 1000,
        "duplicates_dropped": 7,
        "gaps_detected": 2,
        "gaps_healed": 1,
        "transactions_committed": 40,
        "transactions_aborted": 3,
        "partitions": [
            control_pb2.PartitionWatermark(topic="t", partition=0, watermark=499, lag=25),
            control_pb2.PartitionWatermark(topic="t", partition=1, watermark=-1, lag=-1),
        ],
        "connected_wrappers": ["w1", "w2"],
        "commit_p50_ms": 30.0,
        "commit_max_ms": 120.0,
        "commit_flush_p50_ms": 5.0,
        "commit_seconds_total": 1.6,
        "commit_flush_seconds_total": 0.2,
        "unavailable_reason": "",
        "producer_rebuilds": 1,
        "wedged_calls": 1,
        "group_offset_syncs": {"committed": 3, "active": 1},
        "refused_record": control_pb2.RefusedRecord(topic="src.t", partition=0, error="INVALID_RECORD"),
        "audit_verdicts": [
            control_pb2.AuditVerdict(
                topic="t", partition=0, verdict="VIOLATED", run_id="r1", finished_at_ms=1_700_000_000_000, missing=1
            )
        ],
    }
    fields.update(overrides)
    return control_pb2.GetDeduperStatusResponse(**fields)  # type: ignore[arg-type]


def wrapper_status(**overrides: object) -> control_pb2.GetWrapperStatusResponse:
    """A wrapper status with every field set (two partitions, one whose log end is unknown)."""
    fields: dict[str, object] = {
        "wrapper_id": "w1",
        "flow": "orders",
        "records_sent": 1200,
        "envelopes_sent": 12,
        "rewinds": 1,
        "paused": True,
        "pause_reason": "staging is 300000 envelopes ahead",
        "control_connected": True,
        "partitions": [
            control_pb2.PartitionProgress(topic="t", partition=0, log_end_offset=600, last_wrapped_offset=599),
            control_pb2.PartitionProgress(topic="t", partition=1, log_end_offset=-1, last_wrapped_offset=-1),
        ],
        "resends_served": 2,
        "watermarks": [control_pb2.PartitionWatermark(topic="t", partition=0, watermark=499, lag=100)],
        "unavailable_reason": "",
        "producer_rebuilds": 1,
        "held_partitions": [control_pb2.HeldPartition(topic="t", partition=1, offset=42, envelope_bytes=9 << 20)],
    }
    fields.update(overrides)
    return control_pb2.GetWrapperStatusResponse(**fields)  # type: ignore[arg-type]


def sample_names(collector: Collector) -> set[str]:
    """Every sample name one collect() yields (``*_total``, ``*_sum``, ``*_count``, ``*_info`` included)."""
    return {sample.name for family in collector.collect() for sample in family.samples}


def exported_metric_names() -> set[str]:
    """Every series name the two services export: their collectors and the process collectors beside them."""
    registries = [
        service_registry(DeduperCollector(deduper_status)),
        service_registry(WrapperCollector(wrapper_status, control_link=True)),
    ]
    return set().union(*(sample_names(r) for r in registries))


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and durations left out)."""
    text = _STRINGS.sub('""', expr)
    text = _LABEL_LISTS.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _DURATIONS.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _KEYWORDS:
            continue  # a function or an aggregation, not a series
        names.add(match.group())
    return names
