"""A small TCP proxy on 127.0.0.1 for fault injection between a client and a server.

``cut()`` resets (RST) every connection going through the proxy and resets
every new one until ``restore()``: what a client sees when a firewall or the
network drops the link. One thread multiplexes all sockets with a selector;
``cut()`` and ``stop()`` hand their work to it and wait for it to be done, so
callers never sleep.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType

#: Bytes read at once, and the most buffered toward one side before reading
#: from the other pauses (backpressure instead of unbounded memory).
_CHUNK = 64 * 1024
_MAX_BUFFERED = 1024 * 1024

#: Longest wait for the proxy thread to carry out a command; it only ever
#: blocks in select(), so a healthy thread answers in microseconds.
_COMMAND_TIMEOUT_S = 5.0

#: SO_LINGER on with a zero timeout: close() sends RST instead of FIN.
_LINGER_RST = struct.pack("ii", 1, 0)


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already dead: close() is all that is left to do
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.close()


@dataclass(eq=False)
class _Side:
    """One socket of a link, with the bytes waiting to be written to it."""

    sock: socket.socket
    pending: bytearray = field(default_factory=bytearray)
    read_eof: bool = False
    write_shut: bool = False
    events: int = 0
    """Selector events registered for sock (0: not registered)."""


@dataclass(eq=False)
class _Link:
    client: _Side
    upstream: _Side

    def peer(self, side: _Side) -> _Side:
        return self.upstream if side is self.client else self.client


class TcpProxy:
    """Forwards connections from ``127.0.0.1:<port>`` to an upstream address.

    Use: ``with TcpProxy(host, port).start() as proxy: ... proxy.port ...``.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, connect_timeout_s: float = 5.0) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._cut = False
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._commands: queue.Queue[tuple[str, threading.Event]] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._links: set[_Link] = set()
        self._error: BaseException | None = None
        self.accepted = 0
        """Connections accepted since start (refused ones during a cut included)."""

    @property
    def port(self) -> int:
        """The local port clients connect to."""
        if self._listener is None:
            raise RuntimeError("the proxy is not started")
        port: int = self._listener.getsockname()[1]
        return port

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, ready for a gRPC target."""
        return f"127.0.0.1:{self.port}"

    @property
    def is_cut(self) -> bool:
        """True between cut() and restore()."""
        with self._lock:
            return self._cut

    def start(self) -> TcpProxy:
        """Listen and start forwarding; returns self."""
        if self._thread is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def cut(self) -> None:
        """Reset every open connection, and every new one until restore(). Returns once they are reset."""
        with self._lock:
            self._cut = True
        self._command("cut")

    def restore(self) -> None:
        """Forward new connections again (the ones reset by cut() stay closed)."""
        with self._lock:
            self._cut = False

    def stop(self) -> None:
        """Reset every connection, stop listening and end the proxy thread. Idempotent.

        Raises:
            RuntimeError: the proxy thread had failed (with its error as the cause).
        """
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._command("stop")
            thread.join(_COMMAND_TIMEOUT_S)
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the TCP proxy thread failed") from error

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the proxy thread ----------------------------------------------------------------------------------------

    def _command(self, name: str) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        done = threading.Event()
        self._commands.put((name, done))
        self._wake_w.send(b"x")
        if not done.wait(_COMMAND_TIMEOUT_S):
            raise RuntimeError(f"the TCP proxy thread did not carry out {name!r}")

    def _run(self) -> None:
        try:
            while self._serve_once():
                pass
        except BaseException as exc:
            self._error = exc
        finally:
            for link in list(self._links):
                self._drop(link)
            self._selector.close()
            if self._listener is not None:
                self._listener.close()
            self._wake_r.close()
            self._wake_w.close()
            while not self._commands.empty():  # nobody waits forever on a dead thread
                self._commands.get_nowait()[1].set()

    def _serve_once(self) -> bool:
        for key, mask in self._selector.select():
            if key.data == "wake":
                if not self._handle_commands():
                    return False
            elif key.data == "accept":
                self._accept()
            else:
                link, side = key.data
                if link in self._links:
                    self._pump(link, side, mask)
        return True

    def _handle_commands(self) -> bool:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(_CHUNK)
        keep_going = True
        while True:
            try:
                name, done = self._commands.get_nowait()
            except queue.Empty:
                return keep_going
            for link in list(self._links):
                self._drop(link)
            if name == "stop":
                keep_going = False
            done.set()

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        self.accepted += 1
        with self._lock:
            cut = self._cut
        if cut:
            _reset(conn)
            return
        try:
            upstream = socket.create_connection(self._upstream, timeout=self._connect_timeout_s)
        except OSError:
            _reset(conn)  # upstream down: the client sees a reset, as it would without the proxy
            return
        for sock in (conn, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(_Side(conn), _Side(upstream))
        self._links.add(link)
        for side in (link.client, link.upstream):
            self._watch(link, side)

    def _pump(self, link: _Link, side: _Side, mask: int) -> None:
        peer = link.peer(side)
        try:
            if mask & selectors.EVENT_READ:
                data = side.sock.recv(_CHUNK)
                if data:
                    peer.pending += data
                else:
                    side.read_eof = True
            if mask & selectors.EVENT_WRITE and side.pending:
                sent = side.sock.send(side.pending)
                del side.pending[:sent]
            for s in (side, peer):
                # s.pending holds what was read from its peer: once the peer
                # ended and all of it is written, pass the half-close on.
                if link.peer(s).read_eof and not s.pending and not s.write_shut:
                    s.sock.shutdown(socket.SHUT_WR)
                    s.write_shut = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(link)  # one side reset or failed: reset the other as well
            return
        if link.client.write_shut and link.upstream.write_shut:
            self._drop(link, graceful=True)
            return
        for s in (side, peer):
            self._watch(link, s)

    def _watch(self, link: _Link, side: _Side) -> None:
        """Register the events side now needs: reads unless EOF or backpressure, writes while bytes wait."""
        events = 0
        if not side.read_eof and len(link.peer(side).pending) < _MAX_BUFFERED:
            events |= selectors.EVENT_READ
        if side.pending:
            events |= selectors.EVENT_WRITE
        if events == side.events:
            return
        if side.events == 0:
            self._selector.register(side.sock, events, (link, side))
        elif events == 0:
            self._selector.unregister(side.sock)
        else:
            self._selector.modify(side.sock, events, (link, side))
        side.events = events

    def _drop(self, link: _Link, *, graceful: bool = False) -> None:
        """Forget link and close both sockets: with RST, unless both directions already ended cleanly."""
        self._links.discard(link)
        for side in (link.client, link.upstream):
            if side.events:
                self._selector.unregister(side.sock)
                side.events = 0
            if graceful:
                side.sock.close()
            else:
                _reset(side.sock)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
