"""``ferryman offsets translate``: the destination offset of a source position, asked of a deduper."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ferryman.cli._common import EXIT_OK, EXIT_USAGE, fail
from ferryman.cli._connection import ConnectionOptions, connection_options
from ferryman.cli._status import OUTPUTS, OutputOption, emit

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
