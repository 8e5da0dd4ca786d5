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
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ferryman_local._errors import JarResolutionError, ZipkinStartError
from ferryman_local._httpserver import HttpServerProcess
from ferryman_local._maven import cache_dir, require_tool
from ferryman_local._ports import reserve_port

ZIPKIN_VERSION = "3.5.1"
"""The Zipkin server release (an exec jar: the server and its UI in one file)."""
#: Zipkin answers /health ~15 s after start on an idle machine, ~40 s with 2 busy cores, and took over 4 min
#: once here with a load average of 70 (Spring Boot start-up is CPU-bound): a generous budget, not a wait.
READY_TIMEOUT_S = 600.0
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


class LocalZipkin(HttpServerProcess):
    """A running Zipkin server: ``start()``, its API (the UI is under ``/zipkin/``), ``stop()``; a context manager."""

    name = "zipkin"
    health_path = "/health"
    poll_s = 0.5
    start_error = ZipkinStartError

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
        return cls._launch(cmd, work_dir, port, ready_timeout_s, env={"STORAGE_TYPE": "mem"})

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
