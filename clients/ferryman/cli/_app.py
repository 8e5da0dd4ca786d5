"""The Typer app and its entry point; command groups are added here, one module each."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

from ferryman.cli import _audit, _flows, _offsets, _status, _trace
from ferryman.cli._common import EXIT_USAGE, fail

app = typer.Typer(
    name="ferryman",
    help="Operate Ferryman flows: exactly-once replication of Kafka topics between clusters.",
    no_args_is_help=True,
    # --install-completion / --show-completion (bash, zsh, fish, PowerShell): commands, options, values.
    add_completion=True,
    pretty_exceptions_enable=False,
)
app.add_typer(_audit.group, name="audit")
app.add_typer(_flows.group, name="flows")
app.add_typer(_offsets.group, name="offsets")
app.command("status")(_status.status)
app.command("lag")(_status.lag)
app.command("trace")(_trace.trace)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: run the app, turning usage errors into one line and exit code 2."""
    command = typer.main.get_command(app)
    try:
        result = command.main(
            args=list(sys.argv[1:] if argv is None else argv), prog_name="ferryman", standalone_mode=False
        )
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return fail("aborted", EXIT_USAGE)
    except typer.TyperException as exc:  # click's usage errors (bad option, missing argument, ...)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return fail(message, int(getattr(exc, "exit_code", EXIT_USAGE)))
    return int(result) if isinstance(result, int) else 0
