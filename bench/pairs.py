"""What the micro-benchmarks of one path against another share: a cluster, and interleaved pairs.

This machine drifts within minutes, so the two paths alternate, and which goes
first alternates pair by pair; the figure of each path is its median.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ferryman_local import start_clusters


@contextmanager
def cluster(bootstrap: str | None, name: str) -> Iterator[str]:
    """``bootstrap`` when given; else a one-broker cluster of its own, stopped at the end."""
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        clusters = [] if bootstrap else start_clusters([name], base_dir=Path(tmp))
        try:
            yield bootstrap or clusters[0].bootstrap_servers
        finally:
            for c in clusters:
                c.stop()


def interleaved(paths: tuple[str, str], pairs: int, measure: Callable[[str], float], unit: str) -> dict[str, float]:
    """Measure each path ``pairs`` times, alternating, printing each pair; the median of each path."""
    figures: dict[str, list[float]] = {p: [] for p in paths}
    for pair in range(pairs):
        for path in paths if pair % 2 == 0 else paths[::-1]:
            figures[path].append(measure(path))
        print(f"pair {pair + 1}: " + ", ".join(f"{p} {figures[p][-1]:.2f}" for p in paths) + f" {unit}")
    return {p: statistics.median(v) for p, v in figures.items()}


def arguments(module: str, doc: str, paths: tuple[str, str]) -> argparse.ArgumentParser:
    """The command line every such micro-benchmark takes (``python -m <module>``)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n", maxsplit=1)[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records per measurement (%(default)s)")
    ap.add_argument("--value-bytes", type=int, default=100, help="size of every value (%(default)s)")
    ap.add_argument("--pairs", type=int, default=3, help="measurements of each path, interleaved (%(default)s)")
    ap.add_argument("--bootstrap", help="a cluster to use instead of starting one")
    ap.add_argument("--child", choices=paths, help=argparse.SUPPRESS)  # one measurement, in a fresh process
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    return ap


def in_child(module: str, path: str, bootstrap: str, topic: str, records: int, value_bytes: int) -> float:
    """One measurement of ``path`` in a fresh process (``--child``): the figure it prints last."""
    argv = [sys.executable, "-m", module, "--child", path, "--bootstrap", bootstrap, "--topic", topic]
    argv += ["--records", str(records), "--value-bytes", str(value_bytes)]
    return float(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()[-1])
