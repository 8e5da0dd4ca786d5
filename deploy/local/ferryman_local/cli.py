"""``ferryman-local``: start local Kafka clusters to try Ferryman (``python -m ferryman_local``).

Subcommands:
* ``up``: start clusters (default ``source`` and ``destination``), print their
  bootstrap servers, write them to ``DIR/clusters.json`` and stay up until
  Ctrl-C / SIGTERM;
* ``fetch``: resolve the broker jars into the cache and exit.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from ferryman_local._cluster import start_clusters
from ferryman_local._errors import HarnessError
from ferryman_local._maven import ensure_kafka_jars


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point."""
    parser = argparse.ArgumentParser(prog="ferryman-local", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start local clusters and keep them running")
    up.add_argument("--clusters", default="source,destination", help="comma-separated cluster names")
    up.add_argument("--dir", type=Path, default=Path(".ferryman/local"), help="work directory (data and logs)")
    fetch = sub.add_parser("fetch", help="download the broker jars into the cache")
    fetch.add_argument("--mirrormaker", action="store_true", help="also fetch MirrorMaker 2")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(ensure_kafka_jars(with_mirrormaker=args.mirrormaker))
            return 0
        return _up([n for n in args.clusters.split(",") if n], args.dir)
    except HarnessError as exc:
        print(f"ferryman-local: {exc}")
        return 1


def _up(names: list[str], work_dir: Path) -> int:
    work_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    clusters = start_clusters(names, base_dir=work_dir)
    try:
        info = {c.name: {"bootstrap_servers": c.bootstrap_servers, "cluster_id": c.cluster_id} for c in clusters}
        (work_dir / "clusters.json").write_text(json.dumps(info, indent=2))
        for c in clusters:
            print(f"{c.name} {c.bootstrap_servers} {c.cluster_id}", flush=True)
        print(f"clusters up; details in {work_dir / 'clusters.json'}; Ctrl-C stops them", flush=True)
        stop.wait()
    finally:
        for c in clusters:
            c.stop()
    return 0
