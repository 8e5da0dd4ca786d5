"""TLS credentials from the one shared `TlsConfig`.

The same settings serve a process's server and its clients (a wrapper both
serves and dials a deduper), so under mutual TLS one certificate usually plays
both roles and needs both the serverAuth and clientAuth extended key usages.
"""

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


def check_server_tls(tls: TlsConfig) -> None:
    """Reject settings that would silently serve with less security than asked.

    Raises:
        ConfigError: mutual TLS asked without TLS material or without a CA.
    """
    if tls.require_client_cert and not tls.enabled:
        raise ConfigError("rpc.tls.require_client_cert needs TLS: set rpc.tls.cert_file, key_file and ca_file")


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Server credentials; demands and verifies a client certificate when ``require_client_cert``.

    Raises:
        ConfigError: a file is missing or unreadable, or mutual TLS lacks a CA.
    """
    check_server_tls(tls)
    cert = _read(tls.cert_file, "certificate")
    key = _read(tls.key_file, "key")
    if cert is None or key is None:
        raise ConfigError("a TLS server needs both rpc.tls.cert_file and rpc.tls.key_file")
    ca = _read(tls.ca_file, "CA bundle")
    if tls.require_client_cert and ca is None:
        raise ConfigError("rpc.tls.require_client_cert needs rpc.tls.ca_file to verify client certificates")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=tls.require_client_cert)


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Client credentials: the CA (system roots when unset), and a client certificate for mutual TLS.

    Raises:
        ConfigError: a file is unreadable, or only one of cert_file and key_file is set.
    """
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ConfigError("a TLS client certificate needs both rpc.tls.cert_file and rpc.tls.key_file")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "CA bundle"),
        private_key=_read(tls.key_file, "key"),
        certificate_chain=_read(tls.cert_file, "certificate"),
    )
