"""A bare at-least-once consume→produce copy loop: the practical ceiling of one Python process.

``python -m bench.copyloop --source S --destination D --prefix P --group G TOPIC...``
copies every TOPIC to ``P.TOPIC`` (same partition number, key, value, headers and
timestamp) until SIGTERM or SIGINT.

What it does per record is the least a faithful copier can do: one ``produce()``
with positional arguments for each message of a batched ``consume()``. It is
still honest at-least-once: offsets are committed only after everything consumed
before them was delivered (``flush()`` then an asynchronous commit, once per
commit interval), and a failed delivery stops the process (exit 2) instead of
being skipped, so a restart resumes from the last committed offset.

It imports nothing but the client library: a bare loop starts as cheaply as
one can, and its start-up counts in its CPU figure like the services' do. So
the consumer settings it shares with the services come on the command line
(``--consumer-property``, which the bench's row fills from
``ferryman.client_config``) instead of from an import of ``ferryman``, whose
package brings the config models, the envelope codec and protobuf. The services' cyclic-GC setting
comes the same way (``--gc-gen0-threshold``): every consumed record is a
GC-tracked ``Message``, and with CPython's defaults the loop spent ~5% of its
rate on collections.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

#: Records per consume() call: one Python/C crossing per batch.
_CONSUME_BATCH = 10_000
#: Longest wait of one consume() call. consume() returns early only on a full batch,
#: so at low rates this is added to latency; 20 ms matches the services' fetch wait.
_CONSUME_TIMEOUT_S = 0.02
#: Commit source offsets this often. Each commit first flushes the producer (a stall
#: of about one linger plus one round trip), so about 1% of the time at most.
_COMMIT_INTERVAL_S = 1.0
#: librdkafka queue full: serve delivery reports for this long, then retry the record.
_QUEUE_FULL_POLL_S = 0.005
#: Budget for the final flush and commit on shutdown.
_SHUTDOWN_BUDGET_S = 30.0


class _Stop:
    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        self.event.set()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.copyloop", description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="source bootstrap servers")
    ap.add_argument("--destination", required=True, help="destination bootstrap servers")
    ap.add_argument("--prefix", required=True, help="destination topic is PREFIX.TOPIC")
    ap.add_argument("--group", required=True, help="source consumer group")
    ap.add_argument("--compression", default="none", help="destination compression.type")
    ap.add_argument("--linger-ms", type=int, default=5, help="destination linger.ms")
    ap.add_argument(
        "--consumer-property",
        type=_property,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property of the source consumer (repeatable)",
    )
    ap.add_argument(
        "--gc-gen0-threshold",
        type=int,
        default=None,
        metavar="N",
        help="freeze the start-up heap and collect young objects every N allocations (default: CPython's GC as is)",
    )
    ap.add_argument("topics", nargs="+")
    return ap.parse_args(argv)


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _keep_gc_off_the_hot_path(gen0_threshold: int) -> None:
    """What the services do once started (``ferryman.service.tune_gc``), without importing ferryman.

    Objects alive now are frozen out of every later collection, and young
    collections run every ``gen0_threshold`` allocations instead of every 700
    (a few hundred consumed records). The loop creates no reference cycles.
    Like ``tune_gc``, no collection runs first: start-up leaves next to no
    cyclic garbage.
    """
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def main(argv: Sequence[str] | None = None) -> int:
    """Copy until SIGTERM/SIGINT; exit 2 if a record could not be delivered."""
    args = _parse(argv)
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failures: list[KafkaError] = []

    def on_failed_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    producer = Producer(
        {
            "bootstrap.servers": args.destination,
            "enable.idempotence": True,  # retries keep per-partition order
            "linger.ms": args.linger_ms,
            "batch.size": 1_000_000,
            "compression.type": args.compression,
            "queue.buffering.max.messages": 500_000,
            # Delivery reports only for failures: no per-record callback on the hot path.
            "delivery.report.only.error": True,
            "on_delivery": on_failed_delivery,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": args.source,
            "group.id": args.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            # The bench passes the services' streaming consumer settings (fetches answered at
            # 1 MiB or after 20 ms, no 1 s fetch pause on a full prefetch queue).
            **dict(args.consumer_property),
        }
    )

    def on_revoke(c: Consumer, _partitions: list[TopicPartition]) -> None:
        producer.flush(_SHUTDOWN_BUDGET_S)
        if not failures:
            _commit(c, asynchronous=False)

    if args.gc_gen0_threshold is not None:
        _keep_gc_off_the_hot_path(args.gc_gen0_threshold)
    consumer.subscribe(list(args.topics), on_revoke=on_revoke)
    destination: dict[str | None, str] = {t: f"{args.prefix}.{t}" for t in args.topics}
    # Untyped aliases: the hot loop passes librdkafka's Optional getters straight through.
    produce: Callable[..., None] = producer.produce
    poll, consume = producer.poll, consumer.consume
    next_commit = time.monotonic() + _COMMIT_INTERVAL_S
    while not stop.event.is_set() and not failures:
        for m in consume(_CONSUME_BATCH, _CONSUME_TIMEOUT_S):
            if m.error() is not None:
                continue  # consumer events (e.g. a transient broker error); librdkafka recovers
            try:
                # Positional: topic, value, key, partition, callback, on_delivery, timestamp, headers.
                produce(
                    destination[m.topic()], m.value(), m.key(), m.partition(), None, None, m.timestamp()[1], m.headers()
                )
            except BufferError:
                _produce_when_room(producer, destination[m.topic()], m)
        poll(0)
        if time.monotonic() >= next_commit:
            producer.flush(_SHUTDOWN_BUDGET_S)
            if not failures:
                _commit(consumer, asynchronous=True)
            next_commit = time.monotonic() + _COMMIT_INTERVAL_S
    left = producer.flush(_SHUTDOWN_BUDGET_S)
    if not failures and not left:
        _commit(consumer, asynchronous=False)
    consumer.close()
    if failures or left:
        why = str(failures[0]) if failures else f"{left} records undelivered"
        print(f"copyloop: delivery failed ({why}); offsets after it not committed", file=sys.stderr)
        return 2
    return 0


def _produce_when_room(producer: Producer, topic: str, m: Message) -> None:
    """The slow path: librdkafka's queue is full; serve delivery reports until the record fits."""
    while True:
        producer.poll(_QUEUE_FULL_POLL_S)
        try:
            producer.produce(
                topic, m.value(), m.key(), m.partition() or 0, timestamp=m.timestamp()[1], headers=m.headers()
            )
            return
        except BufferError:
            continue


def _commit(consumer: Consumer, *, asynchronous: bool) -> None:
    """Commit the consumed positions (all delivered by now); nothing consumed yet is fine."""
    try:
        if asynchronous:
            consumer.commit(asynchronous=True)
        else:
            consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise


if __name__ == "__main__":
    raise SystemExit(main())
