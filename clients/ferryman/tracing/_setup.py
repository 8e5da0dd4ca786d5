"""The span pipelines of a service process, set up explicitly from the ``tracing`` section.

Two pipelines share the configured exporter kind (an exporter each):

* ``records`` (`RecordSpans`): the spans of traced records, built without the
  SDK (``_lean``) and encoded in batches straight to the exporter's format
  (``_export``). Records are traced only when the `RecordSampler` chose them,
  so nothing decides a second time (a ratio applied twice would trace ratio²);
* ``provider``: an SDK tracer provider with the configured sampler, for gRPC
  calls and anything else that starts spans without a record behind it.

Nothing is installed globally: the services pass these to the code that makes
spans (the data paths, the gRPC interceptors).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Tracer

from ferryman.config import TracingConfig
from ferryman.errors import ConfigError
from ferryman.tracing._export import SdkBatches
from ferryman.tracing._lean import BatchExporter, RecordSpans, tracepath
from ferryman.tracing._sampling import RecordSampler

_log = logging.getLogger(__name__)

#: Instrumentation scope of Ferryman's own spans.
SCOPE = "ferryman"


def otel_sampler(config: TracingConfig) -> Sampler:
    """The SDK sampler the configuration names (for spans without a record behind them)."""
    rule = config.sampler.removeprefix("parentbased_")
    root: Sampler = (
        ALWAYS_ON
        if rule == "always_on"
        else ALWAYS_OFF
        if rule == "always_off"
        else TraceIdRatioBased(config.sampler_ratio)
    )
    return ParentBased(root) if config.sampler.startswith("parentbased_") else root


def _exporter(config: TracingConfig, file: IO[str] | None = None) -> SpanExporter:
    """A new exporter of the configured kind (its packages are imported only when chosen).

    file: the open ``file_path`` another exporter writes to (both pipelines share one stream).
    """
    endpoint = config.endpoint or None
    if config.exporter == "otlp-grpc":
        from ferryman.tracing._otlp import GrpcSpanExporter  # noqa: PLC0415 (only the chosen exporter is imported)

        insecure = endpoint is not None and endpoint.startswith("http://")
        return GrpcSpanExporter(endpoint=endpoint, insecure=insecure or None)
    if config.exporter == "otlp-http":
        from ferryman.tracing._otlp import HttpSpanExporter  # noqa: PLC0415 (only the chosen exporter is imported)

        return HttpSpanExporter(endpoint=endpoint)
    if config.exporter == "zipkin":
        from opentelemetry.exporter.zipkin.json import ZipkinExporter  # noqa: PLC0415 (only the chosen exporter is imported)

        return ZipkinExporter(endpoint=endpoint)
    if config.exporter == "file":
        try:
            out: IO[str] = file or config.file_path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"tracing.file_path: cannot open {config.file_path}: {exc}") from exc
        one_line: Callable[[ReadableSpan], str] = lambda span: span.to_json(indent=None) + "\n"  # noqa: E731
        return ConsoleSpanExporter(out=out, formatter=one_line)
    return ConsoleSpanExporter()


def _record_batches(config: TracingConfig, exporter: SpanExporter, resource: Resource) -> BatchExporter:
    """The record spans' exporter: the configured exporter's own wire format when we write it, else SDK spans."""
    scope = InstrumentationScope(SCOPE)
    if config.exporter == "zipkin":
        from opentelemetry.exporter.zipkin.json import ZipkinExporter  # noqa: PLC0415 (loaded when chosen)

        from ferryman.tracing._zipkin import ZipkinBatches  # noqa: PLC0415 (loaded when chosen)

        assert isinstance(exporter, ZipkinExporter)
        return ZipkinBatches(exporter, resource, scope)
    if config.exporter in ("otlp-grpc", "otlp-http"):
        from ferryman.tracing._otlp import GrpcSpanExporter, HttpSpanExporter, OtlpBatches  # noqa: PLC0415 (loaded when chosen)

        assert isinstance(exporter, GrpcSpanExporter | HttpSpanExporter)
        return OtlpBatches(exporter, resource, scope)
    if config.exporter == "file":
        from ferryman.tracing._file import FileBatches  # noqa: PLC0415 (loaded when chosen)

        assert isinstance(exporter, ConsoleSpanExporter)
        return FileBatches(exporter, resource)
    return SdkBatches(exporter, resource, scope)  # the console: for people to read, at low rates


def _encoder() -> str:
    """Which record-span encoder runs (the Zipkin, OTLP and file batches share the compiled module)."""
    from ferryman.tracing._file import ENCODER  # noqa: PLC0415 (loaded when tracing is on)

    return ENCODER


@dataclass(frozen=True)
class Tracing:
    """A service's tracing: the record sampler and tracers, the providers to pass on, and shutdown."""

    config: TracingConfig
    sampler: RecordSampler
    """Decides which records are traced (the data path's thread only)."""
    records: RecordSpans
    """Where record spans go (whatever ``sampler`` chose)."""
    provider: TracerProvider
    """Provider applying the configured sampler: gRPC interceptors and other spans."""

    @property
    def tracer(self) -> Tracer:
        """Tracer of non-record spans (configured sampler)."""
        return self.provider.get_tracer(SCOPE)

    def shutdown(self) -> None:
        """Export what is buffered (within ``export_timeout_s`` each) and stop; idempotent."""
        timeout_s = self.config.export_timeout_s
        flushed = self.records.shutdown(timeout_s)
        if not (self.provider.force_flush(int(timeout_s * 1000)) and flushed):
            _log.warning("tracing: spans not all exported within %.1f s", timeout_s)
        self.provider.shutdown()


def start_tracing(config: TracingConfig, default_service_name: str) -> Tracing | None:
    """The service's tracing, or None when ``tracing.enabled`` is false (nothing is set up then).

    Raises:
        ConfigError: the exporter cannot be created (an unwritable file).
    """
    if not config.enabled:
        return None
    resource = Resource.create({"service.name": config.service_name or default_service_name})
    exporter = _exporter(config)
    records = RecordSpans(_record_batches(config, exporter, resource), max_links=config.max_links)
    file = exporter.out if config.exporter == "file" and isinstance(exporter, ConsoleSpanExporter) else None
    provider = TracerProvider(sampler=otel_sampler(config), resource=resource)
    provider.add_span_processor(BatchSpanProcessor(_exporter(config, file)))
    _log.info(
        "tracing on: sampler %s (ratio %g), exporter %s%s%s, record spans made %s",
        config.sampler,
        config.sampler_ratio,
        config.exporter,
        f" to {config.endpoint}" if config.endpoint else "",
        "" if config.exporter == "console" else f", record span encoder {_encoder()}",
        "compiled" if tracepath is not None else "in pure Python (_tracepath not built)",
    )
    return Tracing(
        config=config,
        sampler=RecordSampler.of(config),
        records=records,
        provider=provider,
    )
