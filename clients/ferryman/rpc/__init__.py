"""gRPC plumbing shared by every Ferryman server and client.

Servers (`build_server`) come with health checking, reflection, TLS or mutual
TLS, and explicit interceptors (`default_server_interceptors`: error mapping to
precise status codes with ``google.rpc.ErrorInfo`` details, bearer-token auth with roles (`required_role`),
OpenTelemetry tracing). Channels (`open_channel`) carry TLS, the token and the
W3C trace context. Client-side errors are translated once, with `rpc_error_from`.
"""

from ferryman.rpc._channel import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, open_channel
from ferryman.rpc._deadline import ANSWER_MARGIN_S, call_deadline
from ferryman.rpc._errors import (
    ERROR_DOMAIN,
    IncompatiblePeerError,
    RpcBindError,
    RpcError,
    error_reason,
    rpc_error_from,
    status_code_for,
    to_status,
)
from ferryman.rpc._interceptors import (
    AuthInterceptor,
    ErrorMappingInterceptor,
    TracingInterceptor,
    default_server_interceptors,
)
from ferryman.rpc._roles import OPEN_METHOD_PREFIXES, READ_PREFIXES, required_role
from ferryman.rpc._server import RpcServer, build_server
from ferryman.rpc._serving import GRPC_GRACE_S, serving

__all__ = [
    "ANSWER_MARGIN_S",
    "CHANNEL_OPTIONS",
    "ERROR_DOMAIN",
    "GRPC_GRACE_S",
    "MAX_MESSAGE_BYTES",
    "OPEN_METHOD_PREFIXES",
    "READ_PREFIXES",
    "AuthInterceptor",
    "ErrorMappingInterceptor",
    "IncompatiblePeerError",
    "RpcBindError",
    "RpcError",
    "RpcServer",
    "TracingInterceptor",
    "build_server",
    "call_deadline",
    "default_server_interceptors",
    "error_reason",
    "open_channel",
    "required_role",
    "rpc_error_from",
    "serving",
    "status_code_for",
    "to_status",
]
