"""gRPC plumbing shared by every Ferryman server and client.

Servers (``build_server``) come with health checking, reflection, TLS/mTLS and
explicit interceptors (``default_server_interceptors``: tracing, bearer-token
auth, error mapping to precise status codes). Channels (``open_channel``) carry
TLS, the token and the W3C trace context. Client-side errors are translated
once with ``rpc_error_from``.
"""

from ferryman.rpc._channel import open_channel
from ferryman.rpc._errors import (
    ERROR_DOMAIN,
    IncompatiblePeerError,
    RpcBindError,
    RpcError,
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
from ferryman.rpc._server import RpcServer, build_server

__all__ = [
    "ERROR_DOMAIN",
    "AuthInterceptor",
    "ErrorMappingInterceptor",
    "IncompatiblePeerError",
    "RpcBindError",
    "RpcError",
    "RpcServer",
    "TracingInterceptor",
    "build_server",
    "default_server_interceptors",
    "open_channel",
    "rpc_error_from",
    "status_code_for",
    "to_status",
]
