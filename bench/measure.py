"""CPU seconds, page faults and peak RSS of process trees (a replicator's processes and their children)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import NamedTuple

import psutil

#: RSS is sampled this often; a peak shorter than this can be missed. Each sample
#: costs ~1 ms of the bench's own CPU per process, negligible at this rate.
_SAMPLE_INTERVAL_S = 0.2


class Usage(NamedTuple):
    """What a process, or a tree of them, has used so far."""

    cpu_s: float = 0.0
    """User + system CPU seconds."""
    kernel_s: float = 0.0
    """Of which system (kernel) time."""
    minor_faults: int = 0
    """Minor page faults: every first touch of a fresh page is one, and the kernel
    zero-fills an anonymous page on it (``clear_page``)."""

    def plus(self, other: Usage) -> Usage:
        """The two usages together."""
        return Usage(self.cpu_s + other.cpu_s, self.kernel_s + other.kernel_s, self.minor_faults + other.minor_faults)


def _minor_faults(pid: int) -> int | None:
    """Minor faults of a process and of the children it reaped (``/proc/<pid>/stat``); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[7]) + int(fields[8])  # minflt, cminflt (fields 10 and 11 of proc(5))


class TreeSampler:
    """Samples processes and all their descendants on a thread.

    CPU is user + system time of every process seen (a process that exits keeps
    its last sample), plus what each process collected from children it reaped;
    ``by_root()`` splits it by root process (each with its descendants),
    ``kernel_s()`` gives the system part, and ``usage_by_root()`` both with the
    minor page faults. RSS is summed over the live processes at each sample; the
    peak is kept.

    Args:
        pids: root processes (e.g. a JVM, a Python service, a shell that started one).
    """

    def __init__(self, pids: Iterable[int]) -> None:
        self._roots: list[psutil.Process] = []
        for pid in pids:
            try:
                self._roots.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        # pid -> (pid of the root of its tree, what the process used)
        self._usage: dict[int, tuple[int, Usage]] = {}
        self._lock = threading.Lock()
        self.peak_rss_bytes = 0
        #: root pid -> peak of its tree's summed RSS
        self.peak_rss_by_root: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self.sample()
        self._thread.start()

    def _tree(self) -> list[tuple[int, psutil.Process]]:
        """(root pid, process) of every live process of every tree."""
        out: list[tuple[int, psutil.Process]] = []
        for root in self._roots:
            try:
                out.extend((root.pid, p) for p in (root, *root.children(recursive=True)))
            except psutil.NoSuchProcess:
                continue
        return out

    def sample(self) -> float:
        """Take a sample now; return the CPU seconds used so far."""
        rss = 0
        rss_by_root: dict[int, int] = {}
        with self._lock:
            for root, proc in self._tree():
                try:
                    with proc.oneshot():
                        t = proc.cpu_times()
                        mem = proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue
                faults = _minor_faults(proc.pid)
                if faults is None:
                    continue  # gone in between: its last sample stands
                kernel = t.system + t.children_system
                self._usage[proc.pid] = (root, Usage(t.user + t.children_user + kernel, kernel, faults))
                rss += mem
                rss_by_root[root] = rss_by_root.get(root, 0) + mem
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            for root, tree_rss in rss_by_root.items():
                self.peak_rss_by_root[root] = max(self.peak_rss_by_root.get(root, 0), tree_rss)
            return sum(u.cpu_s for _root, u in self._usage.values())

    def kernel_s(self) -> float:
        """CPU seconds spent in the kernel (system time), of the total, as of the last sample."""
        with self._lock:
            return sum(u.kernel_s for _root, u in self._usage.values())

    def usage_by_root(self) -> dict[int, Usage]:
        """What each root's tree used (root pid: usage) as of the last sample."""
        with self._lock:
            out = dict.fromkeys((r.pid for r in self._roots), Usage())
            for root, usage in self._usage.values():
                out[root] = out[root].plus(usage)
            return out

    def by_root(self) -> dict[int, float]:
        """CPU seconds of each root's tree (root pid: seconds) as of the last sample."""
        return {root: usage.cpu_s for root, usage in self.usage_by_root().items()}

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> float:
        """Take a last sample, stop the thread; return the CPU seconds used."""
        cpu = self.sample()
        self._stop.set()
        self._thread.join()
        return cpu
