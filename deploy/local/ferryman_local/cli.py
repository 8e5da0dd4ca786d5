"""``ferryman-local``: local Kafka clusters to try Ferryman on (also ``python -m ferryman_local``).

Subcommands:

* ``up``: start clusters (default ``source`` and ``destination``), print one line
  per cluster (``name bootstrap_servers cluster_id``), write the same to
  ``DIR/clusters.json``, and stay up until Ctrl-C or SIGTERM, then stop them in
  order. Data stays in ``DIR``: the next ``up`` with the same ``DIR`` brings the
  same clusters back (``--fresh`` starts from empty ones).
* ``fetch``: resolve the broker jars into the cache and exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from ferryman_local._cluster import LocalCluster, start_clusters
from ferryman_local._errors import HarnessError
from ferryman_local._maven import ensure_kafka_jars

CLUSTERS_FILE = "clusters.json"
"""Name of the file ``up`` writes into its directory: cluster name -> bootstrap servers, id, pid, work dir."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        The process exit code: 0 on success (``up``: after a clean stop), 1 on a harness error.
    """
    parser = argparse.ArgumentParser(prog="ferryman-local", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start local clusters and keep them running until Ctrl-C / SIGTERM")
    up.add_argument(
        "--clusters", default="source,destination", help="comma-separated cluster names (default: %(default)s)"
    )
    up.add_argument(
        "--dir", type=Path, default=Path(".ferryman/local"), help="data, logs and clusters.json (default: %(default)s)"
    )
    up.add_argument("--fresh", action="store_true", help="delete the clusters' existing data first")
    fetch = sub.add_parser("fetch", help="resolve the broker jars into the cache and exit")
    fetch.add_argument("--mirrormaker", action="store_true", help="also resolve MirrorMaker 2")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("ferryman_local.librdkafka").setLevel(logging.ERROR)
    try:
        if args.command == "fetch":
            print(ensure_kafka_jars(with_mirrormaker=args.mirrormaker), flush=True)
            return 0
        names = [n.strip() for n in args.clusters.split(",") if n.strip()]
        if not names:
            parser.error("--clusters: give at least one name")
        return _up(names, args.dir, fresh=args.fresh)
    except HarnessError as exc:
        print(f"ferryman-local: {exc}", file=sys.stderr, flush=True)
        return 1


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    # SIGTERM takes the same path as Ctrl-C: unwind, stopping the clusters on the way out.
    raise KeyboardInterrupt


def _up(names: list[str], base_dir: Path, *, fresh: bool) -> int:
    base_dir = base_dir.resolve()
    base_dir.mkdir(parents=True, exist_ok=True)
    info_path = base_dir / CLUSTERS_FILE
    info_path.unlink(missing_ok=True)
    if fresh:
        for name in names:
            shutil.rmtree(base_dir / name, ignore_errors=True)
    signal.signal(signal.SIGTERM, _interrupt)
    clusters: list[LocalCluster] = []
    try:
        clusters = start_clusters(names, base_dir=base_dir)
        info = {
            c.name: {
                "bootstrap_servers": c.bootstrap_servers,
                "cluster_id": c.cluster_id,
                "pid": c.pid,
                "work_dir": str(c.work_dir),
            }
            for c in clusters
        }
        partial = info_path.with_suffix(".tmp")
        partial.write_text(json.dumps(info, indent=2) + "\n")
        partial.replace(info_path)  # readers never see half a file
        for c in clusters:
            print(f"{c.name} {c.bootstrap_servers} {c.cluster_id}", flush=True)
        print(f"# clusters up; details in {info_path}; Ctrl-C or SIGTERM stops them", file=sys.stderr, flush=True)
        threading.Event().wait()  # until a signal raises KeyboardInterrupt
    except KeyboardInterrupt:
        if not clusters:
            return 130  # interrupted while starting: whatever did start is killed at exit
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        info_path.unlink(missing_ok=True)
        for c in clusters:
            c.stop()
    return 0
