"""Client channels: TLS, bearer token, trace context, keepalive for long-lived streams."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from opentelemetry.trace import TracerProvider

from ferryman.config import RpcConfig
from ferryman.rpc._interceptors import client_interceptor
from ferryman.rpc._tls import channel_credentials

#: Largest message either way. A resend answer carries envelopes of source
#: records close to Kafka's own size limit; gRPC's default is 4 MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Channel options (``options=`` of `open_channel` override them).
#:
#: A control stream lives for days through NATs and firewalls that silently
#: drop idle flows; without keepalive a dead link is only noticed when TCP
#: gives up (~15 min). Pinging every 30 s with a 10 s answer budget notices it
#: within ~40 s. The servers accept pings this often (see ``_server``);
#: ``max_pings_without_data`` 0 keeps pinging even while the stream is quiet
#: (gRPC stops after 2 pings without data by default).
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


def open_channel(
    address: str,
    rpc: RpcConfig,
    *,
    options: Sequence[tuple[str, int | str]] = (),
    tracer_provider: TracerProvider | None = None,
) -> grpc.Channel:
    """A channel to address with the project's TLS, token and trace-context settings.

    TLS when ``rpc.tls`` has material (client certificate for mutual TLS when
    cert_file and key_file are set; ``server_name_override`` checked instead of
    the address host), plaintext otherwise. The bearer token and the current
    W3C trace context go into every call's metadata, on insecure channels too.
    The channel's own reconnect backoff is capped by ``rpc.connect_backoff_max_s``.

    Args:
        address: ``host:port`` (any gRPC target).
        rpc: Shared gRPC settings.
        options: Extra gRPC channel options; they win over the defaults.
        tracer_provider: Where the calls' CLIENT spans go; None: no client spans (context still propagated).

    Raises:
        ConfigError: TLS files are missing or unreadable.
    """
    merged: dict[str, int | str] = dict(CHANNEL_OPTIONS)
    merged["grpc.max_reconnect_backoff_ms"] = int(rpc.connect_backoff_max_s * 1000)
    if rpc.tls.enabled and rpc.tls.server_name_override:
        merged["grpc.ssl_target_name_override"] = rpc.tls.server_name_override
    merged.update(options)
    opts = list(merged.items())
    if rpc.tls.enabled:
        channel = grpc.secure_channel(address, channel_credentials(rpc.tls), options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    return grpc.intercept_channel(channel, client_interceptor(rpc, tracer_provider))
