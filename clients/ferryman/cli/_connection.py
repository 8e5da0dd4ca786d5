"""How every command that talks to a service connects: ``--server``, token and TLS options, and exit codes.

Each option has an environment variable, so a shell profile (or a CI secret) holds the server,
the token and the TLS files once. The admin client's errors become one line on stderr and an
exit status per kind of mistake (see the ``EXIT_*`` constants of `ferryman.cli._common`).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from ferryman.admin import (
    AdminError,
    AlreadyExistsError,
    AuthenticationError,
    ConflictError,
    FerrymanAdmin,
    InvalidArgumentError,
    PermissionDeniedError,
    RequestRejectedError,
    ResourceNotFoundError,
    ServiceUnavailableError,
    TlsHandshakeError,
    WrongServiceError,
)
from ferryman.cli._common import (
    EXIT_CONFLICT,
    EXIT_DENIED,
    EXIT_EXISTS,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_REJECTED,
    EXIT_TLS,
    EXIT_UNAUTHENTICATED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    fail,
)
from ferryman.config import RpcConfig, validated
from ferryman.errors import ConfigError

T = TypeVar("T")

ServerOption = Annotated[
    str,
    typer.Option(
        "--server",
        "-s",
        envvar="FERRYMAN_SERVER",
        help="host:port of a wrapper or deduper.",
        show_default=False,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="FERRYMAN_TOKEN",
        help="Bearer token (prefer the variable: a flag shows in the process list).",
        show_default=False,
    ),
]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        envvar="FERRYMAN_CA_FILE",
        help="PEM CA bundle: use TLS.",
        show_default=False,
    ),
]
CertOption = Annotated[
    Path | None,
    typer.Option(
        "--cert-file",
        envvar="FERRYMAN_CERT_FILE",
        help="PEM client certificate for mutual TLS.",
        show_default=False,
    ),
]
KeyOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        envvar="FERRYMAN_KEY_FILE",
        help="PEM key of the client certificate.",
        show_default=False,
    ),
]
ServerNameOption = Annotated[
    str | None,
    typer.Option(
        "--server-name",
        envvar="FERRYMAN_SERVER_NAME",
        help="Name the server certificate must carry when it differs from the --server host.",
        show_default=False,
    ),
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", help="Deadline of the call in seconds, retries included.", min=0.001)
]

#: The host of ``host:port``: a name, an IPv4 address, or an IPv6 address in brackets.
_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")
#: gRPC targets with a scheme, passed on as they are.
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")


@dataclass(frozen=True)
class Connection:
    """Where and how a command calls a service."""

    server: str
    rpc: RpcConfig
    timeout_s: float

    def call(self, what: Callable[[FerrymanAdmin], T]) -> T | int:
        """what(admin) on a client of the server; an exit status (message printed) when it fails."""
        try:
            with FerrymanAdmin(self.server, self.rpc, timeout_s=self.timeout_s) as admin:
                return what(admin)
        except AdminError as exc:
            return fail(*describe(self.server, exc, self.rpc))


def check_address(server: str) -> None:
    """Refuse a --server that is no gRPC address.

    Raises:
        ConfigError: naming --server.
    """
    if server.startswith(_SCHEMES):
        return
    host, _, port = server.rpartition(":")
    if not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--server must be host:port (e.g. deduper-1:7460), not {server!r}")


def connect(
    server: str,
    *,
    token: str | None,
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
    server_name: str | None,
    timeout_s: float,
) -> Connection:
    """The connection the options describe.

    Raises:
        ConfigError: a malformed --server, or inconsistent TLS options.
    """
    check_address(server)
    if (cert_file is None) != (key_file is None):
        raise ConfigError("--cert-file and --key-file go together (mutual TLS needs both)")
    if (cert_file or key_file or server_name) and ca_file is None:
        raise ConfigError("--cert-file, --key-file and --server-name need --ca-file (TLS)")
    for flag, path in (("--ca-file", ca_file), ("--cert-file", cert_file), ("--key-file", key_file)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag}: no such file {str(path)!r}")
    tls: dict[str, Any] = {
        k: str(v) for k, v in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)) if v
    }
    if server_name:
        tls["server_name_override"] = server_name
    data: dict[str, Any] = {"tls": tls}
    if token:
        data["auth_token"] = token
    return Connection(server, validated(RpcConfig, data), timeout_s)


def _closed_hint(rpc: RpcConfig) -> str:
    """Why a server may have closed the connection at once, given how the client connected."""
    if not rpc.tls.enabled:
        return " (a TLS server closes plaintext connections: pass --ca-file)"
    if rpc.tls.cert_file is None:
        return " (a server requiring mutual TLS closes connections without a client certificate: pass --cert-file)"
    return " (a server requiring mutual TLS closes connections whose client certificate it does not trust)"


def describe(server: str, exc: AdminError, rpc: RpcConfig) -> tuple[str, int]:
    """One line and the exit status for a failed call made with rpc's settings (the one map of admin errors to them)."""
    if isinstance(exc, TlsHandshakeError):
        return f"TLS with {server} failed (check --ca-file, --cert-file, --server-name): {exc}", EXIT_TLS
    if isinstance(exc, ServiceUnavailableError):
        if exc.reason:  # the server answered, with a reason: what it needs is unavailable (its cluster, say)
            return f"{server} cannot serve the call now: {exc}", EXIT_UNAVAILABLE
        hint = _closed_hint(rpc) if "Socket closed" in str(exc) else ""
        return f"no answer from {server}{hint}: {exc}", EXIT_UNAVAILABLE
    if isinstance(exc, AuthenticationError):
        return f"{server} refused the credentials (check --token or FERRYMAN_TOKEN): {exc}", EXIT_UNAUTHENTICATED
    if isinstance(exc, PermissionDeniedError):
        return f"{server} refused the call: {exc}", EXIT_DENIED
    if isinstance(exc, ResourceNotFoundError):
        return f"{exc}", EXIT_NOT_FOUND
    if isinstance(exc, InvalidArgumentError):
        return f"{server} refused a value: {exc}", EXIT_USAGE
    if isinstance(exc, AlreadyExistsError):
        return f"{exc}", EXIT_EXISTS
    if isinstance(exc, ConflictError):
        return f"{exc} (read it again and retry)", EXIT_CONFLICT
    if isinstance(exc, RequestRejectedError):
        return f"{server} rejected the request: {exc}", EXIT_REJECTED
    if isinstance(exc, WrongServiceError):
        return f"{server} does not serve this command (is it the other service?): {exc}", EXIT_REJECTED
    return f"{server}: {exc}", EXIT_FAILED


