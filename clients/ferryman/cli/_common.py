"""What every command group shares: exit codes, loading the configuration, one-line errors, stop signals."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ferryman.config import FerrymanConfig, FlowConfig, load_config
from ferryman.errors import ConfigError
from ferryman.signals import on_signals

_log = logging.getLogger(__name__)

# Exit statuses, one per kind of outcome, the same for every command (docs/cli.md lists them).
#: Success.
EXIT_OK = 0
#: An audit found a difference.
EXIT_FINDING = 1
#: A usage mistake: unknown option, bad value, malformed --server, missing or inconsistent TLS files, or a
#: value the server refused (INVALID_ARGUMENT, naming the field).
EXIT_USAGE = 2
#: The command could not do its work: a cluster unreachable, a read failing, a server error not listed below.
EXIT_FAILED = 3
#: The server did not answer: nothing listens, unreachable, deadline passed, plaintext to a TLS port.
EXIT_UNAVAILABLE = 4
#: No token, or one the server does not know (UNAUTHENTICATED).
EXIT_UNAUTHENTICATED = 5
#: The token's role may not make this call (PERMISSION_DENIED).
EXIT_DENIED = 6
#: What the command names does not exist (NOT_FOUND): an unknown flow, a source position not replicated yet.
EXIT_NOT_FOUND = 7
#: The TLS handshake failed: untrusted server certificate, name mismatch, TLS to a plaintext port.
EXIT_TLS = 8
#: The server refused the request in its current state (FAILED_PRECONDITION, OUT_OF_RANGE: a feature turned off,
#: a change that cannot apply live, a replication cycle) or does not serve it (UNIMPLEMENTED: the other service).
EXIT_REJECTED = 9
#: What the command would create exists already (ALREADY_EXISTS): a flow of that name.
EXIT_EXISTS = 10
#: A concurrent change won (ABORTED): the flow changed since the --etag given, or other writers kept winning.
#: Read it again and retry.
EXIT_CONFLICT = 11

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


class StopSignals:
    """SIGTERM and SIGINT as stop requests: counted until a target is attached, then forwarded to it.

    Handled on the relay's thread (`ferryman.signals`), never in a signal handler: a target need not be
    signal-safe.
    """

    def __init__(self) -> None:
        self._requests = 0
        self._forwarded = 0
        self._target: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (from the main thread; again after a library installed its own)."""
        on_signals(self._on_signal)

    def forward_to(self, target: Callable[[], None]) -> None:
        """Send every request, past and future, to target, each exactly once."""
        with self._lock:
            self._target = target
            due, self._forwarded = self._requests - self._forwarded, self._requests
        for _ in range(due):
            target()

    def _on_signal(self, signum: int) -> None:
        _log.info("received %s: stopping", signal.Signals(signum).name)
        with self._lock:
            self._requests += 1
            target = self._target
            if target is not None:
                self._forwarded += 1
        if target is not None:
            target()
