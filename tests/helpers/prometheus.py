"""Prometheus's own tools for tests: promtool, and a real Prometheus server on loopback."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from ferryman_local import reserve_port

from tests.helpers.kafka import wait_until

#: Installed by scripts/bootstrap (Debian's prometheus package: the server and promtool).
_INSTALL_HINT = "not on PATH: scripts/bootstrap installs it (apt-get install prometheus)"
#: A Prometheus server answers /-/ready within ~1 s here; TSDB start-up on a slow disk can take longer.
_READY_TIMEOUT_S = 30.0


def tool(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; fails the test when it is missing (CI must have it)."""
    path = shutil.which(name)
    assert path is not None, f"{name} {_INSTALL_HINT}"
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool with args; the result, whatever its exit status."""
    return subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)


@dataclass
class PrometheusServer:
    """A running Prometheus server and its HTTP API."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of expr (``/api/v1/query``): a list of ``{"metric": {...}, "value": [t, "v"]}``."""
        params = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single value expr evaluates to, or None when it selects nothing (fails on several series)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr} selects {len(result)} series: {result}"
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> dict[str, str]:
        """Health of every active target, by job (``up``, ``down``, ``unknown``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=10) as response:
            body = json.load(response)
        return {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}


@contextlib.contextmanager
def running_prometheus(
    work_dir: Path, jobs: Mapping[str, Sequence[str]], *, scrape_interval_s: float = 1.0
) -> Iterator[PrometheusServer]:
    """A Prometheus server on a free loopback port scraping jobs (name -> ``host:port`` targets); stopped on exit."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": f"{scrape_interval_s:g}s", "evaluation_interval": f"{scrape_interval_s:g}s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()
        ],
    }
    config_path = work_dir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = reserve_port()
    log = work_dir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log)
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"prometheus exited: {log.read_text(errors='replace')[-2000:]}"
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(ready, timeout_s=_READY_TIMEOUT_S, interval_s=0.2, message="prometheus ready")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
