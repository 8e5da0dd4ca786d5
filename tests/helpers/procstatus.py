"""A process's memory figures from ``/proc/<pid>/status`` (Linux)."""

from __future__ import annotations

from pathlib import Path


def status_kib(field: str, pid: int | str = "self") -> int:
    """A ``/proc/<pid>/status`` field in KiB: ``VmRSS`` (resident now), ``VmHWM`` (its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")
