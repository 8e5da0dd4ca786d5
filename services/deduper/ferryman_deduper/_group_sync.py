"""Group-offset sync: the wrappers' group checkpoints committed at the destination (a thread of its own).

While a flow has ``sync_group_offsets`` on, its wrappers send the chosen source consumer groups' committed
offsets over the control link (``ferryman_wrapper._checkpoints``). Each deduper takes the partitions of its
own staging partitions (so the flow's dedupers split the work as they split staging), translates them as
``TranslateGroupOffsets`` does, and commits the destination offsets for the group at the destination:

* only partitions replicated (a partition not replicated yet is left for a later checkpoint);
* only forward: a partition whose destination offset is already there or past is left alone, so a group
  that consumed further at the destination is never rewound (MirrorMaker 2's rule);
* only while the group has no members at the destination: the coordinator refuses a non-member's commit
  then, and the group is left alone (``active``) until its consumers there stop.

Checkpoints are best-effort: a failure is logged and counted, and the next checkpoint (the wrapper's next
round) tries again. Nothing here touches the data path.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from ferryman import envelope
from ferryman.errors import FerrymanError, PreconditionError
from ferryman.group_offsets import Position, commit_group_offsets, read_group_offsets
from ferryman.v1 import control_pb2

from ferryman_deduper._translate_group import GroupTranslator

_log = logging.getLogger(__name__)

#: Longest a stop waits for the thread (it is a daemon: the drain never waits on a cluster away).
STOP_WAIT_S = 5.0

#: Budget of one group's sync (translation, reading the destination group, the commit).
SYNC_BUDGET_S = 30.0

#: Outcomes counted (``GetDeduperStatusResponse.group_offset_syncs``).
OUTCOMES = ("committed", "unchanged", "active", "failed")


def forward_only(translated: dict[Position, int], current: dict[Position, int]) -> dict[Position, int]:
    """The translated offsets ahead of the destination group's committed ones (absent counts as behind)."""
    return {pos: offset for pos, offset in translated.items() if current.get(pos, -1) < offset}


class GroupSync:
    """Translates and commits group checkpoints for the staging partitions this deduper owns."""

    def __init__(
        self,
        *,
        translator: Callable[[], GroupTranslator],
        consumer_config: Callable[[], dict[str, Any]],
        owned: Callable[[], set[int]],
        staging_partitions: int,
    ) -> None:
        """Translate with translator(); read and commit with consumer_config's cluster (the destination).

        Args:
            translator: The flow's group translator.
            consumer_config: librdkafka properties of a destination-cluster consumer (a new one per use).
            owned: The staging partitions this deduper owns now (any thread).
            staging_partitions: Partitions of the flow's staging topic.
        """
        self._translator = translator
        self._consumer_config = consumer_config
        self._owned = owned
        self._n = staging_partitions
        self._lock = threading.Lock()
        #: Latest checkpoint of each group's partitions, merged over the wrappers that send them.
        self._pending: dict[str, dict[Position, control_pb2.GroupOffset]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-sync", daemon=True)
        self.outcomes: Counter[str] = Counter()
        #: Groups synced at least once (the first sync of each is logged at INFO, later ones at DEBUG).
        self._synced: set[str] = set()

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a sync under way ends at its next Kafka call."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=STOP_WAIT_S)

    def submit(self, checkpoints: control_pb2.GroupCheckpoints) -> None:
        """Take a wrapper's checkpoints (the control stream's thread); the latest of each partition wins."""
        with self._lock:
            for cp in checkpoints.groups:
                mine = self._pending.setdefault(cp.group, {})
                for o in cp.offsets:
                    mine[(o.topic, o.partition)] = o
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, {}
            for group, offsets in sorted(pending.items()):
                if self._stop.is_set():
                    return
                try:
                    outcome = self.sync(group, list(offsets.values()))
                except FerrymanError as exc:
                    _log.warning("group %s: offsets not synced (retried with the next checkpoint): %s", group, exc)
                    outcome = "failed"
                except Exception:
                    _log.exception("group %s: offsets not synced (retried with the next checkpoint)", group)
                    outcome = "failed"
                self.outcomes[outcome] += 1

    def sync(self, group: str, offsets: list[control_pb2.GroupOffset]) -> str:
        """Translate and commit one group's checkpoint; returns the outcome (one of `OUTCOMES`).

        Raises:
            FerrymanError: the destination did not answer, or refused the commit for another reason.
        """
        owned = self._owned()
        mine = [o for o in offsets if envelope.staging_partition(o.topic, o.partition, self._n) in owned]
        if not mine:
            return "unchanged"
        _rows, translated = self._translator().positions(group, mine, SYNC_BUDGET_S)
        if not translated:
            return "unchanged"
        topics = {topic for topic, _ in translated}
        current = read_group_offsets(self._consumer_config(), group, topics.__contains__, SYNC_BUDGET_S)
        ahead = forward_only(translated, current)
        if not ahead:
            return "unchanged"
        try:
            commit_group_offsets(self._consumer_config(), group, ahead, SYNC_BUDGET_S)
        except PreconditionError:
            _log.debug("group %s has members at the destination: its offsets are left alone", group)
            return "active"
        first = group not in self._synced
        self._synced.add(group)
        _log.log(
            logging.INFO if first else logging.DEBUG,
            "group %s: offsets synced at the destination for %d partitions (%s)",
            group,
            len(ahead),
            ", ".join(f"{t} [{p}] {o}" for (t, p), o in sorted(ahead.items())[:8]),
        )
        return "committed"
