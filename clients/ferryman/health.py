"""Reachability of the clusters a service talks to: one log line per change, and the health it implies.

A broker restart, a coordinator moving or a network blip is waited out, never
a reason to exit. While it lasts, the service is NOT_SERVING with the reason in
its status. The log says so once when it starts ("down"), every
``STILL_DOWN_LOG_INTERVAL_S`` while it lasts, and once when work resumes ("back
after X s"), instead of one line per failed poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from ferryman.config import ClusterConfig
from ferryman.errors import ClusterUnreachableError
from ferryman.kafka_log import RepeatFilter

_log = logging.getLogger(__name__)

#: How often a lasting outage is logged again: often enough that an operator
#: tailing the log sees it is still on, rare enough not to flood it.
STILL_DOWN_LOG_INTERVAL_S = 30.0

#: While a cluster counts as down, the service asks it for metadata this often: with no records
#: flowing (a quiet topic, or wrappers paused because the destination was down) nothing else
#: would show that it is back.
PROBE_INTERVAL_S = 2.0
#: librdkafka timeout of one probe (it runs on the service's loop; a live broker answers in ms).
PROBE_TIMEOUT_S = 1.0

#: Client errors (error_cb) that mean "nothing of the cluster answers":
#: librdkafka reports every failed connection attempt too, but those alone
#: (one broker of several restarting) say nothing about the cluster.
_UNREACHABLE_CODES = frozenset({KafkaError._ALL_BROKERS_DOWN})
#: Client errors that are connection noise, covered by the state-change lines.
_NOISE_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._ALL_BROKERS_DOWN})


#: A recovery that has failed this long while its clusters answer metadata requests is stuck on a client,
#: not on a cluster: the service replaces its group consumer (`StuckRecovery`). Four times the longest
#: recovery of the long chaos run (15 s), so an outage that is merely slow to clear is never taken for it.
STUCK_RECOVERY_S = 60.0


def describe_cluster(alias: str, cluster: ClusterConfig) -> str:
    """``cluster 'alias' (host:port,...)``: how errors name a cluster."""
    return f"cluster {alias!r} ({cluster.bootstrap_servers})"


class ClusterHealth:
    """Whether one cluster answers, as the service's own calls see it.

    Thread-safe: client callbacks, the loop and gRPC status threads use it.
    """

    def __init__(
        self,
        alias: str,
        cluster: ClusterConfig,
        *,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alias = alias
        self.name = describe_cluster(alias, cluster)
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._reason = ""
        self._next_log = 0.0
        self._next_probe = 0.0
        #: Client errors warned of once per interval, with a count (`_warn_folded`).
        self._client_warnings = RepeatFilter(STILL_DOWN_LOG_INTERVAL_S, clock)
        self.outages = 0
        """Outages seen since start."""
        self.last_outage_s = 0.0
        """Length of the last outage that ended, in seconds."""

    @property
    def reachable(self) -> bool:
        """False from a failure until the next success."""
        return self._down_since is None

    @property
    def reason(self) -> str:
        """Why the cluster counts as down ("" while it is up)."""
        return self._reason

    def down(self, reason: str) -> None:
        """Record a failure that means the cluster does not answer (idempotent while down)."""
        now = self._clock()
        with self._lock:
            if self._down_since is not None:
                self._reason = reason
                return
            self._down_since = now
            self._reason = reason
            self._next_log = now + STILL_DOWN_LOG_INTERVAL_S
            self.outages += 1
        _log.warning("%s is unreachable: %s; waiting it out", self.name, reason)
        if self._on_change is not None:
            self._on_change()

    def up(self) -> None:
        """Record a success: a call to the cluster completed."""
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            since = self._down_since
            if since is None:
                return
            self._down_since = None
            self._reason = ""
            self.last_outage_s = self._clock() - since
        _log.warning("%s is back after %.1f s", self.name, self.last_outage_s)
        if self._on_change is not None:
            self._on_change()

    def tick(self) -> None:
        """Log a lasting outage again every STILL_DOWN_LOG_INTERVAL_S (call from the loop)."""
        since = self._down_since
        if since is None:
            return
        now = self._clock()
        if now < self._next_log:
            return
        self._next_log = now + STILL_DOWN_LOG_INTERVAL_S
        _log.warning("%s still unreachable after %.0f s: %s", self.name, now - since, self._reason)

    def probe(self, ask: Callable[[float], object]) -> None:
        """While down, every PROBE_INTERVAL_S: ask(timeout) for metadata; an answer means the cluster is back.

        Call from the loop. ``ask`` is a client's ``list_topics`` (any topic): it
        raises KafkaException while no broker answers.
        """
        if self._down_since is None:
            return
        now = self._clock()
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_INTERVAL_S
        try:
            ask(PROBE_TIMEOUT_S)
        except KafkaException:
            return
        self.up()

    def client_error(self, err: KafkaError, client: str) -> None:
        """A client's error_cb event: an outage signal, connection noise, or worth one warning."""
        if err.code() in _UNREACHABLE_CODES:
            self.down(f"{client}: {err.str()}")
        elif err.code() in _NOISE_CODES:
            _log.debug("%s %s: %s", self.name, client, err)
        else:
            self._warn_folded(client, err)

    def _warn_folded(self, client: str, err: KafkaError) -> None:
        """Warn of a client error once per ``STILL_DOWN_LOG_INTERVAL_S`` per client and error, with a count.

        A consumer of a topic deleted under the flow reported "Failed to query logical offset" ~60 times a
        second until the topic was back (1,506 warnings in 26 s in a test's log).
        """
        admitted = self._client_warnings.admit((client, err.code(), err.str()))
        if admitted is None:
            return
        folded, since_s = admitted
        more = f" ({folded} more like it in the {since_s:.0f} s before)" if folded else ""
        _log.warning("%s %s: %s%s", self.name, client, err, more)