@dataclass(frozen=True)
class ConnectionOptions:
    """A command's connection options as given (``--server`` may be unset where it is optional)."""

    server: str | None
    token: str | None
    ca_file: Path | None
    cert_file: Path | None
    key_file: Path | None
    server_name: str | None
    timeout_s: float

    def connect(self) -> Connection:
        """The connection these options describe.

        Raises:
            ConfigError: no or a malformed --server, or inconsistent TLS options.
        """
        if not self.server:
            raise ConfigError("--server is required here (or FERRYMAN_SERVER)")
        return connect(
            self.server,
            token=self.token,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            server_name=self.server_name,
            timeout_s=self.timeout_s,
        )

    def connect_or_fail(self) -> Connection | int:
        """`connect`, or the usage exit status with its line printed."""
        try:
            return self.connect()
        except ConfigError as exc:
            return fail(str(exc), EXIT_USAGE)


_OPTIONS = ("server", "token", "ca_file", "cert_file", "key_file", "server_name", "timeout_s")


def connection_options(
    *, timeout_s: float, server: Any = ServerOption, server_default: Any = inspect.Parameter.empty
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Give a command ``--server``, ``--token``, the TLS options and ``--timeout`` (default timeout_s).

    The command takes them as one keyword argument ``connection: ConnectionOptions``; Typer sees the
    options in its place (``--server`` first among the options, the others last), so every command
    spells, documents and reads them the same way. server and server_default replace ``--server``'s
    annotation and default where a command calls another kind of server or can do without one.
    """

    def decorate(command: Callable[..., int]) -> Callable[..., int]:
        signature = inspect.signature(command, eval_str=True)
        params = [p for p in signature.parameters.values() if p.name != "connection"]
        at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.KEYWORD_ONLY), len(params))

        def option(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
            return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)

        params[at:at] = [option("server", server, server_default)]
        params += [
            option("token", TokenOption),
            option("ca_file", CaOption),
            option("cert_file", CertOption),
            option("key_file", KeyOption),
            option("server_name", ServerNameOption),
            option("timeout_s", TimeoutOption, timeout_s),
        ]

        @functools.wraps(command)
        def with_options(*args: Any, **kwargs: Any) -> int:
            given = ConnectionOptions(**{name: kwargs.pop(name) for name in _OPTIONS})
            return command(*args, connection=given, **kwargs)

        with_options.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
        return with_options

    return decorate
