"""Prometheus's own tools for tests: promtool, and a real Prometheus server on loopback (``LocalPrometheus``)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ferryman_local import LocalPrometheus


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool with args; the result, whatever its exit status. Fails the test when promtool is missing."""
    path = shutil.which("promtool")
    assert path is not None, "promtool is not on PATH: scripts/bootstrap installs it (apt-get install prometheus)"
    return subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)


@contextlib.contextmanager
def running_prometheus(
    work_dir: Path, jobs: Mapping[str, Sequence[str]], *, scrape_interval_s: float = 1.0
) -> Iterator[LocalPrometheus]:
    """A Prometheus server on a free loopback port scraping jobs (name -> ``host:port`` targets); stopped on exit."""
    with LocalPrometheus.start(work_dir, jobs, scrape_interval_s=scrape_interval_s) as server:
        yield server
