"""Paced record streams for end-to-end tests: known sequences in, compared at the destination."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer


class SequenceProducer(threading.Thread):
    """Produces f"{topic}:{partition}:{i}" to every partition at a steady rate until done."""

    def __init__(
        self, bootstrap: str, topics: list[str], partitions: int, per_partition: int, rate_per_s: float
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topics = topics
        self.partitions = partitions
        self.per_partition = per_partition
        self.rate_per_s = rate_per_s
        self.sent = 0
        """Records handed to the producer so far (the stream's position)."""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 10})
            started = time.monotonic()
            for i in range(self.per_partition):
                for t in self.topics:
                    for part in range(self.partitions):
                        p.produce(t, value=f"{t}:{part}:{i}".encode(), key=f"k{i % 97}".encode(), partition=part)
                        self.sent += 1
                # Pace the stream so the kills land mid-stream.
                ahead = self.sent / self.rate_per_s - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
                p.poll(0)
            # A source broker restart mid-stream holds deliveries back for seconds: the idempotent
            # producer retries them (message.timeout.ms, 300 s by default) and keeps their order.
            assert p.flush(120) == 0
        except BaseException as exc:
            self.error = exc
