"""``ferryman flows ...``: the replication flows of a destination cluster, through a deduper's FlowService.

Flows are given as in the configuration file (the same keys: ``name``, ``source``, ``target``,
``topics``, ``naming``, ...); ``apply -f FILE`` takes a configuration file (its ``flows:``), a
list of flows or one flow, and makes the store match it: missing flows are created, changed ones
updated (against the etag just read), equal ones left alone, in the file's order (a failed call
prints the rows so far, the rest "not applied", then the error). Connection options and exit statuses
are those of every command (`ferryman.cli._connection`, ``EXIT_*`` in `ferryman.cli._common`):
2 a value refused (naming the field), 7 no such flow, 9 refused in the current state (not
live-changeable, a cycle), 10 the flow exists, 11 it changed meanwhile (stale etag).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from ferryman.admin import FLOW_TIMEOUT_S, AdminError, FerrymanAdmin, ResourceNotFoundError
from ferryman.cli._common import EXIT_OK, EXIT_USAGE, fail
from ferryman.cli._connection import ConnectionOptions, connection_options
from ferryman.cli._status import OUTPUTS, OutputOption, as_dict, emit
from ferryman.config import FlowConfig, validated
from ferryman.errors import ConfigError
from ferryman.flows import to_config, to_proto
from ferryman.v1 import flows_pb2

group = typer.Typer(
    help="Replication flows of a destination cluster (served by its dedupers): list, create, change, pause.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="Flow name.", show_default=False)]
EtagOption = Annotated[
    str, typer.Option("--etag", help="Only if the flow still has this etag (from get); else exit 11.")
]
TopicOption = Annotated[
    list[str] | None, typer.Option("--topic", help="Topic regex to replicate (repeat; replaces the list).")
]
ExcludeOption = Annotated[
    list[str] | None, typer.Option("--exclude", help="Topic regex never to replicate (repeat; replaces the list).")
]
RenameOption = Annotated[
    list[str] | None, typer.Option("--rename", help="SOURCE=DESTINATION topic name (repeat; replaces the renames).")
]
GroupOption = Annotated[
    list[str] | None,
    typer.Option("--group", help="Consumer-group regex whose offsets are synced (repeat; replaces the list)."),
]
GroupExcludeOption = Annotated[
    list[str] | None,
    typer.Option("--group-exclude", help="Consumer-group regex never synced (repeat; replaces the list)."),
]
ConfigExcludeOption = Annotated[
    list[str] | None,
    typer.Option("--config-exclude", help="Topic-config regex not copied to created topics (repeat)."),
]

#: What a command shows: data for json/yaml and the table for a terminal.
_View = tuple[Any, Table]


def _run(connection: ConnectionOptions, output: str, action: Callable[[FerrymanAdmin, float], _View]) -> int:
    """action(admin, deadline) on a client of --server; its view printed, or one line and the exit status."""
    if output not in OUTPUTS:
        return fail(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}", EXIT_USAGE)
    connected = connection.connect_or_fail()
    if isinstance(connected, int):
        return connected
    try:
        view = connected.call(lambda admin: action(admin, connected.timeout_s))
    except ConfigError as exc:  # a flow file or option refused before anything was sent
        return fail(str(exc), EXIT_USAGE)
    if isinstance(view, int):
        return view
    emit(output, *view)
    return EXIT_OK


def _view(flow: flows_pb2.Flow) -> _View:
    data = as_dict(flow)
    table = Table("field", "value", title=f"flow {flow.name}", title_justify="left")
    for key, value in data.items():
        table.add_row(key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
    return data, table


def _summary_table(flows: list[flows_pb2.Flow], title: str) -> Table:
    table = Table("name", "route", "topics", "naming", "paused", "version", "etag", title=title, title_justify="left")
    for f in flows:
        naming = flows_pb2.NamingPolicy.Name(f.naming.policy).removeprefix("NAMING_POLICY_").lower()
        table.add_row(
            f.name,
            f"{f.source_alias} -> {f.target_alias}",
            ", ".join(f.topics),
            naming + (f" +{len(f.naming.renames)} renames" if f.naming.renames else ""),
            "yes" if f.paused else "no",
            str(f.version),
            f.etag,
        )
    return table


def _flow_values(source: Path) -> list[dict[str, Any]]:
    """The flows of a YAML file: a configuration (``flows:``), a list of flows, or one flow.

    Raises:
        ConfigError: unreadable, not YAML, or not flows.
    """
    try:
        loaded = yaml.safe_load(source.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from exc
    if isinstance(loaded, Mapping) and "flows" in loaded:
        loaded = loaded["flows"]
    items = [loaded] if isinstance(loaded, Mapping) else loaded
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise ConfigError(f"{source}: expected a configuration with flows:, a list of flows or one flow")
    return [dict(i) for i in items]


def _checked(values: Mapping[str, Any], at: str) -> FlowConfig:
    return validated(FlowConfig, values, at=(at,))


@group.command("list")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def list_flows(
    *,
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """List the flows stored in the destination cluster of the deduper at --server."""

    def action(admin: FerrymanAdmin, timeout_s: float) -> _View:
        flows = admin.list_flows(timeout_s=timeout_s)
        return [as_dict(f) for f in flows], _summary_table(flows, f"flows at {connection.server}")

    return _run(connection, output, action)


@group.command("get")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def get(
    name: NameArg,
    *,
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Show one flow with its etag and version."""
    return _run(connection, output, lambda admin, timeout_s: _view(admin.get_flow(name, timeout_s=timeout_s)))


