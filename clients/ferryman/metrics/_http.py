"""The HTTP server class of the metrics endpoint, imported on the exporter's thread (see ``_server``)."""

from __future__ import annotations

import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_log = logging.getLogger(__name__)


class PreboundHttpServer(ThreadingHTTPServer):
    """An HTTP server on a socket already bound and listening; ``handle_request()`` waits at most poll_s."""

    def __init__(self, sock: socket.socket, handler: type[BaseHTTPRequestHandler], poll_s: float) -> None:
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # the unbound socket the constructor made
        self.socket = sock
        self.timeout = poll_s

    def handle_error(self, request: object, client_address: object) -> None:
        """Log a failed scrape (the standard library prints its traceback to stderr)."""
        _log.warning("metrics scrape from %s failed", client_address, exc_info=True)
