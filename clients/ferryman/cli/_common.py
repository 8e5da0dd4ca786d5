"""What every command group shares: exit codes, loading the configuration, one-line errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ferryman.config import FerrymanConfig, FlowConfig, load_config
from ferryman.errors import ConfigError

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2
EXIT_FAILED = 3

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="FERRYMAN_CONFIG",
        help="YAML configuration (env FERRYMAN_CONFIG); without it the KAFKA_CLUSTERS_* variables describe a "
        "one-topic flow, as for the services.",
        show_default=False,
    ),
]
FlowOption = Annotated[
    str | None, typer.Option("--flow", envvar="FERRYMAN_FLOW", help="Flow (env FERRYMAN_FLOW); default: the only one.")
]
OutputOption = Annotated[
    str, typer.Option("--output", "-o", help="text (tables, progress on a terminal) or json (for scripts).")
]


def fail(message: str, code: int) -> int:
    """Print ``ferryman: <message>`` on stderr as one line and return code."""
    print(f"ferryman: {' '.join(message.split()) or 'failed'}", file=sys.stderr)
    return code


def load_flow(config_path: Path | None, flow: str | None) -> tuple[FerrymanConfig, FlowConfig]:
    """The configuration (file or environment, like the services) and the chosen flow.

    Raises:
        ConfigError: no configuration, an invalid one, or no such flow.
    """
    config = load_config(config_path, os.environ)
    return config, config.flow(flow)


def check_output(output: str) -> None:
    """Refuse an unknown output format.

    Raises:
        ConfigError: output is neither text nor json.
    """
    if output not in ("text", "json"):
        raise ConfigError(f"--output must be text or json, not {output!r}")
