"""Prometheus metrics of the services: an HTTP endpoint each, read from their status snapshots at scrape time.

``deduper_metrics`` and ``wrapper_metrics`` give a service its exporter (a
context manager); the collectors themselves, and the metric names they
export, are in ``ferryman.metrics.collectors``. Importing this package does
not import ``prometheus_client``: the exporter's thread does (see ``_server``).
"""

from ferryman.metrics._exporters import deduper_metrics, wrapper_metrics
from ferryman.metrics._latency import LATENCY_COUNT, LatencyHistogram, LatencySnapshot
from ferryman.metrics._server import MetricsBindError, MetricsExporter, split_address

__all__ = [
    "LATENCY_COUNT",
    "LatencyHistogram",
    "LatencySnapshot",
    "MetricsBindError",
    "MetricsExporter",
    "deduper_metrics",
    "split_address",
    "wrapper_metrics",
]
