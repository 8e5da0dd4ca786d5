"""Replicator processes that never outlive the bench.

They are started by ``ferryman_local``'s child launcher, like the brokers: each in
its own session (process group), so stopping it reaches every process it started
(a JVM's helpers, a shell's children); killed at exit if still running; and, on
Linux, killed by the kernel if the bench itself is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ferryman_local import forget, signal_group
from ferryman_local import spawn as spawn_child


def spawn(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with stdout and stderr going to ``log``."""
    with log.open("ab") as out:
        return spawn_child(argv, cwd=Path.cwd(), output=out, env=env)


def stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every process group, wait up to ``grace_s`` in all, then SIGKILL what is left."""
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()  # SIGKILL cannot be ignored; this only reaps it
        # The group may outlive its leader (a child that ignored SIGTERM).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        forget(proc)
