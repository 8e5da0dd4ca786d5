"""The two services' exporters: which collector each serves. Nothing here imports ``prometheus_client``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ferryman.metrics._latency import LatencySnapshot
from ferryman.metrics._server import MetricsExporter
from ferryman.v1 import control_pb2

if TYPE_CHECKING:
    from prometheus_client.registry import Collector


def deduper_metrics(
    address: str,
    status: Callable[[], control_pb2.GetDeduperStatusResponse],
    latency: Callable[[], LatencySnapshot] | None = None,
) -> MetricsExporter:
    """The deduper's endpoint on address (``""``: disabled): ``DeduperCollector(status, latency)``, process metrics.

    latency: the end-to-end latency histogram's snapshot (``LatencyHistogram.snapshot``).
    """

    def registry() -> Collector:
        from ferryman.metrics.collectors import DeduperCollector, service_registry  # noqa: PLC0415 (see _server)

        return service_registry(DeduperCollector(status, latency=latency))

    return MetricsExporter(address, registry, what="deduper")


def wrapper_metrics(
    address: str, status: Callable[[], control_pb2.GetWrapperStatusResponse], *, control_link: bool
) -> MetricsExporter:
    """The wrapper's endpoint on address (``""``: disabled): ``WrapperCollector(status)``, process metrics.

    control_link: whether the wrapper has a control link (``deduper_addresses``) whose state to export.
    """

    def registry() -> Collector:
        from ferryman.metrics.collectors import WrapperCollector, service_registry  # noqa: PLC0415 (see _server)

        return service_registry(WrapperCollector(status, control_link=control_link))

    return MetricsExporter(address, registry, what="wrapper")
