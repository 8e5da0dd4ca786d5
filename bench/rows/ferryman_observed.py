"""Rows ``ferryman-bare``, ``ferryman-trace1``, ``ferryman-trace100``: the cost of metrics and tracing.

The same pair as row ``ferryman`` (which runs with metrics on and tracing off), with:

* ``ferryman-bare``: metrics endpoints off, tracing off: the baseline;
* ``ferryman-tracedefault``: metrics on, records traced at the default ``tracing.sampler_ratio``;
* ``ferryman-trace1``: metrics on, 1 % of records traced (issue 26's goal; the default ratio is 0.01 %);
* ``ferryman-trace01`` / ``ferryman-trace10``: metrics on, 0.1 % / 10 % traced (with the others, a sweep
  that tells the cost per traced record from the cost of what a traced record in a batch sets off);
* ``ferryman-trace100``: metrics on, every record traced.

Each runs a flow of its own (``variant``): rows of one round that shared the flow would share its staging
topic, consumer groups and destination topics, and the second would find the copy already done.

Spans go to a file in the row's work directory (the ``file`` exporter: a real export
pipeline without a backend to run beside the bench). The bench's records carry no
headers, so every traced record starts a trace of its own at the wrapper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ferryman.config import TracingConfig

from bench.rows.ferryman import FerrymanRow


class FerrymanBareRow(FerrymanRow):
    """Metrics off, tracing off."""

    name = "ferryman-bare"
    variant = "-bare"

    def _config(self, deduper_addresses: list[str]) -> dict[str, Any]:
        config = super()._config(deduper_addresses)
        config["wrapper"]["metrics_address"] = ""
        config["deduper"]["metrics_address"] = ""
        return config


class FerrymanTracedRow(FerrymanRow):
    """Metrics on, a share of records traced (``ratio``)."""

    name = "ferryman-trace1"
    variant = "-trace1"
    ratio = 0.01

    def _config(self, deduper_addresses: list[str]) -> dict[str, Any]:
        config = super()._config(deduper_addresses)
        config["tracing"] = {
            "enabled": True,
            "sampler": "parentbased_traceidratio",
            "sampler_ratio": self.ratio,
            "exporter": "file",
            "file_path": str(self.spans_file()),
        }
        return config

    def spans_file(self) -> Path:
        """Where both services write their spans (``bench.stages`` reads it after a latency phase)."""
        return self.ctx.work_dir / "spans.jsonl"

    def settings(self) -> dict[str, object]:
        """The pair's settings and the tracing ratio."""
        return {**super().settings(), "tracing_ratio": self.ratio, "tracing_exporter": "file"}


class FerrymanTracedDefaultRow(FerrymanTracedRow):
    """Metrics on, records traced at the services' default ratio."""

    name = "ferryman-tracedefault"
    variant = "-tracedefault"
    ratio = TracingConfig().sampler_ratio


class FerrymanTraced01Row(FerrymanTracedRow):
    """Metrics on, 0.1 % of records traced."""

    name = "ferryman-trace01"
    variant = "-trace01"
    ratio = 0.001


class FerrymanTraced10Row(FerrymanTracedRow):
    """Metrics on, 10 % of records traced."""

    name = "ferryman-trace10"
    variant = "-trace10"
    ratio = 0.1


class FerrymanTracedAllRow(FerrymanTracedRow):
    """Metrics on, every record traced."""

    name = "ferryman-trace100"
    variant = "-trace100"
    ratio = 1.0
