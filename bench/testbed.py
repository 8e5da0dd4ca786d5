"""The shared set-up every row of ``bench.replication`` runs on: preloaded source topics and warmed brokers.

``build_stage`` creates and fills the source topics (``bench.preload``), reads them back to check them
(``bench.verify``), warms both brokers (``bench.warmup``) and lists each cluster's broker endpoints for the
cross-cluster bytes (``bench.crossing``). Not ``bench.stages``, which splits a traced record's latency by stage.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException

from bench.config import BenchConfig
from bench.crossing import Endpoint, Side, broker_endpoints, ss_available
from bench.errors import BenchError
from bench.log import log
from bench.preload import PreloadResult, preload
from bench.records import split_counts
from bench.rows import Row
from bench.topics import create_topics, describe
from bench.verify import audit
from bench.warmup import warm_up

#: A full read of a topic is given this long plus 1 s per 20 k records (a reader
#: here manages several hundred thousand per second; the margin covers a busy machine).
_AUDIT_BASE_S = 60.0
_AUDIT_RECORDS_PER_S = 20_000
#: Budget of the metadata request that lists a cluster's brokers (for the cross-cluster bytes): the
#: clusters have just answered the preload, so this only covers a slow first connection.
_BROKERS_BUDGET_S = 30.0


@dataclass(frozen=True)
class Stage:
    """The shared set-up every row runs on."""

    run_id: str
    source: str
    destination: str
    name: str
    """The source topics' common name (``bench-<run>``); the run's other topics start with it too."""
    topics: tuple[str, ...]
    """The preloaded source topics: ``name`` itself, or ``name-tNN`` for each of several."""
    counts: list[int]
    """Records per source partition, topic after topic (``bench.records``)."""
    broker_pids: list[int]
    work_dir: Path
    brokers: Mapping[Side, frozenset[Endpoint]] | None = None
    """Every endpoint of each cluster's brokers, to tell which of a row's connections cross
    (``bench.crossing``); None: cross-cluster bytes are not measured."""


def create_bench_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, config: dict[str, str] | None = None
) -> None:
    # retention.ms=-1: nothing is deleted under the bench, whatever the broker's retention checks.
    create_topics(bootstrap, topics, partitions, {"retention.ms": "-1", **(config or {})})


def audit_budget(records: int) -> float:
    return _AUDIT_BASE_S + records / _AUDIT_RECORDS_PER_S


def source_topics(name: str, n: int) -> tuple[str, ...]:
    """The names of ``n`` source topics: ``name`` itself for one (as the bench always named it), else ``name-tNN``."""
    if n == 1:
        return (name,)
    width = len(str(n - 1))
    return tuple(f"{name}-t{i:0{width}d}" for i in range(n))


def preloaded_topics(
    cfg: BenchConfig, source: str, name: str, records: int
) -> tuple[tuple[str, ...], list[int], PreloadResult]:
    """Create the source topics (``source_topics``) and fill them with ``records`` bench records.

    Returns:
        The topics, the records of each of their partitions (topic after topic) and how the preload went.
    """
    topics = source_topics(name, cfg.topics)
    counts = split_counts(records, cfg.topics * cfg.partitions)
    create_bench_topics(source, topics, cfg.partitions)
    loaded = preload(
        source, topics, counts, cfg.value_bytes, processes=cfg.preload_procs, budget_s=audit_budget(records)
    )
    return topics, counts, loaded


def build_stage(cfg: BenchConfig, source: str, destination: str, broker_pids: list[int], base: Path) -> Stage:
    """Preload the source topics, check them, and warm both brokers."""
    run_id = uuid.uuid4().hex[:6]
    name = f"bench-{run_id}"
    topics, counts, loaded = preloaded_topics(cfg, source, name, cfg.records)
    log(
        f"preloaded {describe(topics)}: {loaded.records:,} records in {loaded.seconds:.1f} s "
        f"({loaded.processes} processes)"
    )
    check = audit(source, topics, counts, audit_budget(cfg.records))
    t = check.tally
    if not (check.read_to_end and t.complete and t.duplicates == 0 and t.misplaced == 0):
        raise BenchError(f"the preloaded source topics are not what was written: {t} ({check.error})")
    log(
        f"source read back complete in {check.seconds:.1f} s: the reader's ceiling is "
        f"~{t.unique / check.seconds:,.0f} rec/s (rows near it are reader-bound)"
    )
    if cfg.warmup_seconds > 0:
        w = warm_up(source, destination, f"{name}-warmup", cfg.partitions, cfg.warmup_seconds, cfg.value_bytes)
        log(
            f"brokers warmed up in {w.seconds:.1f} s: {w.offered:,} records offered, "
            f"{w.relayed:,} relayed in transactions, {w.read:,} read back"
        )
    brokers = _broker_endpoints(source, destination)
    return Stage(run_id, source, destination, name, topics, counts, broker_pids, base, brokers)


def _broker_endpoints(source: str, destination: str) -> dict[Side, frozenset[Endpoint]] | None:
    """Each cluster's broker endpoints for ``bench.crossing``; None (logged) when they cannot be told apart."""
    if not ss_available():
        log("cross-cluster bytes not measured: ss (iproute2) is not installed")
        return None
    try:
        brokers: dict[Side, frozenset[Endpoint]] = {
            "source": broker_endpoints(source, _BROKERS_BUDGET_S),
            "destination": broker_endpoints(destination, _BROKERS_BUDGET_S),
        }
    except (KafkaException, OSError, ValueError) as exc:
        log(f"cross-cluster bytes not measured: the brokers' endpoints could not be listed ({exc})")
        return None
    if shared := brokers["source"] & brokers["destination"]:
        log(f"cross-cluster bytes not measured: source and destination share brokers ({host_ports(shared)})")
        return None
    log(
        f"cross-cluster bytes: source brokers {host_ports(brokers['source'])}, destination brokers "
        f"{host_ports(brokers['destination'])}"
    )
    return brokers


def host_ports(endpoints: frozenset[Endpoint]) -> list[str]:
    return [f"{e.host}:{e.port}" for e in sorted(endpoints)]


def destination_topics(row: Row, stage: Stage) -> list[str]:
    """Where ``row`` copies the preloaded topics, in their order."""
    return [row.destination_topic(t) for t in stage.topics]
