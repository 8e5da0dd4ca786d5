"""toxiproxy (Shopify's TCP fault proxy) for chaos tests: the binary, the server, a typed client.

``ensure_toxiproxy()`` builds the server once with ``go install`` into
``$FERRYMAN_CACHE_DIR/toxiproxy-<version>/bin`` (outside git, like the broker
jars; ~20 s, a 15 MB binary). ``Toxiproxy.start(work_dir)`` runs it on a free
loopback port; its methods wrap the HTTP API: proxies (a listen address in
front of an upstream) and toxics on them (``timeout`` with 0 = a cut link,
``latency``, ``bandwidth``, ``slicer``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from ferryman_local._errors import HarnessError, ToolMissingError
from ferryman_local._maven import cache_dir
from ferryman_local._ports import reserve_port
from ferryman_local._process import forget, signal_group, spawn

TOXIPROXY_VERSION = "v2.12.0"
"""The toxiproxy release ``go install`` builds (pinned: the cache directory is named after it)."""

_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
# A cold build downloads the module and its dependencies and compiles them: ~20 s here, minutes on a slow link.
_BUILD_TIMEOUT_S = 600.0
# The server answers its HTTP API within ~0.1 s of starting; 10 s covers a loaded 2-core machine.
_START_TIMEOUT_S = 10.0
# One API call is a loopback round trip; 5 s only bounds a wedged server.
_API_TIMEOUT_S = 5.0

Stream = Literal["upstream", "downstream"]


class ToxiproxyError(HarnessError):
    """toxiproxy could not be built or started, or its API refused a request (the message says which)."""


def ensure_toxiproxy() -> Path:
    """Path of the toxiproxy server binary, built once with ``go install`` into the cache.

    Raises:
        ToolMissingError: the binary is not cached and ``go`` is not on ``PATH``.
        ToxiproxyError: the build failed (the message ends with Go's output).
    """
    target = cache_dir() / f"toxiproxy-{TOXIPROXY_VERSION}" / "bin"
    binary = target / "server"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise ToolMissingError(
            f"toxiproxy is not built ({binary} is missing) and go is not on PATH; install Go 1.22+ "
            f"(or run `GOBIN={target} go install {_MODULE}@{TOXIPROXY_VERSION}` on a machine that has it)"
        )
    target.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if binary.exists():  # another process built it while we waited
            return binary
        env = {**os.environ, "GOBIN": str(target)}
        try:
            result = subprocess.run(
                [go, "install", f"{_MODULE}@{TOXIPROXY_VERSION}"],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=_BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise ToxiproxyError(f"go install {_MODULE} did not finish within {_BUILD_TIMEOUT_S:.0f}s") from exc
        if result.returncode != 0 or not binary.exists():
            raise ToxiproxyError(
                f"go install {_MODULE}@{TOXIPROXY_VERSION} failed (exit {result.returncode}):\n"
                f"{(result.stdout + result.stderr)[-4000:]}"
            )
    return binary


@dataclass(frozen=True)
class Proxy:
    """One toxiproxy proxy: clients connect to ``listen_port``, it forwards to ``upstream``."""

    name: str
    listen_port: int
    upstream: str

    @property
    def address(self) -> str:
        """``127.0.0.1:<listen_port>``: where clients connect."""
        return f"127.0.0.1:{self.listen_port}"


class Toxiproxy:
    """A running toxiproxy server on loopback and a client for its HTTP API.

    Toxics (faults) are added per proxy and per direction (``downstream``: towards the
    client; ``upstream``: towards the server) and stay until removed or ``reset``.
    """

    def __init__(self, proc: subprocess.Popen[bytes], api_port: int, log: Path) -> None:
        """Use ``Toxiproxy.start``."""
        self._proc = proc
        self.api_port = api_port
        self.log = log
        self._proxies: dict[str, Proxy] = {}

    @classmethod
    def start(cls, work_dir: Path) -> Toxiproxy:
        """Build (once) and start a server whose API listens on a free loopback port.

        Raises:
            ToolMissingError: see ``ensure_toxiproxy``.
            ToxiproxyError: the build failed, or the server did not answer within 10 s.
        """
        binary = ensure_toxiproxy()
        work_dir.mkdir(parents=True, exist_ok=True)
        port = reserve_port()
        log = work_dir / "toxiproxy.log"
        with log.open("ab") as out:
            proc = spawn([str(binary), "-host", "127.0.0.1", "-port", str(port)], cwd=work_dir, output=out)
        server = cls(proc, port, log)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                server._call("GET", "/version")
                return server
            except ToxiproxyError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise ToxiproxyError(
                        f"toxiproxy did not serve its API on port {port}: {log.read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.05)  # the server binds within ~0.1 s: nothing to block on meanwhile

    def create_proxy(self, name: str, upstream: str, listen_port: int | None = None) -> Proxy:
        """Create (or replace) a proxy listening on ``listen_port`` (default a free one) in front of upstream."""
        port = listen_port if listen_port is not None else reserve_port()
        self._call("DELETE", f"/proxies/{name}", missing_ok=True)
        self._call(
            "POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream, "enabled": True}
        )
        proxy = Proxy(name, port, upstream)
        self._proxies[name] = proxy
        return proxy

    @property
    def proxies(self) -> dict[str, Proxy]:
        """The proxies this client created, by name."""
        return dict(self._proxies)

    def add_toxic(
        self,
        proxy: str,
        toxic_type: Literal["timeout", "latency", "bandwidth", "slicer", "reset_peer", "limit_data"],
        attributes: dict[str, int],
        *,
        stream: Stream = "downstream",
        name: str | None = None,
    ) -> str:
        """Add a toxic to one direction of a proxy; return its name (for ``remove_toxic``)."""
        toxic = name or f"{toxic_type}_{stream}"
        body = {"name": toxic, "type": toxic_type, "stream": stream, "toxicity": 1.0, "attributes": attributes}
        self._call("POST", f"/proxies/{proxy}/toxics", body)
        return toxic

    def cut(self, proxy: str) -> None:
        """Cut the link both ways until ``heal``: data stops, connections stay open.

        A ``timeout`` toxic with timeout 0 holds all data until removed, as a network partition
        does (no RST, no FIN): clients see requests time out, not connections refused.
        """
        self.add_toxic(proxy, "timeout", {"timeout": 0}, stream="downstream", name="cut_down")
        self.add_toxic(proxy, "timeout", {"timeout": 0}, stream="upstream", name="cut_up")

    def delay(self, proxy: str, latency_ms: int, jitter_ms: int = 0) -> None:
        """Delay data both ways by latency_ms (± jitter_ms)."""
        for stream in ("downstream", "upstream"):
            self.add_toxic(
                proxy, "latency", {"latency": latency_ms, "jitter": jitter_ms}, stream=stream, name=f"delay_{stream}"
            )

    def slow(self, proxy: str, rate_kb_s: int) -> None:
        """Limit the link to rate_kb_s KB/s both ways."""
        for stream in ("downstream", "upstream"):
            self.add_toxic(proxy, "bandwidth", {"rate": rate_kb_s}, stream=stream, name=f"slow_{stream}")

    def remove_toxic(self, proxy: str, toxic: str) -> None:
        """Remove one toxic (a missing one is fine)."""
        self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic}", missing_ok=True)

    def heal(self, proxy: str) -> None:
        """Remove every toxic of one proxy."""
        for toxic in self._call("GET", f"/proxies/{proxy}/toxics") or []:
            self.remove_toxic(proxy, str(toxic["name"]))

    def reset(self) -> None:
        """Remove every toxic of every proxy and enable them all (toxiproxy's ``/reset``)."""
        self._call("POST", "/reset")

    def stop(self) -> None:
        """Stop the server. Idempotent."""
        signal_group(self._proc, signal.SIGKILL)
        self._proc.wait(10)
        forget(self._proc)

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, missing_ok: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=_API_TIMEOUT_S) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return None
            raise ToxiproxyError(f"toxiproxy {method} {path}: HTTP {exc.code} {exc.read()[:500]!r}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {exc}") from exc
        return json.loads(payload) if payload.strip() else None
