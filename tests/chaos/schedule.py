"""The fault schedule: a pure function of a seed and a profile, so a failing run can be replayed exactly.

``build_schedule(seed, profile)`` returns the faults in the order the runner applies them. Each fault
names its kind, its target (a service instance, a broker node, a link), how long it lasts and the pause
before it. Every kind the profile asks for appears at least ``min_each`` times; the rest of the faults
are drawn at random. The runner waits for recovery (destination progress resumed) after each fault,
unless the fault is marked ``overlaps_next``: then the next one starts while it is still healing.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    """What a fault does."""

    KILL = "kill"
    """SIGKILL of a wrapper or deduper, restarted at once."""
    TERM = "term"
    """SIGTERM of a wrapper or deduper (drained exit), restarted at once."""
    PAUSE = "pause"
    """SIGSTOP of a wrapper or deduper for longer than its session and transaction timeouts, then
    SIGCONT: the zombie wakes up and must be fenced."""
    BROKER_KILL = "broker_kill"
    """SIGKILL of one broker node, restarted after the outage."""
    BROKER_STOP = "broker_stop"
    """Controlled shutdown (SIGTERM) of one broker node, restarted after the outage."""
    CUT = "cut"
    """A link held (no data, connections open) for the outage."""
    DELAY = "delay"
    """A link given latency for the outage."""
    SLOW = "slow"
    """A link limited to a low bandwidth for the outage."""
    ADD_PARTITION = "add_partition"
    """One partition added to a source topic."""
    RECREATE_TOPIC = "recreate_topic"
    """A source topic deleted and re-created (same name, new id)."""


SERVICES = ("wrapper-1", "wrapper-2", "deduper-1", "deduper-2")
CLUSTERS = ("source", "destination")
LINKS = ("source", "destination", "control")
"""The wrappers' links to the source cluster, to the destination cluster, and the gRPC control link."""


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule."""

    index: int
    kind: Kind
    target: str
    """``wrapper-1``.., ``source/1`` (cluster/node), a link name, or a topic role."""
    before_s: float
    """Pause (steady load) before the fault starts."""
    duration_s: float
    """How long the fault is held (outage, pause, link fault); 0 for instant ones."""
    overlaps_next: bool = False
    """The next fault starts without waiting for this one's recovery."""

    def to_json(self) -> dict[str, Any]:
        """The fault as plain JSON data."""
        data = asdict(self)
        data["kind"] = self.kind.value
        return data


@dataclass(frozen=True)
class Profile:
    """The size of a run."""

    name: str
    faults: int
    """Total number of faults."""
    min_each: dict[Kind, int] = field(default_factory=dict)
    """Least number of faults of each kind (per target class where the kind says so, see build_schedule)."""
    rate_per_s: float = 400.0
    """Offered load, records per second over all topics."""
    before_s: tuple[float, float] = (2.0, 5.0)
    outage_s: tuple[float, float] = (2.0, 5.0)
    pause_s: tuple[float, float] = (13.0, 16.0)
    """SIGSTOP length: above the services' session (6 s) and transaction (10 s) timeouts of the run."""
    overlap_share: float = 0.0
    """Share of faults that overlap the next one."""
    tail_s: float = 5.0
    """Steady load after the last fault, before the producers stop."""


CI = Profile(
    name="ci",
    faults=14,
    min_each={
        Kind.KILL: 2,
        Kind.TERM: 1,
        Kind.PAUSE: 2,
        Kind.BROKER_KILL: 2,
        Kind.BROKER_STOP: 0,
        Kind.CUT: 3,
        Kind.DELAY: 1,
        Kind.SLOW: 1,
        Kind.ADD_PARTITION: 1,
        Kind.RECREATE_TOPIC: 1,
    },
    rate_per_s=300.0,
    before_s=(1.0, 3.0),
    outage_s=(2.0, 4.0),
    overlap_share=0.1,
)
"""A few minutes: every kind of fault at least once (every link cut, a zombie of each role, a broker
kill on each cluster)."""

LONG = Profile(
    name="long",
    faults=120,
    min_each={
        Kind.KILL: 40,
        Kind.TERM: 12,
        Kind.PAUSE: 6,
        Kind.BROKER_KILL: 10,
        Kind.BROKER_STOP: 4,
        Kind.CUT: 15,
        Kind.DELAY: 6,
        Kind.SLOW: 6,
        Kind.ADD_PARTITION: 2,
        Kind.RECREATE_TOPIC: 2,
    },
    rate_per_s=1500.0,
    before_s=(3.0, 8.0),
    overlap_share=0.15,
    tail_s=20.0,
)
"""≥ 1 M records (1500 records/s for the run's ~15+ min), ≥ 50 process kills, ≥ 5 broker kills per
cluster, ≥ 5 link cuts of each link, ≥ 5 zombie pauses."""

PROFILES = {p.name: p for p in (CI, LONG)}

