"""The chaos run's offered load: paced producers on the four topic roles, each record from ``records``.

``Load`` runs one thread per role. ``plain``, ``compacted`` and ``recreated`` use idempotent producers
(records reach the source once each, in order, through broker restarts); ``txn`` uses a transactional
producer that aborts every fifth transaction. A role can be paused (the re-created topic is quiet while
it is deleted) and its partition count raised (a partition added mid-run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer
from ferryman.kafka_log import LibrdkafkaLog

from tests.chaos.records import ROLES, RecordId, content

_log = logging.getLogger(__name__)

T = TypeVar("T")

_ABORT_EVERY = 5
_RECORDS_PER_TRANSACTION = 20
# A source broker restart holds deliveries back for seconds; the idempotent producer retries them
# for message.timeout.ms (300 s by default) in order. The final flush waits as long as a fault can last.
_FLUSH_S = 300.0
# Between retries of a transactional call that failed while the source was away.
_TXN_RETRY_S = 0.5
# How long a commit or an abort may keep failing before its producer is given up for a new one: after a
# source broker restart librdkafka can keep a request to the coordinator queued for ever ("TxnCoordinator:
# Timed out 0 in-flight, 0 retry-queued, 1 out-queue"; seen 2026-12-03, seed 20261211, the abort never
# sent). A new producer with the same transactional.id fences the old one and has the coordinator abort
# what it left open, as the deduper's watchdog does.
_TXN_CALL_BUDGET_S = 60.0


@dataclass
class RoleStream:
    """The producer state of one role."""

    role: str
    topic: str
    partitions: int
    next_index: dict[int, int] = field(default_factory=dict)
    paused: threading.Event = field(default_factory=threading.Event)
    idle: threading.Event = field(default_factory=threading.Event)
    """Set while paused and flushed: nothing of this role is in flight."""
    sent: int = 0
    aborted: int = 0


class Load:
    """Paced producers for every role until ``stop``."""

    def __init__(
        self, bootstrap: str, topics: dict[str, str], partitions: dict[str, int], rate_per_s: float, base_ms: int
    ) -> None:
        self.bootstrap = bootstrap
        self.base_ms = base_ms
        self.streams = {r: RoleStream(r, topics[r], partitions[r]) for r in ROLES}
        self._rate = rate_per_s / len(ROLES)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._guard, args=(r,), daemon=True, name=f"load-{r}") for r in ROLES]
        self.errors: list[BaseException] = []
        #: Producers given up while a call of theirs hung: kept, never destroyed (that could hang too).
        self._abandoned: list[Producer] = []

    def start(self) -> None:
        """Start every role's thread."""
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop producing, flush, and join (``errors`` says what failed)."""
        self._stop.set()
        for t in self._threads:
            t.join(_FLUSH_S + 30)

    @property
    def sent(self) -> int:
        """Records handed to the producers so far (aborted ones included)."""
        return sum(s.sent for s in self.streams.values())

    def pause(self, role: str, timeout_s: float = _FLUSH_S) -> None:
        """Stop one role and wait until nothing of it is in flight."""
        stream = self.streams[role]
        stream.idle.clear()
        stream.paused.set()
        if not stream.idle.wait(timeout_s):
            raise AssertionError(f"the {role} producer did not go idle within {timeout_s:g}s")

    def resume(self, role: str) -> None:
        """Resume one role (with a fresh producer: its topic may have a new id)."""
        self.streams[role].paused.clear()

    def add_partitions(self, role: str, partitions: int) -> None:
        """Produce to partitions 0..partitions-1 of the role's topic from now on."""
        self.streams[role].partitions = partitions

    def _client_config(self) -> dict[str, Any]:
        """What every load producer is given: the source, and librdkafka's lines through logging (a stall logs)."""
        return {"bootstrap.servers": self.bootstrap, "logger": LibrdkafkaLog(f"load {self.bootstrap}")}

    def _guard(self, role: str) -> None:
        try:
            if role == "txn":
                self._run_transactional(self.streams[role])
            else:
                self._run_idempotent(self.streams[role])
        except BaseException as exc:  # reported by stop()
            _log.exception("load %s failed", role)
            self.errors.append(exc)

    def _next(self, stream: RoleStream, partition: int) -> RecordId:
        index = stream.next_index.get(partition, 0)
        stream.next_index[partition] = index + 1
        return RecordId(stream.role, partition, index)

    def _pace(self, started: float, sent: int) -> None:
        ahead = sent / self._rate - (time.monotonic() - started)
        if ahead > 0:
            self._stop.wait(ahead)  # pacing the offered load, by design

    def _run_idempotent(self, stream: RoleStream) -> None:
        conf = {**self._client_config(), "enable.idempotence": True, "linger.ms": 5}
        producer = Producer(conf)
        started, sent = time.monotonic(), 0
        while not self._stop.is_set():
            if stream.paused.is_set():
                assert producer.flush(_FLUSH_S) == 0
                stream.idle.set()
                while stream.paused.is_set() and not self._stop.is_set():
                    self._stop.wait(0.1)  # waiting for resume()
                producer = Producer(conf)
                started, sent = time.monotonic(), 0
                continue
            for p in range(stream.partitions):
                self._produce(producer, stream, p)
                sent += 1
            self._pace(started, sent)
            producer.poll(0)
        assert producer.flush(_FLUSH_S) == 0, f"{stream.role}: records not delivered"

    def _produce(self, producer: Producer, stream: RoleStream, partition: int, *, aborted: bool = False) -> None:
        key, value, headers, ts = content(self._next(stream, partition), self.base_ms, aborted=aborted)
        while True:
            try:
                producer.produce(
                    stream.topic, value=value, key=key, headers=list(headers), partition=partition, timestamp=ts
                )
                break
            except BufferError:
                producer.poll(0.1)  # the queue drains once the broker is back
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                    raise
                # A partition just added: the producer learns it from fresh metadata.
                producer.list_topics(stream.topic, timeout=5)
                producer.poll(0.1)
        stream.sent += 1

    def _run_transactional(self, stream: RoleStream) -> None:
        conf: dict[str, Any] = {
            **self._client_config(),
            "transactional.id": f"chaos-load-{stream.topic}",
            "linger.ms": 5,
            "transaction.timeout.ms": 60_000,
        }
        producer = self._new_transactional(conf)
        started, sent, number = time.monotonic(), 0, 0
        while not self._stop.is_set():
            number += 1
            abort = number % _ABORT_EVERY == 0
            try:
                producer.begin_transaction()
                for i in range(_RECORDS_PER_TRANSACTION):
                    self._produce(producer, stream, i % stream.partitions, aborted=abort)
                    sent += 1
                if abort:
                    producer.abort_transaction(60)
                    stream.aborted += _RECORDS_PER_TRANSACTION
                else:
                    self._commit(producer)
            except KafkaException as exc:
                error = exc.args[0]
                _log.info("load txn: %s; aborting", error)
                if error.fatal() or not self._abort(producer):
                    # A fatal error leaves the producer unusable (every later call fails the same way), a hung
                    # abort leaves it stuck: a new one fences the old epoch and the coordinator aborts what it
                    # left open.
                    self._abandoned.append(producer)
                    producer = self._new_transactional(conf)
            self._pace(started, sent)

    def _new_transactional(self, conf: dict[str, Any]) -> Producer:
        """A transactional producer, initialised (retried while the source is away, within _FLUSH_S)."""

        def initialised() -> Producer:
            producer = Producer(conf)
            producer.init_transactions(30)
            return producer

        return _retried(initialised, again=lambda _err: True, what="init")

    def _commit(self, producer: Producer) -> None:
        _retried(
            lambda: producer.commit_transaction(30),
            again=KafkaError.retriable,
            what="commit",
            budget_s=_TXN_CALL_BUDGET_S,
        )

    def _abort(self, producer: Producer) -> bool:
        """Abort the open transaction; False when the producer hit a fatal error or its abort hung (replace it)."""
        try:
            _retried(
                lambda: producer.abort_transaction(30),
                again=lambda err: not err.fatal(),
                what="abort",
                budget_s=_TXN_CALL_BUDGET_S,
            )
        except KafkaException as exc:
            _log.info("load txn abort: %s; a new producer", exc)
            return False
        return True


def _retried(call: Callable[[], T], *, again: Callable[[KafkaError], bool], what: str, budget_s: float = _FLUSH_S) -> T:
    """call() until it succeeds; errors that again() accepts are retried for up to budget_s (the source may be away)."""
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not again(exc.args[0]) or time.monotonic() > deadline:
                raise
            _log.info("load txn %s: %s; again", what, exc)
            time.sleep(_TXN_RETRY_S)
