"""The standard OpenTelemetry environment variables, as overrides of the ``tracing`` section.

Applied before the ``FERRYMAN_*`` overrides (which therefore win), after the file:

=====================================================  =====================================================
``OTEL_SDK_DISABLED=true``                             ``enabled: false``
``OTEL_TRACES_EXPORTER=otlp|zipkin|console|none``      ``exporter`` (``otlp``: by the protocol below) and
                                                       ``enabled: true`` (``none``: ``enabled: false``)
``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``               ``grpc`` -> ``otlp-grpc``, ``http/protobuf`` -> ``otlp-http``
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``                 ``endpoint`` (otlp exporters)
``OTEL_EXPORTER_OTLP_ENDPOINT``                        ``endpoint`` (otlp; ``/v1/traces`` appended for HTTP)
``OTEL_EXPORTER_ZIPKIN_ENDPOINT``                      ``endpoint`` (zipkin exporter)
``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``  ``sampler`` / ``sampler_ratio``
``OTEL_SERVICE_NAME``                                  ``service_name``
=====================================================  =====================================================

An unknown exporter or sampler name is refused naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferryman.errors import ConfigError

_EXPORTERS = {"zipkin": "zipkin", "console": "console"}
_PROTOCOLS = {"grpc": "otlp-grpc", "http/protobuf": "otlp-http"}
_SAMPLERS = frozenset(
    {
        "parentbased_traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "traceidratio",
        "always_on",
        "always_off",
    }
)


def apply_otel_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    """Set the ``tracing`` fields the ``OTEL_*`` variables of env name in data (plain values).

    Raises:
        ConfigError: a variable holds a value Ferryman does not support, naming it.
    """
    section: dict[str, Any] = {}
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        first = exporter.split(",")[0].strip()  # the SDK takes a list; Ferryman exports to one place
        if first == "none":
            section["enabled"] = False
        elif first == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
            if protocol not in _PROTOCOLS:
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (use one of {sorted(_PROTOCOLS)})"
                )
            section.update(enabled=True, exporter=_PROTOCOLS[protocol])
        elif first in _EXPORTERS:
            section.update(enabled=True, exporter=_EXPORTERS[first])
        else:
            raise ConfigError(f"OTEL_TRACES_EXPORTER: {first!r} is not supported (use otlp, zipkin, console or none)")
    chosen = section.get("exporter") or (data.get("tracing") or {}).get("exporter", "")
    if chosen.startswith("otlp"):
        if endpoint := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            section["endpoint"] = endpoint
        elif endpoint := env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            # The generic endpoint is a base URL for HTTP (the spec appends the signal's path), a host for gRPC.
            section["endpoint"] = endpoint.rstrip("/") + "/v1/traces" if chosen == "otlp-http" else endpoint
    elif chosen == "zipkin" and (endpoint := env.get("OTEL_EXPORTER_ZIPKIN_ENDPOINT")):
        section["endpoint"] = endpoint
    if sampler := env.get("OTEL_TRACES_SAMPLER", "").strip().lower():
        if sampler not in _SAMPLERS:
            raise ConfigError(f"OTEL_TRACES_SAMPLER: {sampler!r} is not supported (use one of {sorted(_SAMPLERS)})")
        section["sampler"] = sampler
    if arg := env.get("OTEL_TRACES_SAMPLER_ARG", "").strip():
        section["sampler_ratio"] = arg  # validated (a float in [0, 1]) with the rest of the section
    if name := env.get("OTEL_SERVICE_NAME", "").strip():
        section["service_name"] = name
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        section["enabled"] = False
    if section:
        tracing = data.get("tracing")
        data["tracing"] = {**tracing, **section} if isinstance(tracing, dict) else section
