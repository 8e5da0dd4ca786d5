"""Loopback ports for brokers and services that must be known before they bind."""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

from ferryman_local._errors import ClusterStartError, HarnessError

_ports_lock = threading.Lock()
_ports_handed_out: set[int] = set()

SHARD_ENV = "FERRYMAN_LOCAL_PORT_SHARD"
"""``index/count``: this process (and its children) take only ports p with p % count == index.

Processes that reserve ports side by side (the test workers) set it so that none hands out a port another
has reserved but not yet bound: a broker binds its ports only after its JVM has started, seconds later."""


def _shard() -> tuple[int, int]:
    """(index, count) from SHARD_ENV; (0, 1) when it is not set."""
    value = os.environ.get(SHARD_ENV, "")
    if not value:
        return 0, 1
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise HarnessError(f"{SHARD_ENV}={value!r}: expected index/count with 0 <= index < count, e.g. 0/2")
    return index, count


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def port_free(port: int) -> bool:
    """True if a listener could bind port on 127.0.0.1 now (as the broker does: with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A free port on 127.0.0.1, never the same twice in this process.

    Ports are drawn below the kernel's ephemeral range when it is known: there,
    no outgoing client connection can take the port in the moment between this
    check and the broker binding it (nor again while the broker restarts).
    With ``FERRYMAN_LOCAL_PORT_SHARD`` set, only this process's share of them.
    """
    low = _ephemeral_low()
    index, count = _shard()
    with _ports_lock:
        for _ in range(200 * count):
            if low > 12000:
                port = random.randint(10000, low - 1)
            else:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", 0))
                    port = int(s.getsockname()[1])
            if port % count != index or port in _ports_handed_out or not port_free(port):
                continue
            _ports_handed_out.add(port)
            return port
    raise ClusterStartError("no free port found on 127.0.0.1")