# Kinds whose min_each counts per target class: broker faults per cluster, link faults per link,
# pauses per role. The others count over all targets.
_SPREAD: dict[Kind, tuple[str, ...]] = {
    Kind.BROKER_KILL: CLUSTERS,
    Kind.BROKER_STOP: CLUSTERS,
    Kind.CUT: LINKS,
    Kind.DELAY: LINKS,
    Kind.SLOW: LINKS,
    Kind.PAUSE: ("wrapper", "deduper"),
}
# Faults that can never overlap the next: their recovery is a precondition (a topic being re-created
# must be fully replicated first; a paused process must have woken before the next fault is judged).
_NO_OVERLAP = {Kind.RECREATE_TOPIC, Kind.PAUSE, Kind.ADD_PARTITION}


def _target(kind: Kind, rng: random.Random, spread: str | None, source_nodes: int, destination_nodes: int) -> str:
    if kind in (Kind.KILL, Kind.TERM):
        return rng.choice(SERVICES)
    if kind is Kind.PAUSE:
        role = spread or rng.choice(("wrapper", "deduper"))
        return f"{role}-{rng.randint(1, 2)}"
    if kind in (Kind.BROKER_KILL, Kind.BROKER_STOP):
        cluster = spread or rng.choice(CLUSTERS)
        nodes = source_nodes if cluster == "source" else destination_nodes
        return f"{cluster}/{rng.randint(1, nodes)}"
    if kind in (Kind.CUT, Kind.DELAY, Kind.SLOW):
        return spread or rng.choice(LINKS)
    if kind is Kind.ADD_PARTITION:
        return "plain"
    return "recreated"


def build_schedule(seed: int, profile: Profile, *, source_nodes: int = 1, destination_nodes: int = 3) -> list[Fault]:
    """The faults of one run, in order: the same seed and profile always give the same list.

    Args:
        seed: the run's seed.
        profile: its size (``CI`` or ``LONG``).
        source_nodes: broker nodes of the source cluster (targets of source broker faults).
        destination_nodes: broker nodes of the destination cluster.

    Returns:
        ``max(profile.faults, sum of the minima)`` faults; structural ones (a partition added, a
        topic re-created) are never among the first two.
    """
    rng = random.Random(seed)
    wanted: list[tuple[Kind, str | None]] = []
    for kind, least in profile.min_each.items():
        spread = _SPREAD.get(kind)
        for i in range(least):
            wanted.append((kind, spread[i % len(spread)] if spread else None))
    instant_or_random = [k for k in Kind if k not in (Kind.RECREATE_TOPIC, Kind.ADD_PARTITION)]
    while len(wanted) < profile.faults:
        wanted.append((rng.choice(instant_or_random), None))
    rng.shuffle(wanted)
    # Structural changes away from the very start, so the flow is in full swing when they happen.
    structural = (Kind.RECREATE_TOPIC, Kind.ADD_PARTITION)
    head = [w for w in wanted[:2] if w[0] in structural]
    wanted = [w for w in wanted[:2] if w[0] not in structural] + wanted[2:]
    for w in head:
        wanted.insert(rng.randint(2, len(wanted)), w)
    faults: list[Fault] = []
    for index, (kind, along) in enumerate(wanted):
        if kind in (Kind.KILL, Kind.TERM, Kind.ADD_PARTITION, Kind.RECREATE_TOPIC):
            duration = 0.0
        elif kind is Kind.PAUSE:
            duration = rng.uniform(*profile.pause_s)
        else:
            duration = rng.uniform(*profile.outage_s)
        overlaps = kind not in _NO_OVERLAP and rng.random() < profile.overlap_share and index < len(wanted) - 1
        faults.append(
            Fault(
                index=index,
                kind=kind,
                target=_target(kind, rng, along, source_nodes, destination_nodes),
                before_s=round(rng.uniform(*profile.before_s), 2),
                duration_s=round(duration, 2),
                overlaps_next=overlaps,
            )
        )
    # A fault right after a structural one must not overlap into it either.
    return [
        f if not (i + 1 < len(faults) and faults[i + 1].kind in _NO_OVERLAP) else _no_overlap(f)
        for i, f in enumerate(faults)
    ]


def _no_overlap(fault: Fault) -> Fault:
    return Fault(fault.index, fault.kind, fault.target, fault.before_s, fault.duration_s, False)


def counts(faults: list[Fault]) -> dict[str, int]:
    """Faults by kind (``kind`` and ``kind:target class``)."""
    by: Counter[str] = Counter()
    for f in faults:
        by[f.kind.value] += 1
        if f.kind in _SPREAD:
            by[f"{f.kind.value}:{target_class(f.target)}"] += 1
    return dict(sorted(by.items()))


def target_class(target: str) -> str:
    """``source`` for ``source/1``, ``wrapper`` for ``wrapper-2``, a link or topic role as it is."""
    return target.partition("/")[0].partition("-")[0]
