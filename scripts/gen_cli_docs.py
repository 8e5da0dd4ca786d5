"""Generate docs/cli.md from the ``ferryman`` Typer app (every command, its arguments, options and variables).

Usage: ``python scripts/gen_cli_docs.py`` rewrites the file; ``python scripts/gen_cli_docs.py --check`` exits 1
if it is out of date (CI's drift check). The reference comes from Typer's own ``typer ... utils docs``; the
exit statuses are read from the ``EXIT_*`` constants of ``clients/ferryman/cli/_common.py`` and their ``#:`` text.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"
COMMON = ROOT / "clients" / "ferryman" / "cli" / "_common.py"

HEADER = (
    "<!-- Generated from the Typer app (clients/ferryman/cli) by `python scripts/gen_cli_docs.py`;"
    " CI fails when it is out of date. -->\n\n"
)


def _reference() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FERRYMAN_", "KAFKA_CLUSTERS_"))}
    env["COLUMNS"] = "100"  # the docs do not depend on it; pinned anyway
    args = [sys.executable, "-m", "typer", "ferryman.cli._app", "utils", "docs", "--name", "ferryman"]
    args += ["--title", "`ferryman` command reference"]
    result = subprocess.run(args, capture_output=True, text=True, env=env, check=True, timeout=300)
    return result.stdout.rstrip() + "\n"


def _exit_statuses() -> str:
    """The exit-status table, from the constants and the ``#:`` comment lines above each."""
    lines = COMMON.read_text().splitlines()
    rows = []
    for node in ast.parse(COMMON.read_text()).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id.startswith("EXIT_")):
            continue
        comment = []
        n = node.lineno - 2
        while n >= 0 and lines[n].startswith("#:"):
            comment.insert(0, lines[n].removeprefix("#:").strip())
            n -= 1
        text = " ".join(comment) or "Success."
        rows.append(f"| {node.value.value} | `{target.id}` | {text} |")
    table = "\n".join(["| Status | Name | Meaning |", "|---|---|---|", *rows])
    intro = "Every failure is one line on stderr (`ferryman: ...`), never a traceback."
    return f"\n## Exit statuses\n\n{intro}\n\n{table}\n"


def render() -> str:
    """The whole file."""
    return HEADER + _reference() + _exit_statuses()


def main() -> int:
    """Write docs/cli.md, or with --check report whether it is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is out of date")
    text = render()
    if parser.parse_args().check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
