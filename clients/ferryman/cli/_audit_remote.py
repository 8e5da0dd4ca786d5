"""``ferryman audit run|list|show --server``: the same commands through an audit scheduler's ``AuditService``.

No Spark here: the scheduler at ``--server`` runs the audit on its session and reads its audit topic.
Results are printed in the shapes of the local commands (the JSON of ``audit run`` and ``audit show``
has the same fields either way). Exit codes beyond the audit's own: 4 when the server does not answer,
5 when it refuses the credentials (as ``ferryman status``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import grpc
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ferryman.admin import (
    AdminError,
    FerrymanAdmin,
)
from ferryman.cli._common import EXIT_FAILED, EXIT_FINDING, EXIT_OK, EXIT_USAGE, fail
from ferryman.cli._connection import Connection, describe
from ferryman.errors import ConfigError
from ferryman.v1 import audit_pb2

_COUNTS = ("expected", "found", "missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")
_USAGE_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND})


def _verdict(value: audit_pb2.Verdict.ValueType) -> str:
    if value == audit_pb2.VERDICT_EXACTLY_ONCE:
        return "EXACTLY_ONCE"
    return "VIOLATED" if value == audit_pb2.VERDICT_VIOLATED else ""


def _counts(message: audit_pb2.AuditCounts) -> dict[str, int]:
    return {k: int(getattr(message, k)) for k in _COUNTS}


def _range(message: audit_pb2.AuditRange) -> dict[str, Any]:
    kind = message.WhichOneof("kind")
    out: dict[str, Any] = {"kind": {"offsets": "offsets", "time_window": "time"}.get(kind or "", "since-last")}
    if kind == "offsets":
        if message.offsets.start_offsets:
            out["start_offsets"] = {str(k): v for k, v in sorted(message.offsets.start_offsets.items())}
        if message.offsets.end_offsets:
            out["end_offsets"] = {str(k): v for k, v in sorted(message.offsets.end_offsets.items())}
    elif kind == "time_window":
        out["start_ms"] = message.time_window.start_ms
        if message.time_window.HasField("end_ms"):
            out["end_ms"] = message.time_window.end_ms
    if message.topics:
        out["topics"] = list(message.topics)
    return out


def run_as_dict(run: audit_pb2.AuditRun) -> dict[str, Any]:
    """A run in the JSON shape of ``ferryman audit run --output json`` (`AuditReport.as_dict`)."""
    partitions = []
    for p in run.partitions:
        partitions.append(
            {
                "topic": p.topic,
                "partition": p.partition,
                "destination_topic": p.destination_topic,
                **_counts(p.counts),
                "unverifiable_ranges": [[r.from_offset, r.to_offset] for r in p.unverifiable_ranges],
                "source_range": [p.source_range.from_offset, p.source_range.to_offset],
                "destination_range": [p.destination_range.from_offset, p.destination_range.to_offset],
                "offset_map": _counts(p.offset_map_counts) if p.HasField("offset_map_counts") else None,
                "alignments_agree": p.alignments_agree,
                "verdict": _verdict(p.verdict),
            }
        )
    return {
        "run_id": run.run_id,
        "flow": run.flow,
        "verdict": _verdict(run.verdict),
        "started_at_ms": run.started_at_ms,
        "finished_at_ms": run.finished_at_ms,
        "range": _range(run.range),
        "totals": _counts(run.totals),
        "partitions": partitions,
    }


def summary_row(run: audit_pb2.AuditRun) -> dict[str, Any]:
    """A run as one row of ``ferryman audit list`` (the local command's fields, plus its state)."""
    state = audit_pb2.AuditState.Name(run.state).removeprefix("AUDIT_STATE_")
    return {
        "run_id": run.run_id,
        "finished_at_ms": run.finished_at_ms,
        "range": _range(run.range)["kind"],
        "verdict": _verdict(run.verdict) or state,
        "partitions": run.partition_count,
        **_counts(run.totals),
    }


def _admin(connection: Connection) -> FerrymanAdmin:
    return FerrymanAdmin(connection.server, connection.rpc, timeout_s=connection.timeout_s)


def _call(connection: Connection, what: Callable[[], int]) -> int:
    """what(), with the client's errors as the CLI's exit statuses."""
    try:
        return what()
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    except AdminError as exc:
        if exc.code in _USAGE_CODES:  # the audit commands' contract: an unknown flow or run, a bad range is usage
            return fail(f"{connection.server}: {exc}", EXIT_USAGE)
        message, status = describe(connection.server, exc, connection.rpc)
        return fail(message, status)


def _finished(run: audit_pb2.AuditRun, output: str, show: Callable[[dict[str, Any], str], None]) -> int:
    if run.state == audit_pb2.AUDIT_STATE_FAILED:
        return fail(f"audit {run.run_id} of flow {run.flow} could not run: {run.error}", EXIT_FAILED)
    if run.state != audit_pb2.AUDIT_STATE_FINISHED:
        state = audit_pb2.AuditState.Name(run.state).removeprefix("AUDIT_STATE_").lower()
        return fail(f"audit {run.run_id} of flow {run.flow} is {state}: no result yet", EXIT_FAILED)
    data = run_as_dict(run)
    show(data, output)
    return EXIT_OK if data["verdict"] == "EXACTLY_ONCE" else EXIT_FINDING


def remote_run(
    connection: Connection,
    *,
    flow: str,
    range_args: dict[str, Any],
    output: str,
    show: Callable[[dict[str, Any], str], None],
) -> int:
    """Start an audit at server, follow it (a progress bar on a terminal), print its result."""

    def go() -> int:
        with _admin(connection) as admin:
            started = admin.start_audit(flow, **range_args, timeout_s=connection.timeout_s)
            result: audit_pb2.AuditRun | None = None
            interactive = output == "text" and sys.stderr.isatty()
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[tasks]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
                disable=not interactive,
            ) as bar:
                task = bar.add_task(f"audit {started.run_id}", total=None, tasks="")
                for event in admin.follow_audit(started.run_id, started.flow):
                    if event.HasField("result"):
                        result = event.result
                        break
                    p = event.progress
                    bar.update(task, description=p.step)
                    if p.tasks_total:
                        bar.update(
                            task,
                            total=p.tasks_total,
                            completed=p.tasks_done,
                            tasks=f"{p.tasks_done}/{p.tasks_total} Spark tasks",
                        )
            if result is None:
                ended = f"{connection.server} ended the stream of audit {started.run_id} without its result"
                return fail(ended, EXIT_FAILED)
            return _finished(result, output, show)

    return _call(connection, go)


def remote_show(
    connection: Connection, *, flow: str, run_id: str, output: str, show: Callable[[dict[str, Any], str], None]
) -> int:
    """Print one run read at server (default: the latest)."""

    def go() -> int:
        with _admin(connection) as admin:
            return _finished(admin.get_audit(run_id, flow, timeout_s=connection.timeout_s), output, show)

    return _call(connection, go)


def remote_list(
    connection: Connection,
    *,
    flow: str,
    limit: int,
    output: str,
    show: Callable[[str, list[dict[str, Any]], str], None],
) -> int:
    """Print a flow's runs read at server."""

    def go() -> int:
        with _admin(connection) as admin:
            runs = admin.list_audits(flow, limit=max(limit, 0), timeout_s=connection.timeout_s)
        show(runs[0].flow if runs else flow or "(the scheduler's flow)", [summary_row(r) for r in runs], output)
        return EXIT_OK

    return _call(connection, go)