def wait_until_reachable(admin: AdminClient, alias: str, cluster: ClusterConfig, deadline_s: float) -> None:
    """Block until the cluster answers a metadata request, or raise after deadline_s.

    Logs once at the first failure and every STILL_DOWN_LOG_INTERVAL_S after it.

    Raises:
        ClusterUnreachableError: no answer within deadline_s, naming the cluster and the setting.
    """
    name = describe_cluster(alias, cluster)
    started = time.monotonic()
    next_log = started
    while True:
        remaining = deadline_s - (time.monotonic() - started)
        try:
            # Metadata from any broker proves the cluster answers; a local cluster answers in milliseconds, a
            # remote one well within 2 s, and short tries put the first "does not answer" line out early.
            admin.list_topics(timeout=max(0.1, min(2.0, remaining)))
            if time.monotonic() - started > 1.0:
                _log.warning("%s answered after %.1f s", name, time.monotonic() - started)
            return
        except KafkaException as exc:
            now = time.monotonic()
            if now - started >= deadline_s:
                raise ClusterUnreachableError(
                    f"{name} did not answer within {deadline_s:g} s at start-up (startup_timeout_s): {exc}"
                ) from exc
            if now >= next_log:
                _log.warning(
                    "%s does not answer yet (%s); retrying for up to %.0f s more", name, exc, deadline_s - now + started
                )
                next_log = now + STILL_DOWN_LOG_INTERVAL_S
            time.sleep(min(1.0, max(0.0, deadline_s - (now - started))))  # back off between metadata requests


class StuckRecovery:
    """Tells a recovery stuck on a client from one that waits out its cluster (loop thread only).

    The group consumer is the client whose failures can go unseen: its fatal error
    comes once, as an event of a batch, and then its seeks fail as a transient
    error would. A fence during a recovery's backoff left the recovery failing
    for ever that way (fixed); this is the net for the next cause of the kind.
    Replacing the consumer is always safe: it rejoins and every partition resumes
    from its commit.
    """

    def __init__(self, after_s: float = STUCK_RECOVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self._clock = clock
        self._since: float | None = None

    def failed(self, ask: Callable[[float], object]) -> float:
        """Record a failed recovery attempt; how long it has failed if the consumer is to be replaced now, else 0.

        Non-zero once the recovery has failed for ``after_s`` and ``ask(timeout)`` (metadata
        requests, raising KafkaException while a cluster does not answer) returned; at most
        once per ``after_s``.
        """
        now = self._clock()
        if self._since is None:
            self._since = now
            return 0.0
        failing = now - self._since
        if failing < self.after_s:
            return 0.0
        try:
            ask(PROBE_TIMEOUT_S)
        except KafkaException:
            return 0.0  # a cluster is away: wait it out
        self._since = now
        return failing

    def recovered(self) -> None:
        """The recovery succeeded: the next failure starts a new window."""
        self._since = None
