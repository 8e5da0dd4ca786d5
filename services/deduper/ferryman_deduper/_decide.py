"""The dedup decision: pure logic, no I/O.

Invariant kept per source partition: the destination holds every committed
source record with offset <= watermark, each exactly once, in order, and
nothing else. An envelope moves the watermark from W to its last offset only
when its previous_offset is <= W: the chain contract then guarantees that no
source record lies between W and the envelope's first accepted record.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field


class Verdict(enum.Enum):
    """What to do with an envelope."""

    ACCEPT = "accept"
    """Write records[start:], then the watermark is the last offset."""
    DUPLICATE = "duplicate"
    """Every record is at or below the watermark: drop it."""
    GAP = "gap"
    """Records between the watermark and previous_offset were never seen: hold."""
    STALE_TOPIC = "stale_topic"
    """The envelope belongs to an earlier incarnation of the source topic: drop."""
    HALTED = "halted"
    """The source topic was re-created and the flow's policy is to halt."""


@dataclass
class PartitionState:
    """Dedup state of one source partition."""

    watermark: int = -1
    topic_id: bytes = b""
    retired_topic_ids: set[bytes] = field(default_factory=set)
    halted: bool = False


@dataclass(frozen=True)
class Decision:
    """The verdict for one envelope, with what it implies."""

    verdict: Verdict
    start: int = 0
    """Index of the first record to write (ACCEPT)."""
    new_state: PartitionState | None = None
    """State after the envelope, when it changes (ACCEPT, or a topic reset)."""
    recreated: bool = False
    """The source topic id changed (a re-created topic) on this envelope."""
    missing_from: int = 0
    missing_to: int = 0
    """For GAP: the inclusive range of offsets that may be missing."""


def decide(
    state: PartitionState | None,
    topic_id: bytes,
    previous_offset: int,
    offsets: Sequence[int],
    *,
    on_topic_recreated: str = "reset",
) -> Decision:
    """Decide what to do with one envelope of a source partition.

    Args:
        state: current state of the partition (None: never seen, watermark -1).
        topic_id: source topic id carried by the envelope.
        previous_offset: the envelope's chain link.
        offsets: the offsets of the envelope's records, strictly increasing.
        on_topic_recreated: ``reset`` or ``halt`` when topic_id is new.
    """
    recreated = False
    if state is None:
        state = PartitionState(topic_id=topic_id)
    elif topic_id and state.topic_id and topic_id != state.topic_id:
        if topic_id in state.retired_topic_ids:
            return Decision(Verdict.STALE_TOPIC)
        if on_topic_recreated == "halt" or state.halted:
            halted = PartitionState(state.watermark, state.topic_id, set(state.retired_topic_ids), halted=True)
            return Decision(Verdict.HALTED, new_state=halted, recreated=True)
        recreated = True
        state = PartitionState(
            watermark=-1, topic_id=topic_id, retired_topic_ids=state.retired_topic_ids | {state.topic_id}
        )
    elif state.halted:
        return Decision(Verdict.HALTED)
    elif not state.topic_id and topic_id:
        state = PartitionState(state.watermark, topic_id, set(state.retired_topic_ids))

    w = state.watermark
    if offsets[-1] <= w:
        return Decision(Verdict.DUPLICATE, new_state=state if recreated else None, recreated=recreated)
    if previous_offset > w:
        return Decision(
            Verdict.GAP,
            new_state=state if recreated else None,
            recreated=recreated,
            missing_from=w + 1,
            missing_to=previous_offset,
        )
    start = bisect.bisect_right(offsets, w)
    new_state = PartitionState(offsets[-1], state.topic_id, set(state.retired_topic_ids))
    return Decision(Verdict.ACCEPT, start=start, new_state=new_state, recreated=recreated)
