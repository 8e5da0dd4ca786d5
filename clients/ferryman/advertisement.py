"""Deduper advertisements: how wrappers find a flow's dedupers without an address list.

Each deduper writes a ``DeduperAdvertisement`` (its gRPC address as wrappers should dial it)
to the flow's compacted ``dedupers`` topic in the destination cluster, keyed by its instance
id, when it starts and every ``advertise_interval_s`` after, and a tombstone when it stops
cleanly. A wrapper reads the topic from the beginning and links to every deduper whose last
advertisement is recent (`is_live`). The deduper writes it (``ferryman_deduper._advertise``),
the wrapper reads it (``ferryman_wrapper._discovery``); this module is the contract between them.
"""

from __future__ import annotations

import socket

from ferryman.naming import FlowNames
from ferryman.state import COMPACTED_TOPIC_CONFIGS
from ferryman.topics import InternalTopic
from ferryman.v1 import state_pb2

#: An advertisement this many heartbeat intervals old is a deduper's that is gone: a crashed
#: deduper writes no tombstone. Three intervals ride out a late heartbeat or two (a slow
#: destination, a producer retry) without dropping a live deduper's link.
LIVENESS_INTERVALS = 3

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def dedupers_topic(names: FlowNames) -> InternalTopic:
    """The flow's dedupers topic: one partition (a handful of small records), compacted by instance id."""
    return InternalTopic(names.dedupers_topic, 1, COMPACTED_TOPIC_CONFIGS, "dedupers")


def is_live(ad: state_pb2.DeduperAdvertisement, now_ms: int) -> bool:
    """True when ad was written within `LIVENESS_INTERVALS` heartbeat intervals of now_ms.

    Compares wall clocks of two hosts: they are assumed to agree within an interval (NTP).
    """
    return now_ms - ad.heartbeat_at_ms <= LIVENESS_INTERVALS * max(ad.heartbeat_interval_ms, 1)


def advertised_address(configured: str | None, listen_address: str, bound_port: int) -> str:
    """The address a deduper advertises (``advertised_address``, as Kafka's ``advertised.listeners``).

    Args:
        configured: the ``advertised_address`` setting; used as it is when set.
        listen_address: the gRPC listen address (``host:port``, ``[v6]:port``).
        bound_port: the port the server bound (the one to advertise for a listen port of 0).

    Returns:
        ``host:port``: the listen host, or this machine's host name for a wildcard host; the
        listen port, or bound_port for port 0.
    """
    if configured:
        return configured
    host, _, port = listen_address.rpartition(":")
    if host in _WILDCARD_HOSTS:
        host = socket.gethostname()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal needs brackets before a port
    return f"{host}:{bound_port if port in ('', '0') else port}"
