"""The deduper service: staging envelopes to destination records, exactly once.

One loop thread owns every Kafka client. Each Kafka transaction carries, for
the staging partitions it consumed from:

1. the accepted source records, written to the destination topic on the same
   partition number, byte for byte;
2. the new watermark of every source partition it advanced (state topic);
3. the source to destination offset mapping of those records (offset-map topic);
4. the staging consumer offsets (``send_offsets_to_transaction`` with the
   consumer group metadata, KIP-447).

So a crash at any point keeps all four or none. On partition assignment the
committed staging offsets are fetched first (they are stable: pending
transactional commits finish first) and the state partition is read after
them, under read_committed, before any envelope of the partition is processed.

Error handling follows librdkafka's classes (ferryman.kafka_errors): abortable
errors abort and rewind to the last commit; fatal errors and indefinite commit
outcomes rebuild the producer (init_transactions resolves the open
transaction) and rewind; a fence by another live instance with our
transactional.id stops this process.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from ferryman import envelope, rowproduce, topics
from ferryman.client_config import base_config, connected_producer, streaming_consumer_config
from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.errors import EnvelopeError, FencedError, FerrymanError, KafkaOperationError
from ferryman.kafka_errors import ErrorClass, classify, kafka_error_of, retry_retriable
from ferryman.naming import FlowNames, NamingPolicy
from ferryman.rpc import serving
from ferryman.state import COMPACTED_TOPIC_CONFIGS, PartitionKey, offset_mapping, read_compacted
from ferryman.topics import InternalTopic
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2

from ferryman_deduper._control import ControlHub, ControlServicer, DeduperStatusServicer
from ferryman_deduper._decide import PartitionState, Verdict, decide
from ferryman_deduper._destinations import DestinationTopics
from ferryman_deduper._gaps import Filled, GapTracker
from ferryman_deduper._timings import RecentDurations

_log = logging.getLogger(__name__)

_ADMIN_TIMEOUT_S = 30.0
#: Consecutive failed commits after which wrappers are told to pause.
_UNAVAILABLE_AFTER_FAILURES = 2
#: Upper bound of the commit-cost-driven transaction length (see _commit_cost_budget).
_MAX_ADAPTIVE_TXN_S = 1.0
_SERVICE_NAMES = ("ferryman.v1.ControlService", "ferryman.v1.DeduperService")
#: How often destination topics are re-synced with the source specs, so that
#: partition growth shows up even before the first record of a new partition.
_SPEC_SYNC_INTERVAL_S = 10.0


@dataclass
class _Slice:
    """Records of one envelope written in the open transaction (for the offset map)."""

    key: PartitionKey
    source: envelope_pb2.SourcePartition
    destination_topic: str
    source_offsets: Sequence[int]
    first_destination_offset: int = -1
    last_destination_offset: int = -1


@dataclass
class DeduperStats:
    """Counters since start (also logged at shutdown)."""

    envelopes: int = 0
    records_written: int = 0
    duplicates_dropped: int = 0
    gaps_detected: int = 0
    bad_envelopes: int = 0
    stale_topic_envelopes: int = 0
    topics_recreated: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    producer_rebuilds: int = 0
    gaps_healed: int = 0
    rewinds: int = 0


class Deduper:
    """Runs one flow's deduper until shutdown() is called.

    Lifecycle: ``run()`` blocks; ``shutdown()`` (thread- and signal-safe,
    idempotent) makes it stop consuming, commit the open transaction (abort it
    if the commit fails) and close its clients, in that order.
    """

    def __init__(
        self,
        config: FerrymanConfig,
        flow: FlowConfig,
        *,
        instance_id: str | None = None,
        listen_address: str | None = None,
    ) -> None:
        self._flow = flow
        self._rpc = config.rpc
        self._listen_address = listen_address or config.deduper.listen_address
        self._dc = config.deduper
        self.instance_id = instance_id or self._dc.instance_id
        self._names = FlowNames.of(flow, wrapper_group=config.wrapper.group_id, deduper_group=self._dc.group_id)
        self._target = config.clusters[flow.target]
        self._eos = flow.exactly_once
        self._staging_max_message_bytes = config.wrapper.staging_max_message_bytes
        self._transactional_id = self._names.transactional_id(self.instance_id)
        self._stop = threading.Event()
        self.stats = DeduperStats()
        # Source-partition state as of the last commit, and changes in the open transaction.
        self._committed: dict[PartitionKey, PartitionState] = {}
        self._pending: dict[PartitionKey, PartitionState] = {}
        self._cluster_ids: dict[PartitionKey, str] = {}
        self._dest_topics: dict[PartitionKey, str] = {}
        self._last_dest_offset: dict[PartitionKey, int] = {}
        self._slices: list[_Slice] = []
        self._next_offsets: dict[int, int] = {}
        self._owned: set[int] = set()
        self._restoring: set[int] = set()
        self._gaps = GapTracker()
        self._hub: ControlHub | None = None
        self._next_watermarks = 0.0
        self._last_commit_s = 0.0
        # Recent commits' wall time and their destination flush, for the status RPC.
        self._commit_times = RecentDurations()
        self._flush_times = RecentDurations()
        self._commit_failures = 0
        self._txn_open = False
        self._txn_started = 0.0
        self._txn_records = 0
        self._delivery_error: KafkaError | None = None
        #: Whether rows go to librdkafka directly (rowproduce.adopts) for the current producer (_make_producer).
        self._direct = False
        self._producer_fatal: KafkaError | None = None
        self._consumer_fatal: KafkaError | None = None
        self._fatal: BaseException | None = None
        #: A transactional failure met inside a rebalance callback, recovered by the loop.
        self._deferred_failure: tuple[BaseException, str] | None = None

    # ------------------------------------------------------------------ setup
    def _client_id(self, suffix: str) -> str:
        return f"ferryman-deduper-{self.instance_id}-{suffix}"

    def _client_conf(self, suffix: str) -> dict[str, Any]:
        return base_config(self._target, self._client_id(suffix))

    def _make_producer(self) -> Producer:
        conf = self._client_conf("producer")
        conf.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": self._dc.linger_ms,
                "compression.type": self._dc.compression_type,
                "message.max.bytes": self._dc.max_message_bytes,
                # A transaction may hold up to transaction_max_records records
                # before it is committed; all of them wait in the local queue
                # while the broker is behind.
                "queue.buffering.max.messages": max(100_000, 2 * self._dc.transaction_max_records),
                # CONCURRENT_TRANSACTIONS right after a commit clears within
                # tens of ms; the 100 ms default backoff would cap us at a few
                # transactions per second (KAFKA-5477).
                "retry.backoff.ms": 20,
                "error_cb": self._on_producer_error,
            }
        )
        if self._eos:
            conf["transactional.id"] = self._transactional_id
            conf["transaction.timeout.ms"] = self._dc.transaction_timeout_ms
        else:
            # No transaction fails for a record librdkafka gave up on (message.timeout.ms, a record the
            # destination refuses): a delivery report per record catches it before the staging offsets
            # past it are committed. So the direct path, which has no per-record report, is for
            # exactly-once flows only.
            conf["on_delivery"] = self._on_delivery
        producer = connected_producer(conf, self._names.staging_topic)
        # The client.id a cluster's client_config may have set is the one librdkafka names the handle after.
        self._direct = self._eos and self._dc.direct_produce and rowproduce.adopts(producer, str(conf["client.id"]))
        return producer

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        """At-least-once flows: keep the first failed delivery; the commit then fails and rewinds."""
        if err is not None and self._delivery_error is None:
            self._delivery_error = err

    def _produce_path(self) -> str:
        """The produce path of the current producer, for the start-up log."""
        if not self._dc.direct_produce:
            return "produce() per record (direct_produce: false)"
        if not self._eos:
            return "produce() per record (at-least-once: a delivery report per record)"
        return rowproduce.describe(self._direct)

    def _on_producer_error(self, err: KafkaError) -> None:
        # A fatal error makes later calls fail with a generic _FATAL code; keep
        # the real cause (a fence, typically) so recovery acts on its class.
        if err.fatal():
            self._producer_fatal = err
        _log.log(logging.ERROR if err.fatal() else logging.WARNING, "destination producer: %s", err)

    def _on_consumer_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._consumer_fatal = err
        _log.log(logging.ERROR if err.fatal() else logging.WARNING, "staging consumer: %s", err)

    def _check_consumer(self) -> None:
        err = self._consumer_fatal
        if err is None:
            return
        if err.code() in (KafkaError._FENCED, KafkaError.FENCED_INSTANCE_ID):
            raise FencedError(
                f"another deduper joined the staging group with instance id {self.instance_id!r} ({err.str()}); "
                "two live processes must not share an instance id"
            )
        raise KafkaOperationError("staging consumer", KafkaException(err))

    def _make_consumer(self) -> Consumer:
        conf = streaming_consumer_config(self._target, self._client_id("staging"))
        conf.update(
            {
                "group.id": self._names.deduper_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # Positions are set explicitly on assignment. If a committed
                # position has left the log (staging retention or a deletion
                # ran ahead of us) we restart at the log start: the envelope
                # chain then shows exactly which source records are missing,
                # and they are reported as a gap and held, never skipped.
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "group.instance.id": self.instance_id,
                "session.timeout.ms": self._dc.session_timeout_ms,
                "error_cb": self._on_consumer_error,
            }
        )
        return Consumer(conf)

    def _init_transactions(self) -> None:
        if not self._eos:
            return
        try:
            retry_retriable(
                lambda: self._producer.init_transactions(self._dc.operation_timeout_s),
                what="init_transactions",
                budget_s=self._dc.operation_timeout_s * 4,
            )
        except KafkaException as exc:
            if classify(exc) is ErrorClass.FENCED:
                raise FencedError(f"{self._transactional_id}: {exc}") from exc
            raise

    def _ensure_topics(self, admin: AdminClient) -> None:
        n = self._flow.staging_partitions
        staging_configs = {"cleanup.policy": "delete", "max.message.bytes": str(self._staging_max_message_bytes)}
        wanted = [
            InternalTopic(self._names.staging_topic, n, staging_configs, "staging"),
            InternalTopic(self._names.state_topic, n, COMPACTED_TOPIC_CONFIGS, "state"),
            InternalTopic(self._names.specs_topic, 1, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
        ]
        if self._flow.emit_offset_mappings:
            wanted.append(InternalTopic(self._names.offset_map_topic, n, COMPACTED_TOPIC_CONFIGS, "offset-map"))
        topics.ensure_internal_topics(admin, wanted, _ADMIN_TIMEOUT_S)

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Ask run() to drain and return. Safe from signal handlers and threads."""
        self._stop.set()

    def run(self) -> None:
        """Deduplicate until shutdown(); raises FerrymanError on unrecoverable errors.

        The gRPC server starts first (health NOT_SERVING until the Kafka side
        is up). Drain order on shutdown: health NOT_SERVING, stop consuming,
        commit (or abort) the open transaction, close the Kafka clients, stop
        the gRPC server.
        """
        self._hub = ControlHub(self.instance_id, self._flow.name)
        with serving(
            "deduper",
            listen_address=self._listen_address,
            rpc=self._rpc,
            register=[
                lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(ControlServicer(self._hub), s),  # type: ignore[arg-type]
                lambda s: control_pb2_grpc.add_DeduperServiceServicer_to_server(DeduperStatusServicer(self.status), s),
            ],
            service_names=_SERVICE_NAMES,
        ) as self._server:
            self._run_kafka()

    @property
    def port(self) -> int:
        """Bound gRPC port (after run() started the server)."""
        return self._server.port

    def _run_kafka(self) -> None:
        assert self._hub is not None
        admin = AdminClient(self._client_conf("admin"))
        self._ensure_topics(admin)
        self._destinations = DestinationTopics(
            admin=admin,
            consumer_config=self._client_conf("specs"),
            specs_topic=self._names.specs_topic,
            naming=NamingPolicy(self._flow.source, self._flow.naming),
            replicate_configs=self._flow.replicate_topic_configs,
            timeout_s=_ADMIN_TIMEOUT_S,
        )
        self._producer = self._make_producer()
        self._destinations.producer = self._producer
        self._init_transactions()
        self._consumer = self._make_consumer()
        _log.info(
            "deduper %s starting: flow %s, staging %s, %s, envelope codec %s, produce path %s",
            self.instance_id,
            self._flow.name,
            self._names.staging_topic,
            f"transactional.id {self._transactional_id}" if self._eos else "at-least-once (exactly_once: false)",
            envelope.CODEC,
            self._produce_path(),
        )
        self._consumer.subscribe(
            [self._names.staging_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        for name in _SERVICE_NAMES:
            self._server.set_serving(name, True)
        try:
            self._loop()
            self._server.begin_drain()
            self._recover_deferred()  # a failure met in a rebalance callback just before the stop
            self._commit("shutdown")
        finally:
            self._server.begin_drain()
            self._close()

    def _loop(self) -> None:
        timeout = self._dc.poll_timeout_ms / 1000
        interval = self._dc.transaction_interval_ms / 1000
        next_sync = time.monotonic() + _SPEC_SYNC_INTERVAL_S
        while not self._stop.is_set():
            msgs = self._consumer.consume(num_messages=self._dc.consume_batch_size, timeout=timeout)
            if self._fatal is not None:
                raise self._fatal
            self._check_consumer()
            if self._recover_deferred():
                continue  # the batch is read again after the rewind
            self._finish_restores()
            now = time.monotonic()
            # Catching up (a full batch came back): stretch the transaction so
            # commits stay a small share of the time. Caught up: commit on the
            # interval, for latency. Both budgets are checked after every
            # envelope, so a large batch never makes one oversized transaction.
            backlogged = len(msgs) >= self._dc.consume_batch_size
            min_age = max(interval, self._commit_cost_budget()) if backlogged else interval
            rewinds = self.stats.rewinds
            try:
                for msg in msgs:
                    self._process(msg)
                    if self._transaction_due(min_age):
                        self._budget_commit()
                        if self.stats.rewinds != rewinds:
                            break  # the commit failed and rewound: the rest of the batch is read again
                self._producer.poll(0)
            except KafkaException as exc:
                # produce()/begin_transaction()/poll() refused: the producer is in
                # an error state; the rest of the batch is re-read after the rewind.
                self._recover(exc, "writing the transaction")
            if self._transaction_due(min_age):
                self._budget_commit()
            if now >= next_sync:
                self._destinations.sync_all()
                next_sync = now + _SPEC_SYNC_INTERVAL_S
            self._control_tick(now)

    def _recover_deferred(self) -> bool:
        """Recover a commit failure met inside a rebalance callback, if any (loop thread only).

        Returns:
            Whether there was one: the positions were rewound (abort or rebuild first).
        """
        if self._deferred_failure is None:
            return False
        exc, what = self._deferred_failure
        self._deferred_failure = None
        self._recover(exc, what)
        return True

    def _transaction_due(self, min_age_s: float) -> bool:
        """The open transaction is old enough, or big enough, to commit."""
        return self._txn_open and (
            self._txn_records >= self._dc.transaction_max_records or time.monotonic() - self._txn_started >= min_age_s
        )

    def _budget_commit(self) -> None:
        """Commit on the time/size budget, timing it for the adaptive budget."""
        self._last_commit_s = self._commit("budget")

    def _commit_cost_budget(self) -> float:
        """Shortest transaction worth its commit: commits take at most ~25% of the time.

        Only used while catching up (the last consume returned a full batch);
        otherwise transaction_interval_ms rules (low latency). When catching up,
        flushing a big transaction takes tens of ms;
        stretching transactions to 3x the last commit's duration bounds the fixed
        per-transaction cost without adding much latency, capped well inside
        transaction.timeout.ms. (9x measured better throughput but doubled p50
        latency at 20k records/s; see docs/notes.md.)
        """
        cap = min(_MAX_ADAPTIVE_TXN_S, self._dc.transaction_timeout_ms / 1000 / 4)
        return min(cap, 3 * self._last_commit_s)

    # ---------------------------------------------------------- control link
    def _control_tick(self, now: float) -> None:
        """Serve the control link from the loop thread (the only thread touching Kafka)."""
        hub = self._hub
        assert hub is not None
        while True:
            try:
                spec = hub.specs.get_nowait()
            except queue.Empty:
                break
            self._destinations.add_spec(spec)
        while True:
            try:
                answer = hub.resent.get_nowait()
            except queue.Empty:
                break
            if answer.error:
                _log.error("resend request %d could not be served: %s", answer.request_id, answer.error)
            for env_msg in answer.envelopes:
                self._process_resent(env_msg)
        for _key, gap in self._gaps.due(now, self._dc.resend_retry_s):
            request_id = hub.request_resend(gap.source, gap.missing_from, gap.missing_to, gap.attempts)
            if request_id is not None:
                gap.mark_requested(now)
                _log.warning(
                    "asked for source records %s-%d %d..%d again (request %d)",
                    gap.source.topic,
                    gap.source.partition,
                    gap.missing_from,
                    gap.missing_to,
                    request_id,
                )
        if now >= self._next_watermarks:
            self._next_watermarks = now + self._dc.watermark_interval_s
            hub.broadcast(control_pb2.ConnectResponse(watermarks=control_pb2.Watermarks(partitions=self._watermarks())))
            self._update_backpressure(hub)

    def _watermarks(self) -> list[control_pb2.PartitionWatermark]:
        assert self._hub is not None
        out = []
        for key, st in sorted(self._committed.items()):
            log_end = self._hub.log_end_offset(key)
            lag = max(0, log_end - (st.watermark + 1)) if log_end is not None else -1
            out.append(
                control_pb2.PartitionWatermark(
                    topic=key.topic, partition=key.partition, watermark=st.watermark, lag=lag
                )
            )
        return out

    def _staging_lag(self) -> int:
        tps = [TopicPartition(self._names.staging_topic, sp) for sp in sorted(self._owned)]
        if not tps:
            return 0
        lag = 0
        for tp in self._consumer.position(tps):
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                lag += max(0, high - tp.offset)
        return lag

    def _update_backpressure(self, hub: ControlHub) -> None:
        if self._commit_failures >= _UNAVAILABLE_AFTER_FAILURES:
            hub.set_backpressure(True, f"destination cluster unavailable ({self._commit_failures} failed commits)")
            return
        lag = self._staging_lag()
        limit = self._dc.backpressure_max_staging_lag
        if lag > limit:
            hub.set_backpressure(True, f"staging is {lag} envelopes ahead of the deduper (limit {limit})")
        elif lag <= limit // 2:
            hub.set_backpressure(False, "caught up")

    def status(self) -> control_pb2.GetDeduperStatusResponse:
        """Snapshot for DeduperService.GetDeduperStatus (called from gRPC threads)."""
        st = self.stats
        return control_pb2.GetDeduperStatusResponse(
            deduper_id=self.instance_id,
            flow=self._flow.name,
            records_written=st.records_written,
            duplicates_dropped=st.duplicates_dropped,
            gaps_detected=st.gaps_detected,
            gaps_healed=st.gaps_healed,
            commit_p50_ms=self._commit_times.median_ms(),
            commit_max_ms=self._commit_times.max_ms(),
            commit_flush_p50_ms=self._flush_times.median_ms(),
            commit_seconds_total=self._commit_times.total_s(),
            commit_flush_seconds_total=self._flush_times.total_s(),
            transactions_committed=st.transactions_committed,
            transactions_aborted=st.transactions_aborted,
            partitions=self._watermarks() if self._hub is not None else [],
            connected_wrappers=self._hub.connected_wrappers() if self._hub is not None else [],
        )

    def _close(self) -> None:
        self._destinations.close()
        try:
            self._consumer.close()
        except KafkaException as exc:
            _log.warning("closing the staging consumer: %s", exc)
        if self._txn_open:
            self._abort_quietly()
        try:
            self._producer.flush(self._dc.operation_timeout_s)
        except KafkaException as exc:
            _log.warning("flushing the destination producer at shutdown: %s", exc)
        _log.info("deduper %s stopped: %s", self.instance_id, self.stats)

    # -------------------------------------------------------------- data path
    def _begin(self) -> None:
        if self._txn_open:
            return
        if self._eos:
            self._producer.begin_transaction()
        self._txn_open = True
        self._txn_started = time.monotonic()
        self._txn_records = 0

    def _process(self, msg: Message) -> None:
        err = msg.error()
        sp = msg.partition()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            if err.code() in (KafkaError._FENCED, KafkaError.FENCED_INSTANCE_ID):
                raise FencedError(
                    f"another deduper joined the staging group with instance id {self.instance_id!r} ({err.str()}); "
                    "two live processes must not share an instance id"
                )
            if err.fatal():
                raise KafkaOperationError("staging consumer", KafkaException(err))
            _log.warning("staging consumer: %s", err)
            return
        if sp is None or sp not in self._owned:
            return
        self._begin()
        offset = msg.offset()
        assert offset is not None
        self._next_offsets[sp] = offset + 1
        self.stats.envelopes += 1
        try:
            env = envelope.decode(msg.value())
        except EnvelopeError as exc:
            self.stats.bad_envelopes += 1
            _log.error(
                "staging record %s-%d@%d is not a valid envelope and is skipped (no watermark moves, so a "
                "resent copy is still accepted): %s",
                self._names.staging_topic,
                sp,
                offset,
                exc,
            )
            return
        src = env.source
        key = PartitionKey(src.topic, src.partition)
        expected_sp = envelope.staging_partition(src.topic, src.partition, self._flow.staging_partitions)
        if expected_sp != sp:
            raise FerrymanError(
                f"envelope of {key} found on staging partition {sp}, expected {expected_sp}: a wrapper with a "
                f"different staging_partitions setting wrote to {self._names.staging_topic}"
            )
        self._apply(key, env, resent=False)

    def _process_resent(self, env_msg: envelope_pb2.Envelope) -> None:
        """An envelope that came over the control link in answer to a resend request."""
        try:
            env = envelope.verify(env_msg)
        except EnvelopeError as exc:
            self.stats.bad_envelopes += 1
            _log.error("resent envelope rejected: %s", exc)
            return
        key = PartitionKey(env.source.topic, env.source.partition)
        sp = envelope.staging_partition(key.topic, key.partition, self._flow.staging_partitions)
        if sp not in self._owned:
            return  # another deduper owns it now; it will ask again
        self._begin()
        self._apply(key, env, resent=True)

    def _apply(self, key: PartitionKey, env: envelope.DecodedEnvelope, *, resent: bool) -> None:
        """Decide on one envelope and act on the verdict (inside the open transaction)."""
        src = env.source
        state = self._pending.get(key) or self._committed.get(key)
        d = decide(
            state, src.topic_id, env.previous_offset, env.run.offsets, on_topic_recreated=self._flow.on_topic_recreated
        )
        if d.recreated:
            self.stats.topics_recreated += 1
            _log.error(
                "source topic %s was re-created (new topic id) - partition %d: %s",
                src.topic,
                src.partition,
                "watermark reset to -1, replicating the new topic into the same destination"
                if d.verdict is not Verdict.HALTED
                else "halting this partition (on_topic_recreated: halt)",
            )
        if d.new_state is not None:
            self._pending[key] = d.new_state
            self._cluster_ids[key] = src.cluster_id
        verdict = d.verdict
        if verdict is Verdict.ACCEPT:
            self._write(key, src, env.run, d.start)
            assert d.new_state is not None  # an ACCEPT always moves the watermark
            self._fill_gap(key, d.new_state.watermark, resent=resent)
        elif verdict is Verdict.DUPLICATE:
            self.stats.duplicates_dropped += len(env.run)
        elif verdict is Verdict.GAP:
            self.stats.gaps_detected += 1
            self._note_gap(key, src, d.missing_from, max(d.missing_to, env.last_offset))
        elif verdict is Verdict.STALE_TOPIC:
            self.stats.stale_topic_envelopes += 1

    def _fill_gap(self, key: PartitionKey, watermark: int, *, resent: bool) -> None:
        """Account for an accepted envelope that moved key's watermark to watermark."""
        filled, gap = self._gaps.accepted(key, watermark)
        if gap is None:
            return
        via = "over the control link (resend)" if resent else "through staging"
        if filled is Filled.CLOSED:
            if resent:
                self.stats.gaps_healed += 1
            _log.warning("gap in %s closed: records %d..%d arrived %s", key, gap.first_missing, gap.missing_to, via)
        elif filled is Filled.REST_DUE:
            _log.warning(
                "gap in %s partly filled: records %d..%d arrived %s; asking for %d..%d now",
                key,
                gap.first_missing,
                watermark,
                via,
                watermark + 1,
                gap.missing_to,
            )

    def _note_gap(self, key: PartitionKey, src: envelope_pb2.SourcePartition, missing_from: int, upto: int) -> None:
        if self._gaps.note(key, src, missing_from, upto):
            _log.error(
                "GAP in source partition %s: have up to offset %d, the next envelope follows offset %d; records "
                "%d..%d have not arrived. Holding the partition until they do (not skipping)%s.",
                key,
                missing_from - 1,
                upto,
                missing_from,
                upto,
                "; asking the wrapper to resend them" if self._hub is not None else "",
            )

    def _write(self, key: PartitionKey, src: envelope_pb2.SourcePartition, run: envelope.RecordRun, start: int) -> None:
        """Produce run[start:] to the destination, on the source's partition number, byte for byte."""
        dest = self._destinations.resolve(src)
        self._dest_topics[key] = dest
        partition = src.partition
        count = len(run) - start
        headers = run.header_column()
        columns: list[Sequence[Any]] = [run.values, run.keys, run.timestamps_ms]
        if headers is not None:
            columns.append(headers)
        if not self._flow.emit_offset_mappings:
            rowproduce.produce_run(self._producer, dest, partition, columns, start=start, n=count, direct=self._direct)
        else:
            # Only the first and last record of a run carry a delivery callback:
            # the offset map needs just those two destination offsets.
            slc = _Slice(key, src, dest, run.offsets[start:] if start else run.offsets)
            self._slices.append(slc)
            first_cb = self._slice_callback(slc, first=True, last=count == 1)
            rowproduce.produce_row(self._producer, dest, partition, tuple(c[start] for c in columns), first_cb)
            if count > 1:
                rowproduce.produce_run(
                    self._producer, dest, partition, columns, start=start + 1, n=count - 2, direct=self._direct
                )
                last_row = tuple(c[start + count - 1] for c in columns)
                last_cb = self._slice_callback(slc, first=False, last=True)
                rowproduce.produce_row(self._producer, dest, partition, last_row, last_cb)
        self._txn_records += count
        self.stats.records_written += count

    def _slice_callback(self, slc: _Slice, *, first: bool, last: bool) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self._delivery_error = err
                return
            off = msg.offset()
            if off is None:
                return
            if first:
                slc.first_destination_offset = off
            if last:
                slc.last_destination_offset = off

        return on_delivery

    # ----------------------------------------------------------- transactions
    def _commit(self, reason: str, *, in_callback: bool = False) -> float:
        """Commit the open transaction: records, watermarks, offset map, staging offsets.

        A failure is recovered at once, or, inside a rebalance callback
        (in_callback), recorded for the loop to recover before it processes
        anything else: recovery restores state with blocking calls
        (committed offsets, the state topic), which time out in a callback.

        Returns:
            Its wall time in seconds, a recovery included (0 with no transaction open).
        """
        if not self._txn_open:
            return 0.0
        budget = self._dc.operation_timeout_s
        started = time.monotonic()
        try:
            if self._slices or not self._eos:
                # The offset map needs destination offsets, known once delivered. And without a
                # transaction, the watermarks written next must not move past a record that is not
                # delivered: they are visible (and restored from) as soon as they are written.
                self._flush_delivered(budget)
                self._flush_times.add(time.monotonic() - started)
            elif self._delivery_error is not None:
                raise KafkaException(self._delivery_error)
            # Mappings first: they learn the destination offset each state record names.
            self._produce_mappings()
            self._produce_state()
            offsets = [TopicPartition(self._names.staging_topic, sp, nxt) for sp, nxt in self._next_offsets.items()]
            if self._eos:
                group = self._consumer.consumer_group_metadata()
                if offsets:
                    retry_retriable(
                        lambda: self._producer.send_offsets_to_transaction(offsets, group, budget),
                        what="send_offsets_to_transaction",
                        budget_s=budget,
                    )
                retry_retriable(
                    lambda: self._producer.commit_transaction(budget), what="commit_transaction", budget_s=budget
                )
            else:
                self._flush_delivered(budget)  # the watermarks and the offset map
                if offsets:
                    retry_retriable(
                        lambda: self._consumer.commit(offsets=offsets, asynchronous=False),
                        what="committing staging offsets",
                        budget_s=budget,
                    )
        except (KafkaException, KafkaOperationError) as exc:
            self._commit_failures += 1
            if in_callback:
                self._deferred_failure = (exc, f"commit ({reason})")
            else:
                self._recover(exc, f"commit ({reason})")
            return time.monotonic() - started
        self._commit_failures = 0
        for key, st in self._pending.items():
            self._committed[key] = st
        self._clear_transaction()
        self.stats.transactions_committed += 1
        took = time.monotonic() - started
        self._commit_times.add(took)
        return took

    def _flush_delivered(self, budget_s: float) -> None:
        """Flush the producer; raise the first failed delivery, or a timeout with records left."""
        remaining = self._producer.flush(budget_s)
        if self._delivery_error is not None:
            raise KafkaException(self._delivery_error)
        if remaining:
            raise KafkaOperationError("flushing destination records", TimeoutError(f"{remaining} left"))

    def _produce_state(self) -> None:
        now_ms = int(time.time() * 1000)
        n = self._flow.staging_partitions
        for key, st in self._pending.items():
            value = state_pb2.WatermarkState(
                watermark=st.watermark,
                topic_id=st.topic_id,
                retired_topic_ids=sorted(st.retired_topic_ids),
                # Learnt from the offset map's delivery reports: without the map, never, so -1 (unknown).
                destination_offset=self._last_dest_offset.get(key, -1),
                destination_topic=self._dest_topics.get(key, ""),
                updated_at_ms=now_ms,
                deduper_id=self.instance_id,
            )
            self._producer.produce(
                self._names.state_topic,
                key=key.encode(self._cluster_ids.get(key, "")),
                value=value.SerializeToString(),
                partition=envelope.staging_partition(key.topic, key.partition, n),
            )

    def _produce_mappings(self) -> None:
        n = self._flow.staging_partitions
        for slc in self._slices:
            count = len(slc.source_offsets)
            if slc.last_destination_offset >= 0:
                # Slices of a key come in order: the last one ends at the key's new watermark.
                self._last_dest_offset[slc.key] = slc.last_destination_offset
            if (
                slc.first_destination_offset < 0
                or slc.last_destination_offset - slc.first_destination_offset != count - 1
            ):
                _log.warning(
                    "destination offsets of %s are not consecutive (%d..%d for %d records; another producer "
                    "writes %s?): offset mapping for them not emitted",
                    slc.key,
                    slc.first_destination_offset,
                    slc.last_destination_offset,
                    count,
                    slc.destination_topic,
                )
                continue
            mapping = offset_mapping(
                slc.source, slc.destination_topic, slc.first_destination_offset, slc.source_offsets
            )
            self._producer.produce(
                self._names.offset_map_topic,
                key=f"{slc.key.topic}/{slc.key.partition}/{slc.source_offsets[0]}".encode(),
                value=mapping.SerializeToString(),
                partition=envelope.staging_partition(slc.key.topic, slc.key.partition, n),
            )

    def _clear_transaction(self) -> None:
        self._pending.clear()
        self._slices.clear()
        self._next_offsets.clear()
        self._txn_open = False
        self._txn_records = 0
        self._delivery_error = None

    def _recover(self, exc: BaseException, what: str) -> None:
        """Handle a failed transactional step by class, then rewind to the last commit."""
        self._check_consumer()
        # Serve pending error events: a fatal error reaches error_cb only
        # through poll(), and until then calls fail with a generic _FATAL.
        self._producer.poll(0)
        cause = self._producer_fatal
        if cause is not None:
            exc = KafkaException(cause)  # the real reason behind a generic _FATAL
        cls = classify(exc) if isinstance(exc, KafkaException) else ErrorClass.FATAL
        if cls is ErrorClass.RETRIABLE:
            cls = ErrorClass.FATAL  # retries exhausted: the outcome is unknown
        if cls is ErrorClass.FATAL and self._eos:
            real = self._fatal_cause()
            if real is not None:
                exc, cls = KafkaException(real), classify(real)
        if cls is ErrorClass.FENCED:
            age_ms = (time.monotonic() - self._txn_started) * 1000
            if not self._txn_open or age_ms < self._dc.transaction_timeout_ms:
                raise FencedError(
                    f"{what}: transactional.id {self._transactional_id} was taken over by another deduper "
                    f"instance ({exc}); two live processes must not share instance_id {self.instance_id!r}"
                ) from exc
            cls = ErrorClass.FATAL  # our own transaction outlived transaction.timeout.ms
        _log.warning("%s failed (%s, %s): rewinding to the last commit", what, cls.value, exc)
        self.stats.transactions_aborted += 1
        if cls is ErrorClass.ABORTABLE and self._eos:
            try:
                retry_retriable(
                    lambda: self._producer.abort_transaction(self._dc.operation_timeout_s),
                    what="abort_transaction",
                    budget_s=self._dc.operation_timeout_s,
                )
            except (KafkaException, KafkaOperationError) as abort_exc:
                if isinstance(abort_exc, KafkaException) and classify(abort_exc) is ErrorClass.FENCED:
                    raise FencedError(f"abort: {abort_exc}") from abort_exc
                cls = ErrorClass.FATAL
        if cls is not ErrorClass.ABORTABLE or not self._eos:
            self._rebuild_producer()
        self._rewind()

    def _fatal_cause(self) -> KafkaError | None:
        """The producer's own fatal error, if it is in a fatal state.

        Failed produce/flush calls report generic codes (_FATAL, _PURGE_QUEUE)
        and error_cb may not have run yet; a transactional call on a producer in
        a fatal state returns the fatal error itself. We only ask when we are
        about to replace the producer anyway, so the abort it may do is moot.
        """
        try:
            self._producer.abort_transaction(1.0)
        except KafkaException as exc:
            err = kafka_error_of(exc)
            if err is not None and err.fatal():
                return err
        return None

    def _abort_quietly(self) -> None:
        if not self._eos:
            self._clear_transaction()
            return
        try:
            self._producer.abort_transaction(self._dc.operation_timeout_s)
        except KafkaException as exc:
            _log.warning("abort at shutdown failed (%s); the coordinator aborts it on timeout", exc)
        self._clear_transaction()

    def _rebuild_producer(self) -> None:
        """Replace the producer; init_transactions resolves whatever the old one left open."""
        self.stats.producer_rebuilds += 1
        _log.warning("rebuilding the destination producer (%s)", self._transactional_id)
        old = self._producer
        old.purge()
        self._producer_fatal = None
        self._producer = self._make_producer()
        self._destinations.producer = self._producer
        self._init_transactions()

    def _rewind(self, partitions: set[int] | None = None) -> None:
        """Drop the open transaction's work and resume owned partitions from their last commit."""
        self.stats.rewinds += 1
        self._clear_transaction()
        self._gaps.clear()
        parts = set(self._owned) if partitions is None else partitions
        if not parts:
            return
        positions = self._restore(sorted(parts))
        for sp, offset in positions.items():
            try:
                self._consumer.seek(TopicPartition(self._names.staging_topic, sp, offset))
            except KafkaException as exc:
                self._consumer.poll(0)  # serve error events: a fence shows up there
                self._check_consumer()
                raise KafkaOperationError(f"seeking staging partition {sp} to {offset}", exc) from exc

    def _restore(self, partitions: list[int]) -> dict[int, int]:
        """Committed staging positions, then the state written with them.

        Order matters: committed() under read_committed waits for pending
        transactional offset commits, so every transaction that committed these
        offsets is complete before the state partitions are read.
        """
        tps = [TopicPartition(self._names.staging_topic, sp) for sp in partitions]
        committed = retry_retriable(
            lambda: self._consumer.committed(tps, timeout=_ADMIN_TIMEOUT_S),
            what="reading committed staging offsets",
            budget_s=_ADMIN_TIMEOUT_S * 4,
        )
        records = read_compacted(
            self._client_conf("restore"), self._names.state_topic, partitions, _ADMIN_TIMEOUT_S * 4
        )
        n = self._flow.staging_partitions
        for key in [k for k in self._committed if envelope.staging_partition(k.topic, k.partition, n) in partitions]:
            del self._committed[key]
        restored = 0
        for recs in records.values():
            for raw_key, raw_value in recs.items():
                if raw_value is None:
                    continue
                cluster_id, key = PartitionKey.decode(raw_key)
                st = state_pb2.WatermarkState()
                st.ParseFromString(raw_value)
                self._committed[key] = PartitionState(
                    watermark=st.watermark, topic_id=st.topic_id, retired_topic_ids=set(st.retired_topic_ids)
                )
                self._cluster_ids[key] = cluster_id
                if st.destination_topic:
                    self._dest_topics[key] = st.destination_topic
                self._last_dest_offset[key] = st.destination_offset
                restored += 1
        _log.info("restored %d source-partition watermarks for staging partitions %s", restored, partitions)
        return {tp.partition: (tp.offset if tp.offset >= 0 else OFFSET_BEGINNING) for tp in committed}

    # ------------------------------------------------------------ rebalances
    def _guard(self, what: str, fn: Any, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            fn(consumer, partitions)
        except BaseException as exc:  # callbacks must not raise: surface it from the loop
            _log.exception("%s failed", what)
            self._fatal = exc
            self._stop.set()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guard("partition assignment", self._assign, consumer, partitions)

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take new staging partitions paused; their state is restored from the loop.

        Blocking calls (committed offsets, reading the state topic) must not run
        inside a rebalance callback: librdkafka may need the very thread that
        runs the callback to complete them, and committed() then times out.
        """
        if not partitions:
            return
        parts = sorted(tp.partition for tp in partitions)
        tps = [TopicPartition(self._names.staging_topic, sp) for sp in parts]
        consumer.incremental_assign(tps)
        consumer.pause(tps)
        self._restoring.update(parts)
        _log.info("assigned staging partitions %s; restoring their state before processing", parts)

    def _finish_restores(self) -> None:
        """Restore state of newly assigned partitions, then let them flow (loop thread)."""
        if not self._restoring:
            return
        parts = sorted(self._restoring)
        self._restore(parts)
        # No seek to the restored positions: the consumer starts a newly assigned
        # partition at its committed offset, which it reads as _restore did (stable
        # offsets, since it is read_committed), or at the log start when there is
        # none (auto.offset.reset). A seek while that start is still being resolved
        # restarts the resolution behind librdkafka's backoff: measured here, the
        # first message came 0.08-0.58 s after resume with a seek to the beginning,
        # 0.08-1.08 s with a seek to an absolute offset, and 0.17 s without a seek.
        # Whatever position it starts from, the watermark drops what is already
        # written and the envelope chain reports anything skipped as a gap.
        tps = [TopicPartition(self._names.staging_topic, sp) for sp in parts]
        self._consumer.resume(tps)
        self._restoring.clear()
        self._owned.update(parts)
        _log.info("staging partitions %s ready (now own %s)", parts, sorted(self._owned))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guard("partition revocation", self._revoke, consumer, partitions)

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition], *, lost: bool = False) -> None:
        parts = {tp.partition for tp in partitions}
        self._restoring -= parts
        if self._txn_open:
            if lost:
                # Our generation is gone: the offsets commit would be refused.
                # Recovered from the loop (see _commit), never inside this callback.
                self._deferred_failure = (
                    KafkaException(KafkaError(KafkaError._STATE, "partitions lost")),
                    "lost partitions",
                )
            else:
                self._commit("revoke", in_callback=True)
        self._owned -= parts
        n = self._flow.staging_partitions
        for key in [k for k in self._committed if envelope.staging_partition(k.topic, k.partition, n) in parts]:
            del self._committed[key]
        _log.info(
            "%s staging partitions %s (now own %s)", "lost" if lost else "revoked", sorted(parts), sorted(self._owned)
        )

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guard("partition loss", lambda c, p: self._revoke(c, p, lost=True), consumer, partitions)
