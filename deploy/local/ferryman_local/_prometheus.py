"""A local Prometheus server (Debian's ``prometheus`` binary) scraping Ferryman processes on loopback.

For the demo (``ferryman-demo --observe``) and the tests: a generated scrape
configuration, a data directory of its own, a free port, and the HTTP query
API. The child is spawned like the brokers (``_process``), so it never
outlives the Python process that started it.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ferryman_local._errors import PrometheusStartError, ToolMissingError
from ferryman_local._httpserver import HttpServerProcess
from ferryman_local._ports import reserve_port

#: A Prometheus server answers /-/ready ~1 s after start here; a slow disk delays its TSDB.
READY_TIMEOUT_S = 30.0
#: Budget of one API call (a local server answers in milliseconds).
_API_TIMEOUT_S = 10.0


class LocalPrometheus(HttpServerProcess):
    """A running Prometheus server: ``start()``, the query API, ``stop()`` (also a context manager)."""

    name = "prometheus"
    health_path = "/-/ready"
    poll_s = 0.2
    start_error = PrometheusStartError

    @classmethod
    def start(
        cls,
        work_dir: Path,
        jobs: Mapping[str, Sequence[str]],
        *,
        scrape_interval_s: float = 1.0,
        rule_files: Sequence[Path] = (),
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> LocalPrometheus:
        """Start a server on a free loopback port scraping jobs (name -> ``host:port`` targets); ready on return.

        Raises:
            ToolMissingError: ``prometheus`` is not on PATH.
            PrometheusStartError: it exited, or did not answer ``/-/ready`` within ready_timeout_s.
        """
        binary = shutil.which("prometheus")
        if binary is None:
            raise ToolMissingError("prometheus is not on PATH (Debian: apt-get install prometheus; scripts/bootstrap)")
        # Absolute: the server runs in work_dir, where a relative --config.file would name work_dir/work_dir/...
        # (the demo's default --dir is relative).
        work_dir = work_dir.resolve()
        work_dir.mkdir(parents=True, exist_ok=True)
        interval = f"{scrape_interval_s:g}s"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p.resolve()) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()
            ],
        }
        config_path = work_dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = reserve_port()
        cmd = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        return cls._launch(cmd, work_dir, port, ready_timeout_s)

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=_API_TIMEOUT_S) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of expr: ``[{"metric": {...labels}, "value": [time, "value"]}, ...]``."""
        result: list[dict[str, Any]] = self._get("/api/v1/query", {"query": expr})["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The one value expr evaluates to now, or None when it selects nothing.

        Raises:
            ValueError: expr selects more than one series.
        """
        result = self.query(expr)
        if len(result) > 1:
            raise ValueError(f"{expr} selects {len(result)} series: {result}")
        return float(result[0]["value"][1]) if result else None

    def target_health(self) -> dict[str, list[str]]:
        """Health of the active targets by job: ``up``, ``down`` or ``unknown`` (not scraped yet) each."""
        out: dict[str, list[str]] = {}
        for target in self._get("/api/v1/targets", {"state": "active"})["activeTargets"]:
            out.setdefault(target["labels"]["job"], []).append(target["health"])
        return out
