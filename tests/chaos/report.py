"""The chaos run's report: what was done, what it cost, what the checker found, and the verdict."""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.checker import Tally, TopicResult
from tests.chaos.schedule import target_class

_log = logging.getLogger(__name__)


@dataclass
class FaultRecord:
    """One applied fault and how the flow came through it."""

    fault: dict[str, Any]
    started_s: float
    """Seconds since the run started."""
    recovery_s: float | None = None
    """Seconds from the fault being undone until every loaded destination partition moved on; for a
    fault overlapped by the next (``overlaps_next``), that includes the next fault and its apply."""
    recovered_at_s: float | None = None
    min_rate: float | None = None
    """Lowest destination records/s seen from the fault's start to its recovery (the dip)."""
    detail: str = ""
    held: list[str] = field(default_factory=list)
    """Destination partitions an open transaction held from the fault's start to its recovery (``Progress.held``)."""
    error: str = ""
    """Why the fault counts against the verdict (not applied, no recovery)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Wall seconds the runner spent in each step of this fault (``apply`` holds the fault itself and,
    for a broker fault, the node's restart; ``recovery wait``; ``settle``; and the sub-steps below them,
    e.g. ``broker restart``, ``quiesce: destination caught up``): where a run's time goes."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a step of this fault into ``phases`` (and log it, so a slow step shows as it ends)."""
        began = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - began
            self.phases[name] = round(self.phases.get(name, 0.0) + took, 2)
            _log.info("chaos fault %d: %s took %.1f s", int(self.fault["index"]) + 1, name, took)

    def timings(self) -> str:
        """The phases in one line: ``apply 5.2 s, recovery wait 1.3 s, ...``."""
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())


