"""ferryman.rpc wiring, without a network: interceptor order, token parsing, TLS settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from ferryman.config import RpcConfig, SecretStr, TlsConfig
from ferryman.errors import ConfigError
from ferryman.rpc import AuthInterceptor, ErrorMappingInterceptor, TracingInterceptor, default_server_interceptors
from ferryman.rpc._tls import channel_credentials, server_credentials


def test_default_interceptors_outermost_first() -> None:
    with_token = default_server_interceptors(RpcConfig(auth_token=SecretStr("t")))
    assert [type(i) for i in with_token] == [ErrorMappingInterceptor, AuthInterceptor, TracingInterceptor]
    without = default_server_interceptors(RpcConfig())
    assert [type(i) for i in without] == [ErrorMappingInterceptor, TracingInterceptor]


class _Details:
    def __init__(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


_REAL: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(lambda request, context: request)


def _intercept(method: str, *metadata: tuple[str, str | bytes]) -> Any:
    return AuthInterceptor("tok").intercept_service(lambda details: _REAL, _Details(method, metadata))


@pytest.mark.parametrize(
    "metadata",
    [
        (("authorization", "Bearer tok"),),
        (("authorization", "bearer tok"),),
        (("x-other", "1"), ("authorization", "Bearer  tok ")),
    ],
)
def test_auth_accepts_the_token(metadata: tuple[tuple[str, str], ...]) -> None:
    assert _intercept("/ferryman.v1.DeduperService/GetDeduperStatus", *metadata) is _REAL


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer wrong"),),
        (("authorization", "Bearer tokk"),),
        (("authorization", "Basic tok"),),
        (("authorization", "tok"),),
        (("authorization", "Bearer"),),
        (("authorization-bin", b"tok"),),
    ],
)
def test_auth_refuses_anything_else(metadata: tuple[tuple[str, str | bytes], ...]) -> None:
    handler = _intercept("/ferryman.v1.DeduperService/GetDeduperStatus", *metadata)
    assert handler is not _REAL
    assert handler.stream_stream is not None  # refuses without reading the request


@pytest.mark.parametrize(
    "method",
    [
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    ],
)
def test_auth_leaves_health_and_reflection_open(method: str) -> None:
    assert _intercept(method) is _REAL


def test_auth_rejects_an_empty_token() -> None:
    with pytest.raises(ConfigError, match="auth_token"):
        AuthInterceptor("")


def test_server_tls_needs_cert_and_key(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("not really a certificate")
    with pytest.raises(ConfigError, match=r"cert_file and rpc\.tls\.key_file"):
        server_credentials(TlsConfig(cert_file=cert))


def test_mutual_tls_needs_a_ca(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    with pytest.raises(ConfigError, match="ca_file"):
        server_credentials(TlsConfig(cert_file=cert, key_file=key, require_client_cert=True))


def test_unreadable_tls_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        channel_credentials(TlsConfig(ca_file=tmp_path / "missing.pem"))


def test_client_certificate_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="both"):
        channel_credentials(TlsConfig(cert_file=cert))
