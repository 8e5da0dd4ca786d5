"""Partitions a consumer group leaves without an owner: noticed, so that a member rejoins and they are assigned.

Both services use cooperative-sticky assignment with static membership (``group.instance.id``). Under
that pair a partition can end up owned by nobody while the group reads as stable: a member told to
revoke partitions (the first phase of a cooperative rebalance) stops, or is given up, before it rejoins
for the second phase, and its successor with the same ``group.instance.id`` takes over the stored
assignment without a rebalance. The partitions withheld for the second phase are then assigned to no
one, and nothing in the protocol starts another rebalance (seen in chaos runs: a deduper SIGTERMed
right after a peer joined, and a wrapper whose hand-over commit hung; stuck for good in a probe).

``OrphanWatch`` describes the group on a daemon thread every ``interval_s``; when the group is stable
and the same partitions are owned by no member on ``confirm`` checks in a row, ``take()`` returns them
once, and the service's loop rejoins the group (unsubscribe and subscribe), which assigns them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

_log = logging.getLogger(__name__)

#: How often the group is described: an orphaned partition waits about interval x confirm.
INTERVAL_S = 10.0
#: Checks in a row that must see the same orphans (a rebalance in progress can look stable for a moment).
CONFIRM = 2
_DESCRIBE_TIMEOUT_S = 10.0


def orphans(
    state: ConsumerGroupState, assigned: set[tuple[str, int]], partitions: Mapping[str, int]
) -> frozenset[tuple[str, int]]:
    """The partitions of ``partitions`` (topic -> count) no member owns, if the group is stable (else none)."""
    if state != ConsumerGroupState.STABLE:
        return frozenset()
    return frozenset((t, p) for t, n in partitions.items() for p in range(n) if (t, p) not in assigned)


class OrphanWatch:
    """Describes one consumer group now and then; reports partitions that stay without an owner."""

    def __init__(
        self,
        admin_config: Mapping[str, Any],
        group: str,
        topics: Callable[[], Iterable[str]],
        *,
        interval_s: float = INTERVAL_S,
        confirm: int = CONFIRM,
    ) -> None:
        """Watch group (not started: ``start``).

        Args:
            admin_config: AdminClient properties of the group's cluster.
            group: the consumer group.
            topics: the topics the group subscribes to, asked at each check (called on the watch's thread);
                their partitions are taken from the cluster's metadata then, so a deleted topic owes nothing.
            interval_s: time between checks.
            confirm: checks in a row that must see the same orphans.
        """
        self._admin_config = dict(admin_config)
        self._group = group
        self._topics = topics
        self._interval_s = interval_s
        self._confirm = confirm
        self._seen: frozenset[tuple[str, int]] = frozenset()
        self._streak = 0
        self._found: frozenset[tuple[str, int]] = frozenset()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"orphan-watch-{group}", daemon=True)
        self.rejoins = 0
        """Orphan sets reported so far."""

    def start(self) -> OrphanWatch:
        """Start checking in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop checking (returns at once; the thread ends within one describe)."""
        self._stop.set()

    def take(self) -> frozenset[tuple[str, int]]:
        """Confirmed orphans not reported before (empty when there are none); the caller rejoins the group."""
        with self._lock:
            found, self._found = self._found, frozenset()
        return found

    def observe(self, state: ConsumerGroupState, assigned: set[tuple[str, int]], partitions: Mapping[str, int]) -> None:
        """One check: the group's state, what its members own, what it should own (topic -> partition count)."""
        now = orphans(state, assigned, partitions)
        self._streak = self._streak + 1 if now and now == self._seen else (1 if now else 0)
        self._seen = now
        if self._streak >= self._confirm:
            _log.warning(
                "consumer group %s is stable but owns none of %s; rejoining so that they are assigned",
                self._group,
                ", ".join(f"{t}[{p}]" for t, p in sorted(now)),
            )
            with self._lock:
                self._found = now
            self.rejoins += 1
            self._streak = 0

    def _run(self) -> None:
        admin = AdminClient(self._admin_config)
        while not self._stop.wait(self._interval_s):
            try:
                # The group first: a partition added in between is then owed but not yet assigned, and the
                # next check (confirm) sees it assigned.
                future = admin.describe_consumer_groups([self._group], request_timeout=_DESCRIBE_TIMEOUT_S)[self._group]
                desc = future.result(timeout=_DESCRIBE_TIMEOUT_S * 2)
                meta = admin.list_topics(timeout=_DESCRIBE_TIMEOUT_S).topics
            except (KafkaException, TimeoutError) as exc:  # the cluster away: nothing to conclude
                _log.debug("describing consumer group %s: %s", self._group, exc)
                self._streak = 0
                continue
            assigned = {(tp.topic, tp.partition) for m in desc.members for tp in m.assignment.topic_partitions}
            wanted = {t: len(meta[t].partitions) for t in self._topics() if t in meta and meta[t].error is None}
            self.observe(desc.state, assigned, wanted)