@group.command("create")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def create(
    *,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="YAML of one flow, as in the configuration file.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Flow name.")] = None,
    source: Annotated[str | None, typer.Option("--source", help="Source cluster alias.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target cluster alias.")] = None,
    topic: TopicOption = None,
    exclude: ExcludeOption = None,
    naming: Annotated[str | None, typer.Option("--naming", help="prefix or identity.")] = None,
    rename: RenameOption = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Create a flow from --file or from options (--topic, --exclude and --rename SRC=DST repeat)."""

    def action(admin: FerrymanAdmin, timeout_s: float) -> _View:
        values: dict[str, Any] = {}
        if file is not None:
            items = _flow_values(file)
            if len(items) != 1:
                raise ConfigError(f"{file} holds {len(items)} flows; create takes one (apply takes many)")
            values = items[0]
        values.update(
            _option_values(
                name=name, source=source, target=target, topic=topic, exclude=exclude, naming=naming, rename=rename
            )
        )
        if paused:
            values["paused"] = True
        flow = to_proto(_checked(values, "flow"))
        return _view(admin.create_flow(flow, timeout_s=timeout_s))

    return _run(connection, output, action)


@group.command("update")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def update(
    name: NameArg,
    *,
    topic: TopicOption = None,
    exclude: ExcludeOption = None,
    rename: RenameOption = None,
    replication_factor: Annotated[int | None, typer.Option("--replication-factor", help="-1: broker default.")] = None,
    config_exclude: ConfigExcludeOption = None,
    refresh_interval_s: Annotated[
        float | None, typer.Option("--refresh-interval-s", help="How often source topics are re-listed.")
    ] = None,
    sync_group_offsets: Annotated[
        bool | None,
        typer.Option(
            "--sync-group-offsets/--no-sync-group-offsets",
            help="Commit the source groups' translated offsets at the destination.",
            show_default=False,
        ),
    ] = None,
    group: GroupOption = None,
    group_exclude: GroupExcludeOption = None,
    sync_interval_s: Annotated[
        float | None, typer.Option("--sync-interval-s", help="How often group offsets are synced.")
    ] = None,
    etag: EtagOption = "",
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Change a flow's live fields: only those given (the repeatable options replace their lists)."""

    def action(admin: FerrymanAdmin, timeout_s: float) -> _View:
        patch = flows_pb2.Flow(name=name)
        paths: list[str] = []
        if topic is not None:
            patch.topics.extend(topic)
            paths.append("topics")
        if exclude is not None:
            patch.topics_exclude.extend(exclude)
            patch.no_default_excludes = not exclude
            paths += ["topics_exclude", "no_default_excludes"]
        if rename is not None:
            patch.naming.renames.update(_renames(rename))
            paths.append("naming.renames")
        if replication_factor is not None:
            patch.replication_factor = max(replication_factor, 0)
            paths.append("replication_factor")
        if config_exclude is not None:
            patch.topic_configs_exclude.extend(config_exclude)
            paths.append("topic_configs_exclude")
        if refresh_interval_s is not None:
            patch.topic_refresh_interval_ms = round(refresh_interval_s * 1000)
            paths.append("topic_refresh_interval_ms")
        paths += _group_patch(patch, sync_group_offsets, group, group_exclude, sync_interval_s)
        if not paths:
            raise ConfigError("nothing to change: give at least one of the options (see --help)")
        return _view(admin.update_flow(patch, paths, etag=etag, timeout_s=timeout_s))

    return _run(connection, output, action)


