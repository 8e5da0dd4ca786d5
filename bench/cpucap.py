"""``--cpu-per-process``: each replicator process confined to a share of the CPU by a cgroup of its own.

What it is for: issue 29's scale-out goal asks whether a second wrapper and deduper turn a second core into
rate. On this 2-core machine the brokers and the rig already fill the cores, so more processes only share
them. Capping every process at, say, 0.1 of a core makes each one a small stand-in for a GIL-bound process on
a core of its own, with the machine's cores to spare: two pairs then have twice one pair's CPU, and the rate
shows whether the flow turns it into records (partition assignment, staging, commits) or meets a shared limit.

A CFS bandwidth quota per process: cgroup v1's ``cpu`` controller (``cpu.cfs_quota_us``) or cgroup v2's
``cpu.max``, whichever is mounted writable. Needs root (or a delegated cgroup).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import BenchError

#: CFS period of every cap: the kernel's default (100 ms), within which a process may run quota x period.
_PERIOD_US = 100_000
#: cgroup v1's cpu controller and cgroup v2's unified hierarchy, where this machine's distributions mount them.
_V1_ROOT = Path("/sys/fs/cgroup/cpu")
_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


@dataclass
class CpuCaps:
    """Makes one capped cgroup per process (``confine``) and removes them (``release``)."""

    cores: float
    """CPU each confined process may use, in cores (0.1: 10 ms of every 100 ms)."""
    run_id: str
    """Names this run's cgroups (``ferryman-bench-<run_id>-<pid>``)."""
    root: Path = field(init=False)
    v2: bool = field(init=False)
    _made: list[Path] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        cpus = os.cpu_count() or 1
        if not 0.01 <= self.cores <= cpus:
            raise BenchError(f"--cpu-per-process: {self.cores} is not between 0.01 and {cpus} cores")
        if os.access(_V1_ROOT / "cpu.cfs_quota_us", os.W_OK):
            self.root, self.v2 = _V1_ROOT, False
            return
        for root in _V2_ROOTS:
            controllers = root / "cgroup.controllers"
            if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(root, os.W_OK):
                self.root, self.v2 = root, True
                subtree = root / "cgroup.subtree_control"
                if "cpu" not in subtree.read_text().split():
                    subtree.write_text("+cpu")
                return
        raise BenchError(
            "--cpu-per-process needs a writable cgroup cpu controller (cgroup v1 at /sys/fs/cgroup/cpu, or v2 with "
            "the cpu controller); none here (run as root, or drop --cpu-per-process)"
        )

    def confine(self, pid: int) -> None:
        """Move process ``pid`` (all its threads; its later children follow) into a cgroup capped at ``cores``."""
        group = self.root / f"ferryman-bench-{self.run_id}-{pid}"
        group.mkdir()
        self._made.append(group)
        quota = round(self.cores * _PERIOD_US)
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        """Remove the cgroups made so far (their processes have exited; an empty cgroup is removed by rmdir)."""
        while self._made:
            group = self._made.pop()
            with contextlib.suppress(OSError):  # still in use (a process left): the next boot clears it
                group.rmdir()
