"""Running the bench's micro-benchmarks as a user does (smoke runs: their figures come from full runs)."""

from __future__ import annotations

import subprocess
import sys


def micro_benchmark_lines(module: str, bootstrap: str) -> list[str]:
    """The output lines of ``python -m <module>`` measuring 2000 records once per path against ``bootstrap``."""
    argv = [sys.executable, "-m", module, "--records", "2000", "--pairs", "1", "--bootstrap", bootstrap]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.splitlines()
