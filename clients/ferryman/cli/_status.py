"""``ferryman status`` and ``ferryman lag``: what a running wrapper or deduper reports, over gRPC.

Both ask the service at ``--server`` through `ferryman.admin.FerrymanAdmin` (whichever role
answers) and print a table, JSON or YAML. Exit statuses: see ``ferryman.cli._common``.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from ferryman.admin import DEFAULT_TIMEOUT_S, FerrymanAdmin, ServiceStatus
from ferryman.cli._common import EXIT_OK, EXIT_USAGE, fail
from ferryman.cli._connection import ConnectionOptions, connection_options

OUTPUTS = ("table", "json", "yaml")
#: Table width when stdout is no terminal (a table is as wide as its content, up to this).
_PIPED_WIDTH = 1000

OutputOption = Annotated[str, typer.Option("--output", "-o", help="table, json or yaml.")]


def as_dict(message: Message) -> dict[str, Any]:
    """The message as JSON-ready data: proto field names, every field shown."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def emit(output: str, data: Any, table: Table) -> None:
    """Print data as JSON or YAML, or table, as output says."""
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=False))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        # Piped, nothing is cut to 80 columns: a script greps whole names.
        width = None if sys.stdout.isatty() else _PIPED_WIDTH
        Console(soft_wrap=True, width=width).print(table)


def _run(connection: ConnectionOptions, output: str, render: Any) -> int:
    if output not in OUTPUTS:
        return fail(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}", EXIT_USAGE)
    connected = connection.connect_or_fail()
    if isinstance(connected, int):
        return connected
    status = connected.call(FerrymanAdmin.service_status)
    if isinstance(status, int):
        return status
    data, table = render(status)
    emit(output, data, table)
    return EXIT_OK


def _status_view(status: ServiceStatus) -> tuple[dict[str, Any], Table]:
    message: Message | None = status.wrapper if status.role == "wrapper" else status.deduper
    assert message is not None  # service_status fills the one of its role
    data = {"role": status.role, **as_dict(message)}
    table = Table("field", "value", title=f"{status.role} status", title_justify="left")
    for key, value in data.items():
        # Lists of messages (partitions, watermarks) are counted here; `ferryman lag` shows them.
        shown = value
        if key == "gaps" and value:  # the error state an operator acts on: each range in full
            shown = "; ".join(_gap_text(g) for g in value)
        elif key == "held_partitions" and value:  # likewise: each held partition and what moves it
            shown = "; ".join(
                f"{h['topic']}-{h['partition']} held at {h['offset']} ({h['envelope_bytes']}-byte envelope: "
                "raise wrapper.staging_max_message_bytes)"
                for h in value
            )
        elif key == "refused_record":  # the destination partition records wait at; the remedy is the reason's
            where = f"{value['topic']}-{value['partition']}" if value.get("topic") else "a destination partition"
            see = "held_staging_partitions" if data.get("held_staging_partitions") else "unavailable_reason"
            shown = f"{where} refuses a record ({value['error']}): see {see}"
        elif key == "held_staging_partitions" and value:  # each held partition, what waits and what to change
            shown = "; ".join(_held_text(h) for h in value)
        elif isinstance(value, list):
            shown = ", ".join(str(v) for v in value) if value and not isinstance(value[0], dict) else len(value)
        if key == "audit_verdicts":  # the last audit of each owned partition: `ferryman audit show` has the rest
            violated = sum(1 for v in value if v.get("verdict") != "EXACTLY_ONCE")
            shown = f"{len(value)} partitions audited, {violated} VIOLATED" if value else "no audit yet"
        table.add_row(key, str(shown))
    return data, table


def _held_text(held: dict[str, Any]) -> str:
    """One held staging partition of a deduper's status (JSON form: int64 fields are strings)."""
    refused = held["refused_record"]
    sources = ", ".join(f"{s['topic']}-{s['partition']} at {s['watermark']}" for s in held.get("source_partitions", []))
    return (
        f"staging {held.get('staging_partition', 0)} held at the record {refused['topic']}-{refused['partition']} "
        f"refuses (source partitions waiting: {sources or 'unknown'}): {held['reason']}"
    )


def _gap_text(gap: dict[str, Any]) -> str:
    """One open gap of a deduper's status (JSON form: int64 fields are strings)."""
    text = f"{gap['topic']}-{gap['partition']} missing {gap['missing_from']}..{gap['missing_to']}"
    if int(gap["lost_to"]) >= int(gap["missing_from"]):
        text += f" (LOST {gap['missing_from']}..{gap['lost_to']}: see flows[].acknowledged_losses)"
    return text


def _lag_view(status: ServiceStatus) -> tuple[dict[str, Any], Table]:
    rows: list[dict[str, Any]] = []
    if status.deduper is not None:
        ident = status.deduper.deduper_id
        rows.extend(
            {
                "topic": d.topic,
                "partition": d.partition,
                "log_end_offset": d.log_end_offset,
                "watermark": d.watermark,
                "lag": d.lag,
                "lag_seconds": d.lag_seconds,
                "duplicates_dropped": d.duplicates_dropped,
            }
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
    table = Table(
        *columns, title=f"{status.role} {ident}: lag in records and seconds (-1: unknown)", title_justify="left"
    )
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    return data, table


@connection_options(timeout_s=DEFAULT_TIMEOUT_S)
def status(*, output: OutputOption = "table", connection: ConnectionOptions) -> int:
    """Show the status of the wrapper or deduper at --server: identity, counters, control link, health."""
    return _run(connection, output, _status_view)


@connection_options(timeout_s=DEFAULT_TIMEOUT_S)
def lag(*, output: OutputOption = "table", connection: ConnectionOptions) -> int:
    """Show per-partition lag at --server: committed watermark and records behind the source log end."""
    return _run(connection, output, _lag_view)
