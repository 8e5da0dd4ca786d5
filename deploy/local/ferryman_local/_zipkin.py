"""A local Zipkin server (the ``io.zipkin:zipkin-server`` exec jar from Maven Central) for traces.

For the demo (``--observe``) and the tracing tests: the jar is resolved once
with ``mvn dependency:copy`` into the download cache (like the broker jars,
``_maven``), started with in-memory storage on a free loopback port, and read
back through its HTTP API (``/api/v2/trace/<id>``). The child is spawned like
the brokers (``_process``), so it never outlives the Python process that
started it.
"""

from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from ferryman_local._errors import JarResolutionError, ZipkinStartError
from ferryman_local._maven import cache_dir, require_tool
from ferryman_local._ports import reserve_port
from ferryman_local._process import forget, signal_group, spawn

ZIPKIN_VERSION = "3.5.1"
"""The Zipkin server release (an exec jar: the server and its UI in one file)."""
#: Zipkin answers /health ~15 s after start on an idle machine, ~40 s with 2 busy cores, and took over 4 min
#: once here with a load average of 70 (Spring Boot start-up is CPU-bound): a generous budget, not a wait.
READY_TIMEOUT_S = 600.0
_STOP_TIMEOUT_S = 15.0
_API_TIMEOUT_S = 10.0
#: The exec jar is ~80 MB; cold it downloads in well under this.
_RESOLVE_TIMEOUT_S = 600.0


def ensure_zipkin_jar() -> Path:
    """The Zipkin server exec jar, resolved from Maven Central once (cached, locked like the broker jars).

    Raises:
        ToolMissingError: ``java`` or ``mvn`` is not on ``PATH``.
        JarResolutionError: Maven failed; the message ends with its output.
    """
    require_tool("java")
    target = cache_dir() / f"zipkin-{ZIPKIN_VERSION}"
    jar = target / f"zipkin-server-{ZIPKIN_VERSION}-exec.jar"
    if jar.exists():
        return jar
    target.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if jar.exists():
            return jar
        partial = target / "partial"
        cmd = [
            require_tool("mvn"),
            "-q",
            "-B",
            "dependency:copy",
            f"-Dartifact=io.zipkin:zipkin-server:{ZIPKIN_VERSION}:jar:exec",
            f"-DoutputDirectory={partial}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=_RESOLVE_TIMEOUT_S)
        got = partial / jar.name
        if result.returncode != 0 or not got.exists():
            tail = (result.stdout + result.stderr)[-4000:]
            raise JarResolutionError(
                f"Maven could not resolve Zipkin {ZIPKIN_VERSION} (exit {result.returncode})\n{tail}"
            )
        got.replace(jar)  # atomic: the jar's presence means it is complete
    return jar


class LocalZipkin:
    """A running Zipkin server: ``start()``, its API, ``stop()`` (also a context manager)."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, work_dir: Path) -> None:
        self.proc = proc
        self.url = url
        """Base URL (``http://127.0.0.1:<port>``); the UI is under ``/zipkin/``."""
        self.work_dir = work_dir

    @property
    def spans_endpoint(self) -> str:
        """Where exporters send spans (Zipkin's JSON v2 API): ``tracing.endpoint`` for ``exporter: zipkin``."""
        return f"{self.url}/api/v2/spans"

    def ui_url(self, trace_id: str) -> str:
        """The UI page of one trace."""
        return f"{self.url}/zipkin/traces/{trace_id}"

    @classmethod
    def start(cls, work_dir: Path, *, ready_timeout_s: float = READY_TIMEOUT_S) -> LocalZipkin:
        """Start a server (in-memory storage) on a free loopback port; ready on return.

        Raises:
            ToolMissingError, JarResolutionError: see ensure_zipkin_jar.
            ZipkinStartError: it exited, or did not answer ``/health`` within ready_timeout_s.
        """
        jar = ensure_zipkin_jar()
        work_dir.mkdir(parents=True, exist_ok=True)
        port = reserve_port()
        cmd = [
            require_tool("java"),
            "-Xmx256m",
            # C1 only and the serial collector: a faster, lighter start for a short-lived test server.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-jar",
            str(jar),
            f"--server.port={port}",
            "--server.address=127.0.0.1",
            "--logging.level.root=WARN",
        ]
        with (work_dir / "zipkin.log").open("ab") as log:
            proc = spawn(cmd, cwd=work_dir, output=log, env={"STORAGE_TYPE": "mem"})
        server = cls(proc, f"http://127.0.0.1:{port}", work_dir)
        try:
            server._wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ZipkinStartError(f"zipkin exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass  # not listening yet
            if time.monotonic() >= deadline:
                raise ZipkinStartError(f"zipkin not ready after {timeout_s:g} s:\n{self.log_tail()}")
            time.sleep(0.5)  # polling a child's HTTP port: nothing to block on

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's log."""
        path = self.work_dir / "zipkin.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=_API_TIMEOUT_S) as response:
            return json.load(response)

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans of one trace (Zipkin v2 JSON), empty when Zipkin has none."""
        try:
            spans: list[dict[str, Any]] = self._get(f"/api/v2/trace/{trace_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        return spans

    def services(self) -> list[str]:
        """Service names Zipkin has spans of."""
        names: list[str] = self._get("/api/v2/services")
        return names

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); idempotent."""
        signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            signal_group(self.proc, signal.SIGKILL)
            self.proc.wait(_STOP_TIMEOUT_S)
        forget(self.proc)

    def __enter__(self) -> LocalZipkin:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
