"""CPU seconds and peak RSS of process trees (a replicator's processes and their children)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import psutil

#: RSS is sampled this often; a peak shorter than this can be missed. Each sample
#: costs ~1 ms of the bench's own CPU per process, negligible at this rate.
_SAMPLE_INTERVAL_S = 0.2


class TreeSampler:
    """Samples processes and all their descendants on a thread.

    CPU is user + system time of every process seen (a process that exits keeps
    its last sample), plus what each process collected from children it reaped;
    ``by_root()`` splits it by root process (each with its descendants), and
    ``kernel_s()`` gives the system part. RSS is summed over the live processes at
    each sample; the peak is kept.

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
        # pid -> (pid of the root of its tree, CPU seconds, of which in the kernel)
        self._cpu: dict[int, tuple[int, float, float]] = {}
        self._lock = threading.Lock()
        self.peak_rss_bytes = 0
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
        with self._lock:
            for root, proc in self._tree():
                try:
                    with proc.oneshot():
                        t = proc.cpu_times()
                        mem = proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue
                kernel = t.system + t.children_system
                self._cpu[proc.pid] = (root, t.user + t.children_user + kernel, kernel)
                rss += mem
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            return sum(cpu for _root, cpu, _kernel in self._cpu.values())

    def kernel_s(self) -> float:
        """CPU seconds spent in the kernel (system time), of the total, as of the last sample."""
        with self._lock:
            return sum(kernel for _root, _cpu, kernel in self._cpu.values())

    def by_root(self) -> dict[int, float]:
        """CPU seconds of each root's tree (root pid: seconds) as of the last sample."""
        with self._lock:
            out = dict.fromkeys((r.pid for r in self._roots), 0.0)
            for root, cpu, _kernel in self._cpu.values():
                out[root] += cpu
            return out

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> float:
        """Take a last sample, stop the thread; return the CPU seconds used."""
        cpu = self.sample()
        self._stop.set()
        self._thread.join()
        return cpu
