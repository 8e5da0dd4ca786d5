"""Micro-benchmark of the bench's reader: ``consume()`` per batch against the compiled reader.

The latency phase's read_committed reader shares the machine with what it
measures, so what it costs per record is taken from every row. Each measurement
is a fresh process that reads a preloaded topic (``--records`` bench records of
``--value-bytes``, 8 partitions) from its start to its end with the bench's
``LiveWatcher``, latencies included, through one path. Its figure is the
process's CPU seconds, librdkafka's threads included, per million records. The
two paths alternate (``bench.pairs``).

    python -m bench.read_path [--records 1000000] [--pairs 3] [--bootstrap host:port]

Without ``--bootstrap`` it starts a one-broker cluster of its own and stops it at the end.
"""

from __future__ import annotations

import sys
import time
import uuid

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from bench.latency import SOURCE_TOPIC_CONFIG
from bench.pairs import arguments, cluster, in_child, interleaved
from bench.preload import preload
from bench.readcols import WHY_NOT
from bench.records import split_counts
from bench.topics import create_topics
from bench.verify import LiveWatcher

PATHS = ("consume", "direct")
_PARTITIONS = 8
_BUDGET_S = 300.0


def _preload(bootstrap: str, records: int, value_bytes: int) -> str:
    topic = f"read-path-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], _PARTITIONS, SOURCE_TOPIC_CONFIG)
    preload(bootstrap, [topic], split_counts(records, _PARTITIONS), value_bytes, budget_s=_BUDGET_S)
    return topic


def _child(path: str, bootstrap: str, topic: str, records: int) -> float:
    """Read the topic through one path in this process; its CPU seconds per million records."""
    cpu_start = time.process_time()
    deadline = time.monotonic() + _BUDGET_S
    counts = split_counts(records, _PARTITIONS)
    watcher = LiveWatcher(
        bootstrap, [topic], counts, deadline, latency=TIMESTAMP_LOG_APPEND_TIME, direct=path == "direct"
    )
    watcher.done.wait(_BUDGET_S)
    watcher.stop(_BUDGET_S)
    if watcher.error is not None or not watcher.tally.complete or len(watcher.latencies_ms) != records:
        raise SystemExit(f"incomplete read: {watcher.error or watcher.tally}")
    return (time.process_time() - cpu_start) / records * 1e6


def main(argv: list[str] | None = None) -> int:
    args = arguments("bench.read_path", __doc__, PATHS).parse_args(argv)
    if args.records < 1:
        raise SystemExit("--records must be positive")
    if args.child:
        print(f"{_child(args.child, args.bootstrap, args.topic, args.records):.4f}")
        return 0
    if WHY_NOT is not None:
        print(f"the compiled reader is not available here: {WHY_NOT}", file=sys.stderr)
        return 2
    with cluster(args.bootstrap, "read-path") as bootstrap:
        topic = _preload(bootstrap, args.records, args.value_bytes)
        medians = interleaved(
            PATHS,
            args.pairs,
            lambda path: in_child("bench.read_path", path, bootstrap, topic, args.records, args.value_bytes),
            f"CPU s per million {args.value_bytes}-byte records read",
        )
    print(
        f"median: consume() {medians['consume']:.2f}, direct {medians['direct']:.2f} CPU s/M "
        f"(direct / consume() = {medians['direct'] / medians['consume']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
