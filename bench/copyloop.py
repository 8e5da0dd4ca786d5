"""A bare at-least-once consume→produce copy loop: the practical ceiling of one Python process.

``python -m bench.copyloop SRC DST TOPIC DEST_TOPIC GROUP`` copies TOPIC to
DEST_TOPIC on the same partition numbers until SIGTERM. Batched consume, no
per-message callbacks, asynchronous offset commits once a second.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType

from confluent_kafka import Consumer, Producer

_stop_requested = threading.Event()


def _stop(_signum: int, _frame: FrameType | None) -> None:
    _stop_requested.set()


def main() -> int:
    src, dst, topic, dest_topic, group = sys.argv[1:6]
    signal.signal(signal.SIGTERM, _stop)
    consumer = Consumer(
        {
            "bootstrap.servers": src,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = Producer(
        {"bootstrap.servers": dst, "linger.ms": 10, "compression.type": "lz4", "enable.idempotence": True}
    )
    consumer.subscribe([topic])
    produce = producer.produce
    next_commit = time.monotonic() + 1.0
    while not _stop_requested.is_set():
        msgs = consumer.consume(num_messages=2000, timeout=0.1)
        for m in msgs:
            if m.error() is not None:
                continue
            while True:
                try:
                    produce(
                        dest_topic,
                        m.value(),
                        m.key(),
                        partition=m.partition() or 0,
                        timestamp=m.timestamp()[1],
                        headers=m.headers(),
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
        if time.monotonic() >= next_commit:
            consumer.commit(asynchronous=True)
            next_commit = time.monotonic() + 1.0
    producer.flush(30)
    consumer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
