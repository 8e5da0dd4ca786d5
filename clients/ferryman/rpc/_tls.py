"""TLS credentials from the one shared TlsConfig."""

from __future__ import annotations

from pathlib import Path

import grpc

from ferryman.config import TlsConfig
from ferryman.errors import ConfigError


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS {what} {path}: {exc}") from exc


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Server credentials; verifies client certificates when require_client_cert."""
    cert = _read(tls.cert_file, "certificate")
    key = _read(tls.key_file, "key")
    if cert is None or key is None:
        raise ConfigError("a TLS server needs rpc.tls.cert_file and rpc.tls.key_file")
    ca = _read(tls.ca_file, "CA bundle")
    if tls.require_client_cert and ca is None:
        raise ConfigError("rpc.tls.require_client_cert needs rpc.tls.ca_file to verify clients")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=tls.require_client_cert)


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Client credentials; presents a client certificate when cert_file and key_file are set."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "CA bundle"),
        private_key=_read(tls.key_file, "key"),
        certificate_chain=_read(tls.cert_file, "certificate"),
    )
