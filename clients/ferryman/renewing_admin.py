"""An AdminClient that is replaced when it stops answering while a new one to the same cluster answers.

Why: a chaos run (2026-12-05, seed 20261223) met a wrapper whose source ``AdminClient`` answered nothing
after a source broker's restart, for minutes (every describe "no answer within 30 s", metadata "Broker
transport failure", its threads parked in ``rd_kafka_broker_any_usable``), while a new client on the same
bootstrap answered at once. Everything the wrapper does at the source besides consuming (topic discovery,
preparing assigned partitions, the probe that tells an orphaned consumer from a source away) went through
that one client, so the flow never recovered. librdkafka has no call that resets a client's broker state;
the workaround its users report is a new client.

How: callers take `RenewingAdmin.client` for each use and call `suspect()` when a call failed on a
transient fault; a failed metadata refresh of a held client (`ferryman.controller`, which every admin
request waiting past its controller wait sets off) suspects it too, through `suspect_client()`. A check
then runs on a daemon thread, at most once per ``check_interval_s``: the client is asked for metadata; if
it answers, nothing changes (the cluster had been away, or the failure was something else). If it does
not, a candidate (made once and kept across checks) is asked; if that one answers and the client still
gets no answer within librdkafka's longest reconnect backoff (a client right after an outage may only be
waiting to reconnect: a chaos run replaced one at nearly every source broker restart before this), the
candidate becomes the client, and the old one is parked, never destroyed (a destroy may not return, see
`ferryman.watchdog.park`). While neither answers the cluster is away: both are kept, and the next failure checks again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ferryman.watchdog import park

_log = logging.getLogger(__name__)

#: Each held client's holder, by the client's id (clients replaced are parked, so no id is reused).
_HOLDERS: dict[int, RenewingAdmin] = {}
_HOLDERS_LOCK = threading.Lock()

#: Shortest time between two checks.
CHECK_INTERVAL_S = 30.0

#: How long a check waits for each client's metadata.
PROBE_TIMEOUT_S = 5.0

#: How long the client gets to answer once a new one has: past librdkafka's longest reconnect backoff
#: (``reconnect.backoff.max.ms``, 10 s), so a client merely waiting to reconnect after an outage answers.
CONFIRM_TIMEOUT_S = 15.0


def answers(client: AdminClient, timeout_s: float) -> bool:
    """Whether client gets the cluster's metadata, with at least one broker, within timeout_s."""
    try:
        return bool(client.list_topics(timeout=timeout_s).brokers)
    except KafkaException:
        return False


def suspect_client(client: AdminClient) -> None:
    """A call on client failed on a transient fault: if a `RenewingAdmin` holds it, that holder checks it."""
    with _HOLDERS_LOCK:
        holder = _HOLDERS.get(id(client))
    if holder is not None:
        holder.suspect()


class RenewingAdmin:
    """Holds one AdminClient for a cluster, and replaces it when it alone stops answering (any thread)."""

    def __init__(
        self,
        make: Callable[[], AdminClient],
        *,
        what: str,
        check_interval_s: float = CHECK_INTERVAL_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
    ) -> None:
        """Make the first client now.

        Args:
            make: A new client for the cluster (its configuration, its own broker handles).
            what: The client's name in log lines (e.g. "the source admin client").
            check_interval_s: Shortest time between two checks.
            probe_timeout_s: How long a check waits for each client's metadata.
            confirm_timeout_s: How long the client gets to answer once a new one has.
        """
        self._make = make
        self._what = what
        self._interval_s = check_interval_s
        self._probe_s = probe_timeout_s
        self._confirm_s = confirm_timeout_s
        self._client = make()
        _hold(self._client, self)
        self._candidate: AdminClient | None = None
        self._lock = threading.Lock()
        self._checking = False
        self._next_check = 0.0
        #: Times the client was replaced (status and tests).
        self.renewals = 0

    @property
    def client(self) -> AdminClient:
        """The client to use now (take it for each use: it may be replaced between two)."""
        return self._client

    def suspect(self) -> None:
        """A call on the client failed on a transient fault: check it on a thread of its own, if one is due."""
        with self._lock:
            now = time.monotonic()
            if self._checking or now < self._next_check:
                return
            self._checking, self._next_check = True, now + self._interval_s
        threading.Thread(target=self._check_then_release, name="ferryman-admin-check", daemon=True).start()

    def check(self) -> bool:
        """Check the client now (on the calling thread); True when it was replaced."""
        if answers(self._client, self._probe_s):
            return False
        if self._candidate is None:
            self._candidate = self._make()
        if not answers(self._candidate, self._probe_s):
            _log.info("%s and a new one both get no answer: the cluster is away; waiting it out", self._what)
            return False
        # Right after an outage the client may only be waiting out its reconnect backoff: give it that long.
        if answers(self._client, self._confirm_s):
            return False
        old, self._client, self._candidate = self._client, self._candidate, None
        _hold(self._client, self)
        with _HOLDERS_LOCK:
            _HOLDERS.pop(id(old), None)
        park(old)
        self.renewals += 1
        _log.warning("replaced %s: it got no answer while a new one to the same cluster did", self._what)
        return True

    def _check_then_release(self) -> None:
        try:
            self.check()
        except Exception:  # a daemon thread: log, and let the next failure check again
            _log.exception("checking %s failed", self._what)
        finally:
            with self._lock:
                self._checking = False


def _hold(client: AdminClient, holder: RenewingAdmin) -> None:
    with _HOLDERS_LOCK:
        _HOLDERS[id(client)] = holder
