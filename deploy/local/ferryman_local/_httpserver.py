"""A child process serving HTTP on loopback (Prometheus, Zipkin): start, readiness, log tail, stop.

The child is spawned like the brokers (``_process``: its own process group,
forgotten on stop), so it never outlives the Python process that started it.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from ferryman_local._errors import HarnessError
from ferryman_local._process import forget, signal_group, spawn

#: Time a stopped server gets to close its files before SIGKILL.
_STOP_TIMEOUT_S = 15.0


class HttpServerProcess:
    """A running HTTP server child; subclasses name it, its health path and its start error."""

    #: Name in messages and of the log file (``<name>.log`` in the work dir).
    name: ClassVar[str]
    #: Path answering 200 once the server is ready.
    health_path: ClassVar[str]
    #: Between readiness polls: polling a child's HTTP port, there is nothing to block on.
    poll_s: ClassVar[float]
    #: Raised when the child exits at start or is not ready in time.
    start_error: ClassVar[type[HarnessError]]

    def __init__(self, proc: subprocess.Popen[bytes], url: str, work_dir: Path) -> None:
        self.proc = proc
        self.url = url
        """Base URL of the server (``http://127.0.0.1:<port>``)."""
        self.work_dir = work_dir

    @classmethod
    def _launch(
        cls, cmd: Sequence[str], work_dir: Path, port: int, ready_timeout_s: float, env: Mapping[str, str] | None = None
    ) -> Self:
        """Spawn cmd (serving on port) and return once it is ready; stopped again if it is not."""
        with (work_dir / f"{cls.name}.log").open("ab") as log:
            proc = spawn(list(cmd), cwd=work_dir, output=log, env=dict(env) if env else None)
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
                raise self.start_error(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.health_path}", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass  # not listening yet
            if time.monotonic() >= deadline:
                raise self.start_error(f"{self.name} not ready after {timeout_s:g} s:\n{self.log_tail()}")
            time.sleep(self.poll_s)

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's log."""
        path = self.work_dir / f"{self.name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after _STOP_TIMEOUT_S); idempotent."""
        signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            signal_group(self.proc, signal.SIGKILL)
            self.proc.wait(_STOP_TIMEOUT_S)
        forget(self.proc)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
