"""Closing a subscribed consumer without letting close() serve an assignment (librdkafka #4884).

librdkafka's ``close()`` serves the rebalance callbacks still queued for the application. When one of them
is an *assignment* (the consumer's join completed after its last poll: a SIGTERM during its first join, or
while it rejoins), close() turns it into an unassign, the group subsystem can terminate at once, and the
revoke callback queued behind it then asks that terminated subsystem a question it never answers:
confluent-kafka's fallback after the callback (``rd_kafka_rebalance_protocol``, ``incremental_unassign``)
waits for ever, **holding the GIL**, so no deadline in Python fires again and the process hangs. Seen once in
CI (a deduper stopped 0.3 s after its start: its drain hung past 45 s); reproduced stand-alone in 2 of 12 and
4 of 30 closes of a cooperative static member that never polled, and in none of 30 once its assignment had
come through poll() first. librdkafka #4884 and its fix (PR #4883) are open.

So the services close their group consumers with ``close_group_consumer``: while an assignment is on its
way (``JoinTracker``), they poll for it first, within a bound, and only then close.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException

from ferryman.watchdog import close_or_park

_log = logging.getLogger(__name__)

#: How long a closing consumer waits for an assignment on its way. A join answers within a second here
#: once every member has joined; a new group adds the broker's ``group.initial.rebalance.delay.ms``
#: (3 s by default). Past this the consumer is closed anyway: short, because a cluster that is away
#: (a drain during an outage) sends no assignment at all, and the drain's other steps wait for it too.
SETTLE_S = 5.0
#: One poll while settling: short, so that the wait ends soon after the assign callback ran.
_POLL_S = 0.1


class JoinTracker:
    """Whether a subscribed consumer has an assignment on its way to it (loop thread and its callbacks).

    An assign callback follows ``subscribe()`` (a join), and a cooperative revoke or a loss while subscribed
    (a rejoin), empty or not. A rebalance that a peer starts and that revokes nothing of ours is not seen
    before its assign callback, so close() can still meet that one: the window is the time of one join.
    """

    def __init__(self) -> None:
        self.due = False
        self._subscribed = False

    def subscribed(self) -> None:
        """Call with ``subscribe()``."""
        self._subscribed = self.due = True

    def unsubscribed(self) -> None:
        """Call with ``unsubscribe()``: the revoke that follows is the last callback."""
        self._subscribed = self.due = False

    def revoked(self) -> None:
        """Call in the revoke and lost callbacks."""
        self.due = self._subscribed

    def assigned(self) -> None:
        """Call in the assign callback."""
        self.due = False


def close_group_consumer(
    consumer: Consumer, joins: JoinTracker, *, what: str, deadline_s: float, settle_s: float = SETTLE_S
) -> None:
    """Close a subscribed consumer once no assignment is on its way (within settle_s), under a deadline.

    Records that poll() returns meanwhile are dropped: they are past the last commit, so the partition's
    next owner reads them again.
    """
    settle_by = time.monotonic() + settle_s
    try:
        while joins.due and time.monotonic() < settle_by:
            consumer.poll(_POLL_S)
    except (KafkaException, RuntimeError) as exc:  # a failed or closed consumer: close what is left
        _log.warning("%s: polling for the assignment on its way failed: %s", what, exc)
    if joins.due:
        _log.warning("%s: the group's assignment did not come within %g s; closing anyway", what, settle_s)
    close_or_park(consumer.close, consumer, what=what, deadline_s=deadline_s)