def _group_patch(
    patch: flows_pb2.Flow,
    sync: bool | None,
    groups: list[str] | None,
    exclude: list[str] | None,
    interval_s: float | None,
) -> list[str]:
    """Set the group-sync options given on patch; the update-mask paths they change."""
    paths: list[str] = []
    if sync is not None:
        patch.sync_group_offsets = sync
        paths.append("sync_group_offsets")
    if groups is not None:
        patch.groups.extend(groups)
        paths.append("groups")
    if exclude is not None:
        patch.groups_exclude.extend(exclude)
        patch.no_default_groups_exclude = not exclude
        paths += ["groups_exclude", "no_default_groups_exclude"]
    if interval_s is not None:
        patch.sync_group_offsets_interval_ms = round(interval_s * 1000)
        paths.append("sync_group_offsets_interval_ms")
    return paths


@group.command("delete")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def delete(
    name: NameArg,
    *,
    etag: EtagOption = "",
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Delete a flow: its wrappers stop reading and its services report NOT_SERVING until it is back."""

    def action(admin: FerrymanAdmin, timeout_s: float) -> _View:
        admin.delete_flow(name, etag=etag, timeout_s=timeout_s)
        return {"deleted": name}, Table("deleted", title=name)

    return _run(connection, output, action)


@group.command("pause")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def pause(
    name: NameArg,
    *,
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Pause a flow: its wrappers stop reading the source (what is in flight is still committed)."""
    return _run(connection, output, lambda admin, timeout_s: _view(admin.pause_flow(name, timeout_s=timeout_s)))


@group.command("resume")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def resume(
    name: NameArg,
    *,
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Resume a paused flow."""
    return _run(connection, output, lambda admin, timeout_s: _view(admin.resume_flow(name, timeout_s=timeout_s)))


@group.command("apply")
@connection_options(timeout_s=FLOW_TIMEOUT_S)
def apply(
    *,
    file: Annotated[Path, typer.Option("--file", "-f", help="Configuration file (flows:), list of flows or one.")],
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Make the stored flows match the file: create missing, update changed, leave equal ones (idempotent).

    A flow's pause state is kept unless the file sets ``paused``; flows not in the file are left alone. Flows are
    applied in the file's order; if a call fails, the rows print with that flow "failed" and the ones after it
    "not applied", then the error and its exit status (running apply again finishes the job).
    """

    def action(admin: FerrymanAdmin, timeout_s: float) -> _View:
        items = _flow_values(file)
        wanted = [(_checked(v, f"flows.{i}"), "paused" in v) for i, v in enumerate(items)]
        rows: list[dict[str, str]] = []
        for config, sets_paused in wanted:
            try:
                rows.append(_apply_one(admin, config, sets_paused, timeout_s))
            except AdminError:
                rows.append({"flow": config.name, "action": "failed", "etag": ""})
                rows.extend({"flow": c.name, "action": "not applied", "etag": ""} for c, _ in wanted[len(rows) :])
                emit(output, rows, _apply_table(file, rows))
                raise
        return rows, _apply_table(file, rows)

    return _run(connection, output, action)


def _apply_one(admin: FerrymanAdmin, config: FlowConfig, sets_paused: bool, timeout_s: float) -> dict[str, str]:
    """Create, update or leave one flow of an apply; its row."""
    flow = to_proto(config)
    try:
        stored = admin.get_flow(config.name, timeout_s=timeout_s)
    except ResourceNotFoundError:
        created = admin.create_flow(flow, timeout_s=timeout_s)
        return {"flow": config.name, "action": "created", "etag": created.etag}
    if not sets_paused:
        flow.paused = stored.paused
    if to_config(stored) == to_config(flow):
        return {"flow": config.name, "action": "unchanged", "etag": stored.etag}
    updated = admin.update_flow(flow, None, etag=stored.etag, timeout_s=timeout_s)
    return {"flow": config.name, "action": "updated", "etag": updated.etag}


def _apply_table(file: Path, rows: list[dict[str, str]]) -> Table:
    table = Table("flow", "action", "etag", title=f"apply {file}", title_justify="left")
    for row in rows:
        table.add_row(row["flow"], row["action"], row["etag"])
    return table


def _renames(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        src, sep, dst = pair.partition("=")
        if not sep or not src or not dst:
            raise ConfigError(f"--rename takes SOURCE=DESTINATION, not {pair!r}")
        out[src] = dst
    return out


def _option_values(
    *,
    name: str | None,
    source: str | None,
    target: str | None,
    topic: list[str] | None,
    exclude: list[str] | None,
    naming: str | None,
    rename: list[str] | None,
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in (("name", name), ("source", source), ("target", target), ("topics", topic)):
        if value is not None:
            values[key] = value
    if exclude is not None:
        values["topics_exclude"] = exclude
    if naming is not None or rename is not None:
        values["naming"] = {
            **({"policy": naming} if naming else {}),
            **({"rename": _renames(rename)} if rename else {}),
        }
    return values
