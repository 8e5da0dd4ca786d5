"""The Prometheus HTTP endpoint of a service: bound at start, served from a thread of its own.

The address is bound on the caller's thread, so a port in use stops the
service at start like its gRPC address does. Everything else happens on the
exporter's thread: importing ``prometheus_client`` (~50 ms, most of it the
standard library's HTTP modules, which nothing else of a service loads) while
the service connects to its clusters, then answering scrapes.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from ferryman.errors import ConfigError, FerrymanError

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

_log = logging.getLogger(__name__)

#: How often the serving thread looks for a stop request between scrapes when
#: stop()'s wake-up connection does not reach it. Ten wake-ups a second cost an
#: idle service 1 ms of CPU a second (0.1 %, measured); one costs a tenth of it.
_POLL_S = 1.0
#: Budget of stop()'s wake-up connection to the endpoint's own address.
_WAKE_TIMEOUT_S = 0.5
#: Longest wait for the serving thread to end at stop (a scrape in progress is
#: one status snapshot, milliseconds).
_JOIN_S = 2.0


class MetricsBindError(FerrymanError):
    """The metrics endpoint could not listen on its address (in use, not local)."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as (host, port); ``[::]`` is every address.

    Raises:
        ConfigError: not of that form, or the port not in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metrics address {address!r} is not host:port (e.g. '[::]:9460', '127.0.0.1:0')")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _bind(address: str) -> socket.socket:
    host, port = split_address(address)
    try:
        family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        dualstack = family == socket.AF_INET6 and host == "::" and socket.has_dualstack_ipv6()
        return socket.create_server(sockaddr[:2], family=family, dualstack_ipv6=dualstack)
    except OSError as exc:
        raise MetricsBindError(f"cannot serve metrics on {address} (metrics_address): {exc}") from exc


class MetricsExporter:
    """Serves one registry's metrics over HTTP from a daemon thread, from ``start()`` to ``stop()``.

    Also a context manager. Disabled (both calls do nothing) when the address is empty.
    """

    def __init__(self, address: str, registry: Callable[[], Collector], *, what: str) -> None:
        """Serve what registry() returns (called on the serving thread, once) on address."""
        self._address = address
        self._registry = registry
        self._what = what
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def port(self) -> int | None:
        """The bound port (after start; None when disabled)."""
        return self._port

    def start(self) -> None:
        """Bind the address and start serving on a thread of its own.

        Raises:
            ConfigError: the address is malformed.
            MetricsBindError: the address cannot be bound.
        """
        if not self._address or self._sock is not None:
            return
        self._sock = _bind(self._address)
        self._port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, name=f"{self._what}-metrics", daemon=True)
        self._thread.start()
        host = split_address(self._address)[0]
        _log.info("%s metrics on http://%s:%d/metrics", self._what, f"[{host}]" if ":" in host else host, self.port)

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            # Imported here, off the service's start-up path (see the module docstring).
            from prometheus_client.exposition import MetricsHandler  # noqa: PLC0415

            from ferryman.metrics._http import PreboundHttpServer  # noqa: PLC0415

            server = PreboundHttpServer(sock, MetricsHandler.factory(self._registry()), _POLL_S)
            while not self._stop.is_set():
                server.handle_request()  # returns after one scrape, or after _POLL_S without one
        except Exception:
            _log.exception("%s metrics endpoint stopped", self._what)
        finally:
            sock.close()

    def stop(self) -> None:
        """Stop serving and close the address (idempotent)."""
        self._stop.set()
        if self._thread is None or not self._thread.is_alive():
            return
        self._wake()
        self._thread.join(_JOIN_S)

    def _wake(self) -> None:
        """Connect to the endpoint once, so that its thread sees the stop now rather than after _POLL_S."""
        host, _ = split_address(self._address)
        if host in ("", "::", "0.0.0.0"):
            host = "::1" if host == "::" and not socket.has_dualstack_ipv6() else "127.0.0.1"
        try:
            with socket.create_connection((host, self._port or 0), timeout=_WAKE_TIMEOUT_S):
                pass  # an empty request: the handler reads nothing and returns
        except OSError:
            _log.debug("%s metrics endpoint not woken; it stops within %s s", self._what, _POLL_S)

    def __enter__(self) -> MetricsExporter:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
