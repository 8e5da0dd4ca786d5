"""What every replicator row has in common: its context, lifecycle and processes."""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bench import procs
from bench.cpucap import CpuCaps
from bench.crossing import Placement

#: How much of a row's log is quoted when one of its processes dies.
_LOG_TAIL_CHARS = 2000


class RowUnavailableError(Exception):
    """The replicator cannot run here (not installed, no Java, ...); the row is reported, not failed."""


@dataclass(frozen=True)
class RowOptions:
    """Knobs of the rows, from the command line."""

    wrapper_procs: int = 1
    """Ferryman: ``ferryman-wrapper`` processes."""
    deduper_procs: int = 1
    """Ferryman: ``ferryman-deduper`` processes."""
    ferryman_txn_ms: int | None = None
    """Ferryman: ``deduper.transaction_interval_ms`` (None: the service default)."""
    compression: str = "none"
    """Producer compression of every row: Ferryman's staging hop (``wrapper.compression_type``; its dedupers
    keep the service default), the copy loop's and MirrorMaker 2's destination producer."""
    staging_partitions: int | None = None
    """Ferryman: ``flows[].staging_partitions`` (None: the service default)."""
    mm2_tasks: int = 2
    """MirrorMaker 2: ``tasks.max``."""
    mm2_producer_tuning: bool = False
    """MirrorMaker 2: batch and linger like the Python rows instead of Connect's defaults."""
    cpu_per_process: float | None = None
    """Every process of every row confined to this many cores, each by a cgroup of its own (``bench.cpucap``);
    None: uncapped."""


@dataclass(frozen=True)
class RowContext:
    """Where a row runs and what it copies."""

    run_id: str
    """Unique per bench run; part of every name the row creates."""
    source: str
    """Source bootstrap servers."""
    destination: str
    """Destination bootstrap servers."""
    topics: Sequence[str]
    """Source topics the row replicates (the preloaded ones and the row's latency topic)."""
    partitions: int
    """Partitions of every source topic."""
    work_dir: Path
    """Configuration files and logs of this row."""
    options: RowOptions
    """Command-line knobs."""
    round_no: int = 1
    """Which round of the copy this is (``--rounds``); every round copies to fresh topics."""

    @property
    def round_tag(self) -> str:
        """Suffix that keeps this round's names apart from other rounds' (see ``round_tag``)."""
        return round_tag(self.round_no)


def round_tag(round_no: int) -> str:
    """Suffix that keeps a repeated round's names apart from the first's ("" in round 1, "-rN" in round N)."""
    return "" if round_no == 1 else f"-r{round_no}"


class Row(ABC):
    """One replicator under test, started as real processes.

    Lifecycle: ``check()`` (may raise ``RowUnavailableError``), ``prepare()``
    (untimed set-up), ``launch()`` (timed from here), ``stop()`` (idempotent).
    """

    name: ClassVar[str]
    """Row name on the command line and in the table."""
    exactly_once: ClassVar[bool]
    """The row promises no duplicates (checked)."""

    def __init__(self, ctx: RowContext) -> None:
        self.ctx = ctx
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[tuple[str, Path]] = []
        cores = ctx.options.cpu_per_process
        self._caps = CpuCaps(cores, ctx.run_id) if cores is not None else None

    @property
    @abstractmethod
    def alias(self) -> str:
        """Prefix of the destination topics: ``<alias>.<source topic>``."""

    def destination_topic(self, source_topic: str) -> str:
        """Where the row copies ``source_topic`` on the destination cluster."""
        return f"{self.alias}.{source_topic}"

    @abstractmethod
    def placement(self) -> Placement:
        """The cluster each of the row's programs runs next to, as the replicator is usually deployed.

        It decides which of the row's connections cross between the regions (``bench.crossing``); it also
        says how what crosses is compressed.
        """

    def check(self) -> None:  # noqa: B027 -- optional hook; most rows need no check
        """Raise ``RowUnavailableError`` if the replicator cannot run here."""

    def prepare(self) -> None:  # noqa: B027 -- optional hook; most rows need no set-up
        """Untimed set-up before ``launch()`` (default: nothing)."""

    @abstractmethod
    def launch(self) -> None:
        """Start the replicator's processes."""

    def settings(self) -> Mapping[str, object]:
        """Settings worth reporting with the figures."""
        return {}

    def spans_file(self) -> Path | None:
        """The file its services write their spans to (the ``file`` exporter), or None when not traced so."""
        return None

    def counters(self) -> Mapping[str, float]:
        """Running totals the replicator reports about itself, read before and after a phase (default: none).

        Each value only grows while the row runs, so the difference of two readings
        covers the time between them.
        """
        return {}

    def _spawn(self, argv: Sequence[str], log_name: str, env: Mapping[str, str] | None = None) -> None:
        log = self.ctx.work_dir / log_name
        self._logs.append((Path(argv[0]).name, log))
        proc = procs.spawn(argv, log, env)
        self.processes.append(proc)
        if self._caps is not None:
            self._caps.confine(proc.pid)

    def programs(self) -> dict[int, str]:
        """The program each of the row's processes was launched as, by pid."""
        return {proc.pid: program for proc, (program, _log) in zip(self.processes, self._logs, strict=True)}

    def exited(self) -> str | None:
        """Describe a process of the row that has exited (with its log tail), or None."""
        for proc, (program, log) in zip(self.processes, self._logs, strict=True):
            rc = proc.poll()
            if rc is not None:
                tail = log.read_text(errors="replace")[-_LOG_TAIL_CHARS:] if log.exists() else ""
                return f"{program} exited with {rc}; log {log}:\n{tail}"
        return None

    def stop(self, grace_s: float) -> None:
        """Stop every process of the row (SIGTERM, SIGKILL after ``grace_s``)."""
        procs.stop(self.processes, grace_s)
        if self._caps is not None:
            self._caps.release()
