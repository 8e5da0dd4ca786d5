"""``ferryman status`` and ``ferryman lag``: what a running wrapper or deduper reports, over gRPC.

Both ask the service at ``--server`` through `ferryman.admin.FerrymanAdmin` (whichever role
answers) and print a table, JSON or YAML. Exit codes beyond the CLI's common ones: 4 when
the server does not answer, 5 when it refuses the credentials.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from ferryman.admin import (
    DEFAULT_TIMEOUT_S,
    AdminError,
    AuthenticationError,
    FerrymanAdmin,
    PermissionDeniedError,
    ServiceStatus,
    ServiceUnavailableError,
)
from ferryman.cli._common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from ferryman.config import RpcConfig, validated
from ferryman.errors import ConfigError

#: The server did not answer (not listening, unreachable, deadline passed).
EXIT_UNAVAILABLE = 4
#: The server refused the credentials (no or a wrong token, a role without the right).
EXIT_DENIED = 5

_OUTPUTS = ("table", "json", "yaml")

ServerOption = Annotated[
    str,
    typer.Option(
        "--server", "-s", envvar="FERRYMAN_SERVER", help="host:port of a wrapper or deduper (env FERRYMAN_SERVER)."
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="FERRYMAN_TOKEN", help="Bearer token (env FERRYMAN_TOKEN).", show_default=False),
]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        envvar="FERRYMAN_CA_FILE",
        help="PEM CA bundle: use TLS (env FERRYMAN_CA_FILE).",
        show_default=False,
    ),
]
CertOption = Annotated[
    Path | None,
    typer.Option(
        "--cert-file", envvar="FERRYMAN_CERT_FILE", help="PEM client certificate for mutual TLS.", show_default=False
    ),
]
KeyOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file", envvar="FERRYMAN_KEY_FILE", help="PEM key of the client certificate.", show_default=False
    ),
]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Deadline of the call in seconds, retries included.")]
OutputOption = Annotated[str, typer.Option("--output", "-o", help="table, json or yaml.")]


def connection(token: str | None, ca_file: Path | None, cert_file: Path | None, key_file: Path | None) -> RpcConfig:
    """The ``RpcConfig`` of the shared connection options (--token, --ca-file, --cert-file, --key-file).

    Raises:
        ConfigError: the TLS options are incomplete.
    """
    return _rpc(token, ca_file, cert_file, key_file)


def _rpc(token: str | None, ca_file: Path | None, cert_file: Path | None, key_file: Path | None) -> RpcConfig:
    tls = {k: str(v) for k, v in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)) if v}
    data: dict[str, Any] = {"tls": tls}
    if token:
        data["auth_token"] = token
    return validated(RpcConfig, data)


def _fetch(server: str, rpc: RpcConfig, timeout_s: float) -> ServiceStatus:
    """The service's status.

    Raises:
        AdminError: the call failed.
    """
    with FerrymanAdmin(server, rpc, timeout_s=timeout_s) as admin:
        return admin.service_status()


def _as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _emit(output: str, data: dict[str, Any], table: Table) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=False))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        Console(soft_wrap=True).print(table)


def _run(server: str, rpc: RpcConfig, timeout_s: float, output: str, render: Any) -> int:
    if output not in _OUTPUTS:
        return fail(f"--output must be one of {', '.join(_OUTPUTS)}, not {output!r}", EXIT_USAGE)
    try:
        status = _fetch(server, rpc, timeout_s)
    except ServiceUnavailableError as exc:
        return fail(f"no answer from {server}: {exc}", EXIT_UNAVAILABLE)
    except (AuthenticationError, PermissionDeniedError) as exc:
        return fail(f"{server} refused the call: {exc}", EXIT_DENIED)
    except AdminError as exc:
        return fail(f"{server}: {exc}", EXIT_FAILED)
    data, table = render(status)
    _emit(output, data, table)
    return EXIT_OK


def _status_view(status: ServiceStatus) -> tuple[dict[str, Any], Table]:
    message: Message | None = status.wrapper if status.role == "wrapper" else status.deduper
    assert message is not None  # service_status fills the one of its role
    data = {"role": status.role, **_as_dict(message)}
    table = Table("field", "value", title=f"{status.role} status", title_justify="left")
    for key, value in data.items():
        # Lists of messages (partitions, watermarks) are counted here; `ferryman lag` shows them.
        shown = value
        if isinstance(value, list):
            shown = ", ".join(str(v) for v in value) if value and not isinstance(value[0], dict) else len(value)
        if key == "audit_verdicts":  # the last audit of each owned partition: `ferryman audit show` has the rest
            violated = sum(1 for v in value if v.get("verdict") != "EXACTLY_ONCE")
            shown = f"{len(value)} partitions audited, {violated} VIOLATED" if value else "no audit yet"
        table.add_row(key, str(shown))
    return data, table


def _lag_view(status: ServiceStatus) -> tuple[dict[str, Any], Table]:
    rows: list[dict[str, Any]] = []
    if status.deduper is not None:
        ident = status.deduper.deduper_id
        rows.extend(
            {"topic": d.topic, "partition": d.partition, "watermark": d.watermark, "lag": d.lag}
            for d in status.deduper.partitions
        )
    else:
        assert status.wrapper is not None
        ident = status.wrapper.wrapper_id
        progress = {(p.topic, p.partition): p for p in status.wrapper.partitions}
        committed = {(w.topic, w.partition): w for w in status.wrapper.watermarks}
        for key in sorted(progress.keys() | committed.keys()):
            p, w = progress.get(key), committed.get(key)
            rows.append(
                {
                    "topic": key[0],
                    "partition": key[1],
                    "log_end_offset": p.log_end_offset if p else -1,
                    "wrapped": p.last_wrapped_offset if p else -1,
                    "watermark": w.watermark if w else -1,
                    "lag": w.lag if w else -1,
                }
            )
    data = {"role": status.role, "id": ident, "partitions": rows}
    columns = list(rows[0]) if rows else ["topic", "partition", "watermark", "lag"]
    table = Table(*columns, title=f"{status.role} {ident}: lag in records (-1: unknown)", title_justify="left")
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    return data, table


def status(
    *,
    server: ServerOption,
    output: OutputOption = "table",
    token: TokenOption = None,
    ca_file: CaOption = None,
    cert_file: CertOption = None,
    key_file: KeyOption = None,
    timeout_s: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> int:
    """Show the status of the wrapper or deduper at --server: identity, counters, control link, health."""
    try:
        rpc = _rpc(token, ca_file, cert_file, key_file)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    return _run(server, rpc, timeout_s, output, _status_view)


def lag(
    *,
    server: ServerOption,
    output: OutputOption = "table",
    token: TokenOption = None,
    ca_file: CaOption = None,
    cert_file: CertOption = None,
    key_file: KeyOption = None,
    timeout_s: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> int:
    """Show per-partition lag at --server: committed watermark and records behind the source log end."""
    try:
        rpc = _rpc(token, ca_file, cert_file, key_file)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    return _run(server, rpc, timeout_s, output, _lag_view)
