"""Audit reports: per source partition and for the whole run, as JSON and as Parquet."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ferryman_auditor._align import Counts, Outcome
from ferryman_auditor._plan import PartitionPlan

EXACTLY_ONCE = "EXACTLY_ONCE"
VIOLATED = "VIOLATED"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionReport:
    """What the audit found in one source partition (the content alignment's counts)."""

    topic: str
    partition: int
    destination_topic: str
    expected: int
    """Committed source records in the range (aborted transactions are not expected)."""
    found: int
    """Expected records whose copy is at the destination, intact."""
    missing: int
    duplicated: int
    reordered: int
    """Fewest records that must move to restore the source order."""
    altered: int
    """Copies whose key, value, headers, timestamp or timestamp type differ."""
    unexpected: int
    """Destination records that copy no source record of the range."""
    unverifiable: int
    """Destination records whose source records retention or compaction removed (not faults)."""
    unverifiable_ranges: list[list[int]]
    """Source offset ranges ``[from, to)`` removed at the source before they could be checked."""
    source_range: list[int]
    destination_range: list[int]
    offset_map: dict[str, int] | None
    """The offset-map alignment's counts, or None when the partition has no mappings."""
    alignments_agree: bool
    """False when the two alignments disagree on any fault: itself a finding."""
    samples: dict[str, list[int]] = field(default_factory=dict)
    """A few offsets of each fault (source offsets for missing/altered, destination otherwise)."""

    @property
    def verdict(self) -> str:
        """EXACTLY_ONCE when no fault was found by either alignment and they agree."""
        clean = not any((self.missing, self.duplicated, self.reordered, self.altered, self.unexpected))
        return EXACTLY_ONCE if clean and self.alignments_agree else VIOLATED

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (with the partition's verdict)."""
        return {**asdict(self), "verdict": self.verdict}

    @classmethod
    def of(cls, plan: PartitionPlan, outcome: Outcome) -> PartitionReport:
        """The report of one planned partition."""
        c = outcome.content
        unverifiable = plan.unverifiable_range
        return cls(
            topic=plan.topic,
            partition=plan.partition,
            destination_topic=plan.destination_topic,
            expected=c.found + c.missing + c.altered,
            found=c.found,
            missing=c.missing,
            duplicated=c.duplicated,
            reordered=c.reordered,
            altered=c.altered,
            unexpected=c.unexpected,
            unverifiable=max(c.unverifiable, outcome.by_map.unverifiable if outcome.by_map else 0),
            unverifiable_ranges=[list(unverifiable)] if unverifiable else [],
            source_range=[plan.range_start, plan.range_end],
            destination_range=[plan.destination_start, plan.destination_end],
            offset_map=outcome.by_map.as_dict() if outcome.by_map else None,
            alignments_agree=_agree(c, outcome.by_map),
            samples=outcome.samples,
        )


def _agree(content: Counts, by_map: Counts | None) -> bool:
    return by_map is None or content.faults() == by_map.faults()


@dataclass(frozen=True)
class AuditReport:
    """One audit run."""

    run_id: str
    flow: str
    started_at_ms: int
    finished_at_ms: int
    range: dict[str, object]
    partitions: list[PartitionReport]

    @property
    def verdict(self) -> str:
        """EXACTLY_ONCE when every partition's verdict is."""
        return EXACTLY_ONCE if all(p.verdict == EXACTLY_ONCE for p in self.partitions) else VIOLATED

    def totals(self) -> dict[str, int]:
        """Sums over the partitions."""
        keys = ("expected", "found", "missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")
        return {k: sum(getattr(p, k) for p in self.partitions) for k in keys}

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``ferryman audit run --output json``)."""
        return {
            "run_id": self.run_id,
            "flow": self.flow,
            "verdict": self.verdict,
            "started_at_ms": self.started_at_ms,
            "finished_at_ms": self.finished_at_ms,
            "range": self.range,
            "totals": self.totals(),
            "partitions": [p.as_dict() for p in self.partitions],
        }

    def to_json(self) -> str:
        """The JSON text of as_dict."""
        return json.dumps(self.as_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditReport:
        """Read back as_dict's form (from the audit topic)."""
        names = PartitionReport.__dataclass_fields__
        parts = [PartitionReport(**{k: v for k, v in p.items() if k in names}) for p in data["partitions"]]
        return cls(
            run_id=data["run_id"],
            flow=data["flow"],
            started_at_ms=data["started_at_ms"],
            finished_at_ms=data["finished_at_ms"],
            range=data["range"],
            partitions=parts,
        )


def write_parquet(report: AuditReport, directory: Path) -> Path:
    """Write the report's partitions as one Parquet file ``<directory>/<run_id>.parquet``; return its path."""
    import pyarrow as pa  # noqa: PLC0415 -- the audit extra
    import pyarrow.parquet as pq  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for p in report.partitions:
        row = p.as_dict()
        for nested in ("unverifiable_ranges", "source_range", "destination_range", "offset_map", "samples"):
            row[nested] = json.dumps(row[nested])
        rows.append({"run_id": report.run_id, "flow": report.flow, "finished_at_ms": report.finished_at_ms, **row})
    path = directory / f"{report.run_id}.parquet"
    tmp = path.with_suffix(".parquet.tmp")
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        tmp.replace(path)  # readers never see a half-written report
    except BaseException:
        tmp.unlink(missing_ok=True)  # nor a half-written file left behind
        raise
    return path


def store_parquet(report: AuditReport, directory: Path) -> Path | None:
    """write_parquet for a run already stored: a failure is logged and None returned, not raised.

    The stored run (``audit list``/``show``) holds the verdict, and the exit status follows it: a full disk
    must not turn a violation into a usage error, nor a clean run into a failure.
    """
    try:
        return write_parquet(report, directory)
    except OSError as exc:
        _log.error(
            "audit %s of flow %s is stored, but its Parquet report could not be written to %s: %s",
            report.run_id,
            report.flow,
            directory,
            exc,
        )
        return None


def summary_of(reports: Sequence[AuditReport]) -> list[dict[str, Any]]:
    """One line per run (``ferryman audit list``)."""
    return [
        {
            "run_id": r.run_id,
            "finished_at_ms": r.finished_at_ms,
            "range": r.range.get("kind"),
            "verdict": r.verdict,
            "partitions": len(r.partitions),
            **r.totals(),
        }
        for r in reports
    ]
