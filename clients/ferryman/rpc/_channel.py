"""Client channels with TLS, token and trace-context interceptors."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ferryman.config import RpcConfig
from ferryman.rpc._interceptors import client_interceptors
from ferryman.rpc._server import MAX_MESSAGE_BYTES
from ferryman.rpc._tls import channel_credentials

#: Ping every 30 s so a dead peer or a silently dropped flow is noticed within
#: about 40 s (ping timeout 10 s), even on an idle control stream.
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


def open_channel(address: str, rpc: RpcConfig, *, options: Sequence[tuple[str, int | str]] = ()) -> grpc.Channel:
    """A channel to address with the project's TLS, token and tracing settings."""
    opts: list[tuple[str, int | str]] = [*CHANNEL_OPTIONS, *options]
    if rpc.tls.enabled:
        if rpc.tls.server_name_override:
            opts.append(("grpc.ssl_target_name_override", rpc.tls.server_name_override))
        channel = grpc.secure_channel(address, channel_credentials(rpc.tls), options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    return grpc.intercept_channel(channel, *client_interceptors(rpc))
