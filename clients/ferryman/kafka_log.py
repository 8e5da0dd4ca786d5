"""librdkafka's own log lines, through Python logging, without the flood.

Without a logger, librdkafka prints to stderr: one line per failed connection
attempt of every client (581 lines in 30 s were seen with one cluster down at
start-up). With this one (the ``logger`` client property), its lines go to
``ferryman.librdkafka``: connection failures at DEBUG (``ClusterHealth`` logs
one line per outage instead), as the warnings that a producer's property is ignored by a consumer (or the
reverse: a cluster's ``client_config`` goes to both), and any other line at most once per
``REPEAT_INTERVAL_S``, with the count of repeats it stood for.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

_log = logging.getLogger("ferryman.librdkafka")

#: A repeated line is logged again after this long (with the count it stood for).
REPEAT_INTERVAL_S = 30.0
#: Facilities of connection-state lines (a broker down, a connection closed).
_CONNECTION_FACILITIES = frozenset({"FAIL", "BROKERFAIL", "REBOOTSTRAP"})
#: The facility of a consumer's line saying its group session timed out (it then rejoins).
SESSION_TIMEOUT_FACILITY = "SESSTMOUT"
#: What a CONFWARN line says of a property for clients of the other role ("... is a producer property and
#: will be ignored by this consumer instance"): expected, since a cluster's client_config goes to every client.
_OTHER_ROLES_PROPERTY = "property and will be ignored by this"
#: A transactional producer's line naming the partition whose produce request failed the transaction, and why
#: (the exception raised at the commit names neither the topic nor the partition).
_PRODUCE_FAILED = re.compile(r"ProduceRequest for (\S+) \[(\d+)\] with \d+ message\(s\) failed: (.+?) \(broker ")
#: Numbers in a line (ms, counts, ports) vary between repeats of the same event.
_NUMBERS = re.compile(r"\d+")


class RepeatFilter:
    """Lets the first line of a kind through, then one per interval with the count held back (thread-safe).

    Shared by librdkafka's log lines (`LibrdkafkaLog`) and the clients' error events (``ClusterHealth``).
    """

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] | None = None) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, tuple[float, int]] = {}

    def admit(self, key: Hashable) -> tuple[int, float] | None:
        """Whether to let this one through.

        Returns:
            None to hold it back; else how many were held back since the last one let through and how long
            ago that was (0 and 0.0 for the first of its kind).
        """
        now = self._clock() if self._clock is not None else time.monotonic()  # looked up per call: tests patch it
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last[0] < self._interval_s:
                self._last[key] = (last[0], last[1] + 1)
                return None
            self._last[key] = (now, 0)
        return (0, 0.0) if last is None else (last[1], now - last[0])


class LibrdkafkaLog:
    """The object given as a client's ``logger``: confluent-kafka calls ``log(level, fmt, *args)``.

    Hooks, called before any filtering: ``on_session_timeout`` on each of a consumer's session-timeout lines
    (``FenceWindow`` tells its own rejoin's fence by it); ``on_produce_failed(topic, partition, reason)`` on
    each of a transactional producer's lines saying a produce request failed the transaction (the deduper
    names the partition of a record the destination refuses by it; ``reason`` is the error's text).
    """

    def __init__(
        self,
        cluster: str,
        on_session_timeout: Callable[[], None] | None = None,
        *,
        on_produce_failed: Callable[[str, int, str], None] | None = None,
    ) -> None:
        self._cluster = cluster
        self._on_session_timeout = on_session_timeout
        self._on_produce_failed = on_produce_failed
        self._repeats = RepeatFilter()

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """One librdkafka line (args: facility, client name, message)."""
        facility = str(args[0]) if args else ""
        if facility == SESSION_TIMEOUT_FACILITY and self._on_session_timeout is not None:
            self._on_session_timeout()
        text = fmt % args if args else fmt
        if facility == "TXNERR" and self._on_produce_failed is not None:
            failed = _PRODUCE_FAILED.search(text)
            if failed is not None:
                self._on_produce_failed(failed[1], int(failed[2]), failed[3])
        if facility in _CONNECTION_FACILITIES or "Connect to" in text or "brokers are down" in text:
            level = logging.DEBUG
        elif facility == "CONFWARN" and _OTHER_ROLES_PROPERTY in text:
            level = logging.DEBUG  # a cluster's client_config serves its producers and consumers alike
        if not _log.isEnabledFor(level):
            return
        if level < logging.WARNING:
            _log.log(level, "%s: %s", self._cluster, text)
            return
        key = _NUMBERS.sub("#", f"{facility} {args[2] if len(args) > 2 else text}")
        admitted = self._repeats.admit(key)
        if admitted is None:
            return
        repeats = admitted[0]
        suffix = f" (and {repeats} more like it in the last {REPEAT_INTERVAL_S:.0f} s)" if repeats else ""
        _log.log(level, "%s: %s%s", self._cluster, text, suffix)
