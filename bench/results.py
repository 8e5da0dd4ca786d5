"""The figures of a run, as plain data (printed by ``bench.report``, dumped as JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from bench.crossing import CrossTraffic, Placement
from bench.latency import LatencyResult

Status = Literal["ok", "FAILED", "unavailable"]
#: A steady window shorter than this share of launch-to-last-record says little about the
#: replicator: most of the copy happened before anything was visible.
SHORT_WINDOW_SHARE = 0.2


@dataclass(frozen=True)
class Throughput:
    """Copying the preloaded topics, timed by a read_committed reader of the destination.

    "Steady" runs from the first record visible to the last (the records read in the
    same batch as the first are not counted: they became visible before the window).
    "From start" runs from the launch of the row's processes to the last record
    visible. A replicator that holds records back and commits them in a few large
    transactions has a short, flattering steady window: read both, and the timeline.
    """

    records: int
    payload_bytes: int
    first_batch_records: int
    """Records read in the same batch as the first one (not counted in "steady")."""
    first_visible_s: float | None
    """Seconds from launch to the first visible record (start-up, discovery, first commit)."""
    steady_s: float | None
    from_start_s: float | None
    steady_rps: float | None
    steady_mbps: float | None
    from_start_rps: float | None
    from_start_mbps: float | None
    cpu_s: float
    """CPU seconds (user + system) of the row's process trees, launch to last record visible."""
    cpu_s_per_m: float | None
    """``cpu_s`` per million records: includes start-up (a JVM's boot and JIT)."""
    steady_cpu_s_per_m: float | None
    """CPU seconds per million records over the steady window only."""
    broker_cpu_s_per_m: float | None
    """CPU of both brokers per million records, launch to last visible (local clusters only)."""
    peak_rss_mb: float
    """Peak of the summed RSS of the row's processes, sampled every 0.2 s, until they stopped."""

    @property
    def short_window(self) -> bool:
        """The steady window is too short a part of the run to be the replicator's rate."""
        if self.steady_s is None or self.from_start_s is None:
            return False
        return self.steady_s < SHORT_WINDOW_SHARE * self.from_start_s

    timeline: list[tuple[float, int]]
    """``(seconds since launch, records visible)``, thinned to at most 200 points: shows
    whether records became visible steadily or in lumps (large transactions)."""
    cpu_s_by_program: Mapping[str, float] = field(default_factory=dict)
    """``cpu_s`` split by the program each process tree was launched as (for Ferryman:
    ``ferryman-wrapper`` and ``ferryman-deduper``, each summed over its processes)."""
    kernel_cpu_s_per_m: float | None = None
    """The part of ``cpu_s_per_m`` spent in the kernel (system time)."""
    kernel_cpu_s_by_program: Mapping[str, float] = field(default_factory=dict)
    """The kernel's part of ``cpu_s_by_program``, program by program."""
    minor_faults_by_program: Mapping[str, int] = field(default_factory=dict)
    """Minor page faults of each program's processes: first touches of fresh pages,
    each one zero-filled by the kernel (a deduper that touches more new memory
    in one round than in another shows here and in its kernel time)."""
    peak_rss_mb_by_program: Mapping[str, float] = field(default_factory=dict)
    """Each program's peak RSS (its processes' trees; several processes of one program: their peaks summed)."""
    broker_kernel_cpu_s_per_m: float | None = None
    """The part of ``broker_cpu_s_per_m`` spent in the kernel: a round that is slow for no
    reason of the row's own often shows here (page-cache work in the destination broker)."""
    cross_cluster: CrossTraffic | None = None
    """What crossed between the clusters' regions from launch to the last record visible, the row
    placed as it is usually deployed (``bench.crossing``); None where ``ss`` is missing."""


@dataclass(frozen=True)
class Verdict:
    """The full read of the destination topics after the row stopped."""

    expected: int
    unique: int
    duplicates: int
    misplaced: int
    disordered: int
    foreign: int
    read_to_end: bool
    missing_examples: list[tuple[int, int]]
    """A few ``(partition, seq)`` missing; with several source topics, partitions are numbered across
    them (``bench.records``: partition p of the i-th topic is ``i * partitions + p``)."""

    @property
    def complete(self) -> bool:
        """Every source record is present."""
        return self.unique == self.expected


@dataclass
class RowResult:
    """Everything measured for one row."""

    row: str
    exactly_once: bool
    status: Status = "ok"
    reasons: list[str] = field(default_factory=list)
    settings: Mapping[str, object] = field(default_factory=dict)
    placement: Placement | None = None
    """Which cluster each of the row's programs runs next to, for its ``cross_cluster`` figures."""
    throughput: Throughput | None = None
    verdict: Verdict | None = None
    latency: LatencyResult | None = None
    repeats: list[Throughput] = field(default_factory=list)
    """Throughput of the repeated rounds (2 to ``--rounds``): the copy again, from a fresh
    launch to fresh destination topics, interleaved with the other rows' rounds; no
    latency phase. Each was audited like the first."""

    @property
    def rounds(self) -> list[Throughput]:
        """Every round's throughput, the first (``throughput``) included."""
        return ([self.throughput] if self.throughput is not None else []) + self.repeats

    def fail(self, reason: str) -> None:
        """Mark the row FAILED (it stays failed) and keep the reason."""
        if self.status != "unavailable":
            self.status = "FAILED"
        self.reasons.append(reason)
