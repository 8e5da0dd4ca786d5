"""Replicator processes that never outlive the bench.

Each child runs in its own session (process group), so stopping it reaches every
process it started (a JVM's helpers, a shell's children). An ``atexit`` hook
kills whatever is still running when the bench exits; on Linux each child also
asks the kernel for SIGKILL if the bench itself is SIGKILLed (``PR_SET_PDEATHSIG``).
Children are spawned from the main thread only: the kernel ties that signal to
the thread that forked.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ferryman_local import die_with_parent_preexec

_live: set[subprocess.Popen[bytes]] = set()


def spawn(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with stdout and stderr going to ``log``."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=die_with_parent_preexec(),  # noqa: PLW1509 -- only prctl(2), see the module docstring
        )
    _live.add(proc)
    return proc


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every process group, wait up to ``grace_s`` in all, then SIGKILL what is left."""
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)
            proc.wait()  # SIGKILL cannot be ignored; this only reaps it
        # The group may outlive its leader (a child that ignored SIGTERM).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _live.discard(proc)


@atexit.register
def _kill_all() -> None:
    for proc in list(_live):
        _signal(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)  # SIGKILL takes effect at once; this only reaps it
    _live.clear()
