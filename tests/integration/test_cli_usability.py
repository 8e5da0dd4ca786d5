"""The ``ferryman`` CLI as a person meets it: help on every command, shell completion, and one readable line
with a distinct exit status for each mistake, never a traceback, both piped and under a real terminal (tmux).

Commands are found in the Typer app, so a command added later is covered here without a change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from ferryman.cli import app
from ferryman.config import RpcConfig, SecretStr, TlsConfig
from ferryman_local import reserve_port

from tests.helpers.certs import TestPki, make_pki
from tests.helpers.grpc_clients import local
from tests.integration.test_cli_status import _server

pytestmark = pytest.mark.integration

FERRYMAN = Path(sys.executable).parent / "ferryman"
TOKEN = "usability-token-77"
#: A command under a busy shared machine takes seconds to start (Python, gRPC, Rich imports).
COMMAND_TIMEOUT_S = 120.0


def _commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the app, groups included (``()`` is ``ferryman`` itself)."""
    command = command or typer.main.get_command(app)
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def _leaves() -> list[tuple[str, ...]]:
    paths = list(_commands())
    return [p for p in paths if p and not any(q[: len(p)] == p and len(q) > len(p) for q in paths)]


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FERRYMAN_")} | dict(extra or {})


def _helps(argvs: Mapping[Any, list[str]]) -> dict[Any, tuple[int, str, str]]:
    """Each argv run with ``--help``, all at once: key -> (exit status, stdout, stderr)."""
    running = {
        key: subprocess.Popen(
            [*argv, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env({"COLUMNS": "120"}),
        )
        for key, argv in argvs.items()
    }
    done = {}
    for key, process in running.items():
        out, err = process.communicate(timeout=COMMAND_TIMEOUT_S)
        done[key] = (process.returncode, out, err)
    return done


def test_help_on_every_command() -> None:
    paths = list(_commands())
    assert {("status",), ("lag",), ("offsets", "translate"), ("audit", "run")} <= set(paths)
    for path, (status, out, err) in _helps({path: [str(FERRYMAN), *path] for path in paths}).items():
        assert status == 0, (path, err)
        assert " ".join(("Usage: ferryman", *path)) in out, (path, out)
        assert err == "" and "Traceback" not in out


def test_help_on_every_console_script() -> None:
    """Every program the package installs answers ``--help`` with its usage (``ferryman-demo --help`` once
    crashed on a percent sign in an option's help, which argparse formats)."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    scripts = sorted(pyproject["project"]["scripts"])
    assert {"ferryman", "ferryman-wrapper", "ferryman-deduper", "ferryman-demo"} <= set(scripts)
    for name, (status, out, err) in _helps({name: [str(FERRYMAN.parent / name)] for name in scripts}).items():
        assert status == 0, (name, err)
        assert "usage:" in out.lower() and name in out, (name, out)
        assert "Traceback" not in out + err, (name, err)


def _complete(words: str) -> list[str]:
    """What bash completion offers for the command line words (the cursor after the last word)."""
    cword = len(words.split()) if words.endswith(" ") else len(words.split()) - 1
    result = subprocess.run(
        [str(FERRYMAN)],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env=_env({"_FERRYMAN_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}),
        check=False,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result.stdout.split()


def test_bash_completion_offers_the_subcommands_and_options() -> None:
    root = typer.main.get_command(app)
    assert _complete("ferryman ") == list(root.commands)  # type: ignore[attr-defined]
    assert _complete("ferryman offsets ") == ["translate", "translate-group"]
    assert set(_complete("ferryman audit ")) == set(root.commands["audit"].commands)  # type: ignore[attr-defined]
    assert set(_complete("ferryman status --serv")) == {"--server", "--server-name"}
    # Typer finds the shell from the parent process, as when a person types it in bash.
    script = subprocess.run(
        # (Two commands, so that bash stays the parent instead of exec-ing the one command.)
        ["bash", "-c", f"{FERRYMAN} --show-completion; exit $?"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env=_env(),
        check=False,
    )
    assert script.returncode == 0 and "_FERRYMAN_COMPLETE=complete_bash" in script.stdout
    assert "complete -o default -F _ferryman_completion ferryman" in script.stdout


# -- mistakes --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mistake:
    """One user mistake: the command line, the exit status it must end with, words of its one line."""

    name: str
    args: tuple[str, ...]
    code: int
    says: tuple[str, ...]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mistakes(pki: TestPki) -> Iterator[list[Mistake]]:
    """The mistakes, against real servers on loopback: plaintext with a token, and TLS."""
    with ExitStack() as stack:
        plain = local(stack.enter_context(_server("deduper", RpcConfig(auth_token=SecretStr(TOKEN)))).port)
        tls = RpcConfig(tls=TlsConfig(cert_file=pki.server_cert, key_file=pki.server_key, ca_file=pki.ca_cert))
        secure = local(stack.enter_context(_server("deduper", tls)).port)
        nobody = local(reserve_port())
        other = make_pki(pki.ca_cert.parent / "other", ca_name="Untrusted CA")
        yield [
            Mistake("malformed-server", ("status", "-s", "deduper-1"), 2, ("--server must be host:port",)),
            Mistake("unknown-option", ("status", "-s", plain, "--colour"), 2, ("--colour",)),
            Mistake("missing-ca-file", ("lag", "-s", plain, "--ca-file", "/nonexistent/ca.pem"), 2, ("--ca-file",)),
            Mistake("bad-output", ("status", "-s", plain, "-o", "xml"), 2, ("--output",)),
            Mistake("nothing-listens", ("status", "-s", nobody, "--timeout", "2"), 4, ("no answer from",)),
            Mistake("no-token", ("status", "-s", plain), 5, ("refused the credentials", "MISSING_TOKEN")),
            Mistake("bad-token", ("status", "-s", plain, "--token", "guess"), 5, ("INVALID_TOKEN",)),
            Mistake(
                "untrusted-server",
                ("status", "-s", secure, "--ca-file", str(other.ca_cert), "--timeout", "3"),
                8,
                ("TLS with", "--ca-file"),
            ),
            Mistake("plaintext-to-tls", ("status", "-s", secure, "--timeout", "3"), 4, ("pass --ca-file",)),
            Mistake(
                "no-offset-map",
                ("offsets", "translate", "orders", "0", "5", "-s", plain, "--token", TOKEN),
                9,
                ("rejected the request", "FAILED_PRECONDITION"),
            ),
            Mistake("unknown-flow", ("audit", "run", "--flow", "nope"), 2, ("nope",)),
        ]


def _check(mistake: Mistake, code: int, stderr_lines: list[str], stdout: str) -> None:
    assert code == mistake.code, (mistake.name, code, stderr_lines)
    assert len(stderr_lines) == 1 and stderr_lines[0].startswith("ferryman: "), (mistake.name, stderr_lines)
    for words in mistake.says:
        assert words in stderr_lines[0], (mistake.name, stderr_lines[0])
    assert "Traceback" not in stdout and TOKEN not in stderr_lines[0] + stdout


def test_each_mistake_is_one_line_and_its_own_exit_status_when_piped(mistakes: list[Mistake]) -> None:
    env = _env(_seed())
    running = {
        m: subprocess.Popen(
            [str(FERRYMAN), *m.args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for m in mistakes
    }
    for mistake, process in running.items():
        out, err = process.communicate(timeout=COMMAND_TIMEOUT_S)
        _check(mistake, process.returncode, err.splitlines(), out)


def _seed() -> dict[str, str]:
    """A configuration from the seed variables, for the commands that read one (audit)."""
    return {
        "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "KAFKA_CLUSTERS_SOURCE_TOPIC": "orders",
        "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS": "127.0.0.1:2",
        "KAFKA_CLUSTERS_DESTINATION_TOPIC": "orders",
    }


def test_each_mistake_reads_the_same_under_a_terminal(mistakes: list[Mistake]) -> None:
    """Each command runs in a tmux pane (stdout and stderr a real terminal); the pane shows one line and the status."""
    assert shutil.which("tmux"), "tmux is missing: scripts/bootstrap installs it"
    socket = f"ferryman-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    env = _env(_seed())
    try:
        for i, mistake in enumerate(mistakes):
            command = " ".join([str(FERRYMAN), *(f"'{a}'" for a in mistake.args)])
            window = f"m{i}"
            where = ["new-session", "-d", "-s", "cli", "-x", "200", "-y", "50"] if i == 0 else ["new-window", "-d"]
            subprocess.run(
                [*tmux, *where, "-n", window, *(["-t", "cli"] if i else []), f"{command}; echo EXIT=$?; sleep 600"],
                check=True,
                env=env,
                timeout=30,
            )
        for i, mistake in enumerate(mistakes):
            deadline = time.monotonic() + COMMAND_TIMEOUT_S
            while True:
                pane = subprocess.run(
                    [*tmux, "capture-pane", "-p", "-J", "-t", f"cli:m{i}"], capture_output=True, text=True, check=True
                ).stdout
                if "EXIT=" in pane or time.monotonic() > deadline:
                    break
                time.sleep(0.2)  # polling the pane: tmux has no wait-for-output
            lines = [line.rstrip() for line in pane.splitlines() if line.strip()]
            ends = [n for n, line in enumerate(lines) if line.startswith("EXIT=")]
            assert ends, (mistake.name, pane)
            _check(mistake, int(lines[ends[0]].removeprefix("EXIT=")), lines[: ends[0]], "")
            # The pane is the terminal's own rendering: also no traceback on the terminal as a whole.
            assert "Traceback" not in pane
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, timeout=30)
