"""Micro-benchmark of the deduper's produce path: ``produce()`` per record against direct to librdkafka.

Each measurement is a fresh process that produces ``--records`` records (``--value-bytes``
values, 8-byte keys, explicit timestamps) to a topic of a local cluster through
``ferryman.rowproduce.produce_run``, in runs of 1000 rows on one partition each as the
deduper writes them, then flushes. Its figure is the process's CPU seconds, librdkafka's
threads included, per million records. The two paths alternate (``bench.pairs``).

    python -m bench.produce_path [--records 1000000] [--pairs 3] [--bootstrap host:port]

Without ``--bootstrap`` it starts a one-broker cluster of its own and stops it at the end.
"""

from __future__ import annotations

import os
import resource
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Producer
from ferryman import rowproduce

from bench.pairs import arguments, cluster, in_child, interleaved
from bench.topics import create_topics

PATHS = ("produce", "direct")
_CLIENT_ID = "ferryman-bench-produce-path"
_RUN = 1000
_PARTITIONS = 8
_FLUSH_BUDGET_S = 120.0


def _child(path: str, bootstrap: str, topic: str, records: int, value_bytes: int) -> float:
    """Produce the records through one path in this process; its CPU seconds per million records."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": _CLIENT_ID,
            "linger.ms": 5,
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    direct = path == "direct"
    if direct and not rowproduce.adopts(producer, _CLIENT_ID):
        raise SystemExit(f"the direct path is not available here: {rowproduce.WHY_NOT or 'producer not adopted'}")
    producer.list_topics(topic, timeout=30)
    now_ms = int(time.time() * 1000)
    columns: list[list[Any]] = [
        [os.urandom(value_bytes) for _ in range(_RUN)],
        [b"k%07d" % i for i in range(_RUN)],
        [now_ms + i for i in range(_RUN)],
    ]
    before = resource.getrusage(resource.RUSAGE_SELF)
    for run in range(records // _RUN):
        rowproduce.produce_run(producer, topic, run % _PARTITIONS, columns, start=0, n=_RUN, direct=direct)
        producer.poll(0)
    if producer.flush(_FLUSH_BUDGET_S):
        raise SystemExit("records left unsent after the flush budget")
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu_s / records * 1e6


def _measure(path: str, bootstrap: str, records: int, value_bytes: int) -> float:
    topic = f"produce-path-{path}-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], _PARTITIONS)
    return in_child("bench.produce_path", path, bootstrap, topic, records, value_bytes)


def main(argv: list[str] | None = None) -> int:
    args = arguments("bench.produce_path", __doc__, PATHS).parse_args(argv)
    if args.records < _RUN or args.records % _RUN:
        raise SystemExit(f"--records must be a positive multiple of {_RUN}")
    if args.child:
        print(f"{_child(args.child, args.bootstrap, args.topic, args.records, args.value_bytes):.4f}")
        return 0
    if rowproduce.WHY_NOT is not None:
        print(f"the direct path is not available here: {rowproduce.WHY_NOT}", file=sys.stderr)
        return 2
    with cluster(args.bootstrap, "produce-path") as bootstrap:
        medians = interleaved(
            PATHS,
            args.pairs,
            lambda path: _measure(path, bootstrap, args.records, args.value_bytes),
            f"CPU s per million {args.value_bytes}-byte records",
        )
    print(
        f"median: produce() {medians['produce']:.2f}, direct {medians['direct']:.2f} CPU s/M "
        f"(direct / produce() = {medians['direct'] / medians['produce']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