@dataclass
class Report:
    """Everything the run measured; ``clean`` is the verdict."""

    seed: int
    profile: str
    source_nodes: int
    duration_s: float
    records_sent: int
    records_aborted: int
    faults_by_kind: dict[str, int]
    faults: list[FaultRecord]
    topics: list[TopicResult]
    total: Tally
    baseline_rate: float
    offered_rate: float
    service_starts: dict[str, int]
    services_down_at_end: list[str]
    phases: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the run's steps outside the faults (start-up, final catch-up)."""
    cpu_per_process: float | None = None
    """Each service process's CPU cap in cores (``--cpu-per-process``); None: uncapped."""
    problems: list[str] = field(default_factory=list)
    rates: list[tuple[float, float, float]] = field(default_factory=list)
    """Destination records/s over the run, in steps: (from, to, rate), seconds since the run started. A stall
    shows here even when an overlapping fault or a broker's restart hides it from the recovery times."""
    group_sync: str = ""
    """Where the synced consumer group stands at the destination against the source (``groups``)."""

    @property
    def clean(self) -> bool:
        """The verdict: nothing lost, duplicated, reordered, altered or leaked; every fault recovered."""
        return not self.problems

    @classmethod
    def build(
        cls,
        *,
        seed: int,
        profile: str,
        source_nodes: int,
        duration_s: float,
        records_sent: int,
        records_aborted: int,
        cpu_per_process: float | None = None,
        faults: list[FaultRecord],
        topics: list[TopicResult],
        rates: list[tuple[float, float, float]],
        offered_rate: float,
        service_starts: dict[str, int],
        services_down_at_end: list[str],
        harness_errors: list[str],
        phases: dict[str, float] | None = None,
        group_sync: tuple[str, list[str]] = ("", []),
    ) -> Report:
        """Put the figures together and judge them."""
        total = Tally()
        for t in topics:
            total.add(t.tally)
        values = [r for _, _, r in rates]
        baseline = statistics.median(values) if values else 0.0
        for f in faults:
            end = f.recovered_at_s if f.recovered_at_s is not None else float("inf")
            # Every step that overlaps the fault, from its start to its recovery (same time base: the run's start).
            window = [r for begin, until, r in rates if until > f.started_s and begin <= end]
            f.min_rate = round(min(window), 1) if window else None
        by_kind: Counter[str] = Counter()
        for f in faults:
            kind, target = str(f.fault["kind"]), str(f.fault["target"])
            by_kind[kind] += 1
            by_kind[f"{kind}:{target_class(target)}"] += 1
        problems = [f"{t.role}: {t.tally}" for t in topics if not t.tally.clean]
        problems += [
            f"fault {f.fault['index']} ({f.fault['kind']} {f.fault['target']}): {f.error}" for f in faults if f.error
        ]
        problems += [f"{name} not running at the end" for name in services_down_at_end]
        problems += harness_errors
        problems += group_sync[1]
        return cls(
            seed=seed,
            profile=profile,
            source_nodes=source_nodes,
            duration_s=round(duration_s, 1),
            records_sent=records_sent,
            records_aborted=records_aborted,
            faults_by_kind=dict(sorted(by_kind.items())),
            faults=faults,
            topics=topics,
            total=total,
            baseline_rate=round(baseline, 1),
            offered_rate=offered_rate,
            service_starts=service_starts,
            services_down_at_end=services_down_at_end,
            phases=dict(phases or {}),
            cpu_per_process=cpu_per_process,
            problems=problems,
            group_sync=group_sync[0],
            rates=[(round(b, 1), round(u, 1), round(r, 1)) for b, u, r in rates],
        )

    def to_json(self) -> dict[str, Any]:
        """As plain JSON data."""
        data = asdict(self)
        data["topics"] = [t.to_json() for t in self.topics]
        data["verdict"] = "clean" if self.clean else "FAILED"
        return data

    def summary(self) -> str:
        """A readable summary."""
        # A fault overlapped by the next is measured from its own heal, through the next fault's
        # apply (a broker's JVM restart alone takes 30-60 s here): only the last fault of each
        # overlapping group measures the flow's recovery.
        recoveries = [f.recovery_s for f in self.faults if f.recovery_s is not None and not f.fault["overlaps_next"]]
        overlapped = [f.recovery_s for f in self.faults if f.recovery_s is not None and f.fault["overlaps_next"]]
        lines = [
            f"chaos run: seed {self.seed}, profile {self.profile}, {self.duration_s:.0f} s, "
            f"source {self.source_nodes} node(s), destination 3 nodes, services "
            + ("uncapped" if self.cpu_per_process is None else f"capped at {self.cpu_per_process:g} core each"),
            f"records: {self.records_sent} sent ({self.records_aborted} in aborted transactions), "
            + ", ".join(f"{t.role} {t.source_records}->{t.destination_records}" for t in self.topics),
            "faults: " + ", ".join(f"{k} {v}" for k, v in self.faults_by_kind.items() if ":" not in k),
            "         " + ", ".join(f"{k} {v}" for k, v in self.faults_by_kind.items() if ":" in k),
            f"recovery: median {statistics.median(recoveries) if recoveries else 0:.1f} s, "
            f"max {max(recoveries, default=0):.1f} s over {len(recoveries)} faults or overlapping groups, "
            f"from the last heal (the {len(overlapped)} overlapped faults, from their own heal: "
            f"max {max(overlapped, default=0):.1f} s); destination rate "
            f"{self.baseline_rate:.0f}/s median (offered {self.offered_rate:.0f}/s)",
            f"anomalies: {self.total}",
            *([self.group_sync] if self.group_sync else []),
            "",
            f"{'#':>3} {'at s':>6} {'kind':<15} {'target':<14} {'held s':>6} {'recovery s':>10} {'min rate':>8}",
        ]
        for f in self.faults:
            rec = "-" if f.recovery_s is None else f"{f.recovery_s:.1f}"
            rate = "-" if f.min_rate is None else f"{f.min_rate:.0f}"
            lines.append(
                f"{f.fault['index']:>3} {f.started_s:>6.1f} {f.fault['kind']:<15} {f.fault['target']:<14} "
                f"{f.fault['duration_s']:>6.1f} {rec:>10} {rate:>8} {f.detail}{' ERROR: ' + f.error if f.error else ''}"
            )
            lines.append(f"{'':>11}time: {f.timings()}")
            if f.held:
                lines.append(f"{'':>11}held: {', '.join(f.held)}")
        lines.append("")
        lines.append("run steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()))
        lines.append(f"verdict: {'clean' if self.clean else 'FAILED'}")
        lines.extend(f"  - {p}" for p in self.problems)
        for t in self.topics:
            lines.extend(f"    {e}" for e in t.examples)
        return "\n".join(lines)

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``chaos-report.json`` and ``chaos-report.txt`` to directory; return both paths."""
        directory.mkdir(parents=True, exist_ok=True)
        js, txt = directory / "chaos-report.json", directory / "chaos-report.txt"
        js.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        txt.write_text(self.summary() + "\n")
        return js, txt
