"""``ferryman offsets``: destination offsets of source positions and of consumer groups, asked of the services."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer
from rich.table import Table

from ferryman.cli._common import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, fail
from ferryman.cli._connection import ConnectionOptions, connection_options
from ferryman.cli._status import OUTPUTS, OutputOption, emit
from ferryman.v1 import control_pb2

group = typer.Typer(
    help="Source and destination offsets of replicated records.", no_args_is_help=True, add_completion=False
)

#: A lookup reads the flow's offset-map partition up to the position: give it longer than a status read.
TRANSLATE_TIMEOUT_S = 30.0


@group.command("translate")
@connection_options(timeout_s=TRANSLATE_TIMEOUT_S)
def translate(
    *,
    topic: Annotated[str, typer.Argument(help="Source topic.", show_default=False)],
    partition: Annotated[int, typer.Argument(help="Source partition.", min=0, show_default=False)],
    offset: Annotated[int, typer.Argument(help="Source offset.", min=0, show_default=False)],
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Show where the record at a source TOPIC PARTITION OFFSET was written, from the flow's offset map.

    Ask a deduper of the flow (--server). Exit 7 when the position is not replicated yet.
    """
    if output not in OUTPUTS:
        return fail(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}", EXIT_USAGE)
    connected = connection.connect_or_fail()
    if isinstance(connected, int):
        return connected
    answer = connected.call(lambda admin: admin.translate_offsets(topic, partition, offset))
    if isinstance(answer, int):
        return answer
    data = {
        "source": {"topic": answer.source_topic, "partition": answer.source_partition, "offset": answer.source_offset},
        "destination": {
            "topic": answer.destination_topic,
            "partition": answer.destination_partition,
            "offset": answer.destination_offset,
        },
    }
    table = Table("", "topic", "partition", "offset", title="offset translation", title_justify="left")
    for side, where in data.items():
        table.add_row(side, str(where["topic"]), str(where["partition"]), str(where["offset"]))
    emit(output, data, table)
    return EXIT_OK


_STATUS_NAMES = {
    control_pb2.GROUP_OFFSET_STATUS_TRANSLATED: "translated",
    control_pb2.GROUP_OFFSET_STATUS_AHEAD_OF_REPLICATION: "ahead of replication",
    control_pb2.GROUP_OFFSET_STATUS_NOT_REPLICATED: "not replicated",
}


#: ``--server`` of translate-group: the deduper; the wrapper is ``--source-server``.
DeduperServerOption = Annotated[
    str,
    typer.Option(
        "--server",
        "-s",
        envvar="FERRYMAN_SERVER",
        help="host:port of a deduper of the flow: it translates (and commits) at the destination.",
        show_default=False,
    ),
]


@group.command("translate-group")
@connection_options(timeout_s=TRANSLATE_TIMEOUT_S, server=DeduperServerOption)
def translate_group(
    *,
    group_id: Annotated[str, typer.Argument(metavar="group", help="Consumer group id.", show_default=False)],
    source_server: Annotated[
        str,
        typer.Option(
            "--source-server",
            envvar="FERRYMAN_SOURCE_SERVER",
            help="host:port of a wrapper of the flow: it reads the group's offsets on the source cluster.",
            show_default=False,
        ),
    ],
    commit: Annotated[
        bool,
        typer.Option(
            "--commit",
            help="Commit the translated offsets for the group at the destination (its consumers there must be "
            "stopped; nothing is committed if a partition is not replicated yet).",
        ),
    ] = False,
    output: OutputOption = "table",
    connection: ConnectionOptions,
) -> int:
    """Show where a consumer group resumes at the destination; --commit sets it there, to move its consumers.

    A wrapper of the flow (--source-server) reads the group's committed offsets on the source; a deduper
    (--server) translates them from the flow's state and offset map. A translated offset is right after the
    copy of the last record the group read: the group reads nothing twice and skips nothing. "ahead of
    replication": the group read records not replicated yet; they are read again if they are replicated
    later. Exit 7 when the group has committed nothing on the flow's topics.
    """
    if output not in OUTPUTS:
        return fail(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}", EXIT_USAGE)
    at_source = replace(connection, server=source_server).connect_or_fail()
    if isinstance(at_source, int):
        return at_source
    read = at_source.call(lambda admin: admin.group_offsets(group_id))
    if isinstance(read, int):
        return read
    if not read.offsets:
        return fail(f"consumer group {group_id} has no committed offsets on the flow's source topics", EXIT_NOT_FOUND)
    connected = connection.connect_or_fail()
    if isinstance(connected, int):
        return connected
    answer = connected.call(
        lambda admin: (
            admin.commit_group_offsets(group_id, read.offsets)
            if commit
            else admin.translate_group_offsets(group_id, read.offsets)
        )
    )
    if isinstance(answer, int):
        return answer
    table = Table(
        "source topic",
        "partition",
        "committed",
        "destination topic",
        "destination offset",
        "status",
        title=f"group {group_id}" + (": committed at the destination" if commit else ""),
        title_justify="left",
    )
    for r in answer.offsets:
        placed = r.HasField("destination")
        table.add_row(
            r.source.topic,
            str(r.source.partition),
            str(r.source.offset),
            r.destination.topic if placed else "-",
            str(r.destination.offset) if placed else "-",
            _STATUS_NAMES.get(r.status, str(r.status)),
        )
    rows = [_group_row(r) for r in answer.offsets]
    emit(output, {"group": group_id, "committed": commit, "partitions": rows}, table)
    return EXIT_OK


def _position(o: control_pb2.GroupOffset) -> dict[str, object]:
    return {"topic": o.topic, "partition": o.partition, "offset": o.offset}


def _group_row(r: control_pb2.TranslatedGroupOffset) -> dict[str, object]:
    return {
        "source": _position(r.source),
        "destination": _position(r.destination) if r.HasField("destination") else None,
        "status": _STATUS_NAMES.get(r.status, str(r.status)),
        "replicated_up_to": r.replicated_up_to,
    }
