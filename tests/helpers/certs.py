"""Throwaway PKI for TLS tests: a CA, a server certificate and a client certificate.

Keys are ECDSA P-256 (instant to generate, accepted by gRPC's BoringSSL).
The server certificate names ``localhost`` and ``127.0.0.1`` and also carries
the clientAuth usage, because one Ferryman process uses one certificate both
to serve and to dial its peers (``RpcConfig.tls`` is shared).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Validity on both sides of now: tolerant of a skewed clock, short enough to be useless if leaked.
_VALIDITY = dt.timedelta(days=2)


@dataclass(frozen=True)
class TestPki:
    """Paths of the PEM files written by `make_pki`."""

    __test__ = False  # not a pytest test class

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Ferryman tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_path = path.with_suffix(".key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_path.chmod(0o600)


def _leaf(
    common_name: str,
    *,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usages: Sequence[x509.ObjectIdentifier],
    hosts: Sequence[str] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _VALIDITY)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_ca(common_name: str = "Ferryman test CA") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key."""
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _VALIDITY)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_pki(
    directory: Path,
    *,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    client_name: str = "ferryman-test-client",
    ca_name: str = "Ferryman test CA",
) -> TestPki:
    """Write ``ca.pem``, ``server.pem``/``server.key`` and ``client.pem``/``client.key`` into directory.

    Args:
        directory: Where to write (created if missing).
        hosts: DNS names and IP addresses the server certificate is valid for.
        client_name: Common name of the client certificate.
        ca_name: Common name of the CA (give another one for a second, untrusted PKI).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca(ca_name)
    server_cert, server_key = _leaf(
        "ferryman-test-server",
        ca_cert=ca_cert,
        ca_key=ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
        hosts=hosts,
    )
    client_cert, client_key = _leaf(
        client_name, ca_cert=ca_cert, ca_key=ca_key, usages=(ExtendedKeyUsageOID.CLIENT_AUTH,)
    )
    _write(directory / "ca.pem", ca_cert)
    _write(directory / "server.pem", server_cert, server_key)
    _write(directory / "client.pem", client_cert, client_key)
    return TestPki(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
