"""The deduper service: staging envelopes to destination records, exactly once.

One loop thread owns every Kafka client. Each Kafka transaction carries, for
the staging partitions it consumed from:

1. the accepted source records, written to the destination topic on the same
   partition number, byte for byte;
2. the new watermark of every source partition it advanced (state topic);
3. the source to destination offset mapping of those records (offset-map topic);
4. the staging consumer offsets (``send_offsets_to_transaction`` with the
   consumer group metadata, KIP-447).

So a crash at any point keeps all four or none. The rooms: ``_transaction``
(the open transaction, its producer, commit, abort, recovery, watchdog),
``_partitions`` (the staging consumer, rebalances, restore and rewind),
``_flow_topics`` (the internal topics, and those deleted under the flow), this
module (set-up, the loop, the data path) and ``_control`` (the control link).

**Riding through faults.** Anything transient (``ferryman.kafka_errors.
is_transient``: a broker restart, a coordinator moving, an outage of any
length, a call abandoned by the watchdog) makes the loop recover the
transaction (abort, or rebuild the producer) and rewind to the last commit; a
recovery that fails because the cluster is still away is retried with capped
backoff, while health is NOT_SERVING with the reason. Only fencing by a live
twin, configuration errors and refused data loss end the process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman import envelope, preflight, rowproduce
from ferryman.advertisement import advertised_address
from ferryman.audit_verdicts import VerdictFollower
from ferryman.client_config import base_config, connected_producer
from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.errors import FencedError, FerrymanError, WedgedCallError
from ferryman.flows import UNCHANGED, FlowRegistry, LiveFlow, seed_and_check
from ferryman.health import ClusterHealth, StuckRecovery, wait_until_reachable
from ferryman.kafka_errors import is_transient, wait_out_transient
from ferryman.metrics import LATENCY_COUNT, deduper_metrics
from ferryman.naming import FlowNames, NamingPolicy
from ferryman.renewing_admin import RenewingAdmin
from ferryman.rpc import serving
from ferryman.state import PartitionKey, read_compacted
from ferryman.status import package_version
from ferryman.tracing import start_tracing
from ferryman.v1 import control_pb2, control_pb2_grpc, flows_pb2_grpc, state_pb2

from ferryman_deduper._advertise import Advertiser
from ferryman_deduper._clients import producer_config, staging_consumer_config
from ferryman_deduper._control import ControlHub, ControlServicer, ControlTicker, DeduperStatusServicer
from ferryman_deduper._datapath import DataPath, DeduperStats
from ferryman_deduper._destinations import DestinationTopics
from ferryman_deduper._flow_topics import ADMIN_TIMEOUT_S, FlowTopics
from ferryman_deduper._flows import SERVICE_NAME as FLOW_SERVICE_NAME
from ferryman_deduper._flows import FlowServicer
from ferryman_deduper._gaps import GapTracker
from ferryman_deduper._group_sync import GroupSync
from ferryman_deduper._holds import RETRY_MAX_S
from ferryman_deduper._partitions import StagingPartitions, staging_offsets_metadata
from ferryman_deduper._quarantine import Quarantine
from ferryman_deduper._traces import DeduperTraces
from ferryman_deduper._transaction import Transaction
from ferryman_deduper._translate import OffsetTranslator
from ferryman_deduper._translate_group import GroupTranslator

_log = logging.getLogger(__name__)

#: Upper bound of the commit-cost-driven transaction length (see _commit_cost_budget).
_MAX_ADAPTIVE_TXN_S = 1.0
_SERVICE_NAMES = ("ferryman.v1.ControlService", "ferryman.v1.DeduperService")
#: How often destination topics are re-synced with the source specs, so that
#: partition growth shows up even before the first record of a new partition.
_SPEC_SYNC_INTERVAL_S = 10.0
#: Backoff between recovery attempts while the destination is away: the first
#: retry is quick (a leader election takes well under a second), then capped so
#: that work resumes within a few seconds of the cluster coming back.
_RECOVERY_BACKOFF_S = (0.2, 5.0)


def _generation_lost(why: str) -> KafkaException:
    """Our staging partitions went with our group generation: the open transaction must be aborted.

    Abortable, never a producer rebuild (which would fence a twin); a stale generation, so not a failure of
    the destination's (`Transaction.commits_failing`).
    """
    return KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, why, txn_requires_abort=True))


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
        self._stop = threading.Event()
        self.stats = DeduperStats()
        self.health = ClusterHealth(flow.target, self._target, on_change=self._health_changed)
        self._txn = Transaction(
            make_producer=self._make_producer,
            dc=self._dc,
            exactly_once=self._eos,
            transactional_id=self._names.transactional_id(self.instance_id),
            health=self.health,
        )
        self._gaps = GapTracker()
        self._parts = StagingPartitions(
            make_consumer=self._make_consumer,
            staging_topic=self._names.staging_topic,
            state_topic=self._names.state_topic,
            staging_partitions=flow.staging_partitions,
            instance_id=self.instance_id,
            restore_config=lambda: self._client_conf("restore"),
            check_state=self._check_state_topic,
            commit_for_revoke=self._commit_for_revoke,
            health=self.health,
            gaps=self._gaps,
            staging_id=lambda: self._topics.staging_id,
        )
        self._written_destinations: set[str] = set()
        self._quarantine = Quarantine(
            staging_topic=self._names.staging_topic,
            dlq_topic=self._names.dlq_topic,
            max_message_bytes=self._dc.max_message_bytes,
        )
        self._hub: ControlHub | None = None
        self._control: ControlTicker | None = None
        self._verdicts: VerdictFollower | None = None
        self._group_sync: GroupSync | None = None
        self._last_commit_s = 0.0
        #: A failed step waiting to be recovered (the loop retries it with backoff).
        self._recovery: tuple[BaseException, str] | None = None
        self._backoff_s = _RECOVERY_BACKOFF_S[0]
        #: A recovery failing while the destination answers: the staging consumer is replaced.
        self._stuck = StuckRecovery()
        self._health_dirty = False
        #: Record and gRPC tracing; None when tracing is off.
        self._tracing = start_tracing(config.tracing, "ferryman-deduper")
        #: The flows admin API of the destination cluster (FlowService), and this flow as stored there.
        self._registry = FlowRegistry(config.clusters, flow.target, client_id=self._client_id("flows"))
        #: Start-up has stored the own flow in the flow store (until then FlowService calls it not stored yet).
        self._flow_stored = False
        self._live: LiveFlow | None = None
        #: The flow is deleted (or re-created as this process cannot run it): idle, NOT_SERVING.
        self._flow_idle = False
        #: The flow's internal topics: made at start-up, then watched (deleted under the flow, made again).
        self._topics = FlowTopics(
            self._names,
            flow,
            staging_max_message_bytes=config.wrapper.staging_max_message_bytes,
            startup_timeout_s=self._dc.startup_timeout_s,
        )

    # ------------------------------------------------------------------ setup
    def _client_id(self, suffix: str) -> str:
        return f"ferryman-deduper-{self.instance_id}-{suffix}"

    def _client_conf(self, suffix: str) -> dict[str, Any]:
        return base_config(self._target, self._client_id(suffix))

    def _make_producer(self) -> tuple[Producer, bool]:
        conf = producer_config(
            self._target,
            self._client_id("producer"),
            self._dc,
            transactional_id=self._txn.transactional_id if self._eos else None,
            error_cb=self._txn.on_producer_error,
            on_delivery=self._on_delivery,
            on_produce_failed=self._txn.refused_at,
        )
        producer = connected_producer(conf, self._names.staging_topic)
        # The client.id a cluster's client_config may have set is the one librdkafka names the handle after.
        direct = self._eos and self._dc.direct_produce and rowproduce.adopts(producer, str(conf["client.id"]))
        self._destinations.producer = producer  # it waits for new destination partitions in this one's metadata
        return producer, direct

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        """At-least-once flows: keep the first failed delivery; the commit then fails and rewinds."""
        if err is not None and self._txn.delivery_error is None:
            self._txn.delivery_error = err
            self._txn.refused_at(str(msg.topic()), int(msg.partition() or 0), err.str())

    def _produce_path(self) -> str:
        """The produce path of the current producer, for the start-up log."""
        if not self._dc.direct_produce:
            return "produce() per record (direct_produce: false)"
        if not self._eos:
            return "produce() per record (at-least-once: a delivery report per record)"
        return rowproduce.describe(self._txn.direct)

    def _make_consumer(self) -> Consumer:
        return Consumer(
            staging_consumer_config(
                self._target,
                self._client_id("staging"),
                self._dc,
                group_id=self._names.deduper_group,
                instance_id=self.instance_id,
                on_session_timeout=self._parts.fences.consumer_built(),
                error_cb=self._parts.on_consumer_error,
            )
        )

    def _flow_wrote(self, destinations: Collection[str]) -> set[str]:
        """Which of destinations the flow's committed state (every partition, any deduper's) names.

        Asked for destination topics that exist at first sight: the state topic is read once, and again
        when some of them are not named yet (another deduper may have written them since), so the flow's
        topics are told apart from someone else's with at most one read per batch of topics. The read
        waits for the transactions open on the state topic to end (``settle``): one whose records the
        caller has just seen in a destination may not have written its marker here yet.
        """
        wanted = set(destinations)
        if not wanted <= self._written_destinations:
            parts = list(range(self._flow.staging_partitions))
            records = read_compacted(
                self._client_conf("restore"), self._names.state_topic, parts, ADMIN_TIMEOUT_S, settle=True
            )
            for recs in records.values():
                for value in recs.values():
                    if value:
                        self._written_destinations.add(state_pb2.WatermarkState.FromString(value).destination_topic)
        return wanted & self._written_destinations

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Ask run() to drain and return.

        Any thread, never a signal handler (an Event's lock): SIGTERM comes through `ferryman.signals`.
        """
        self._stop.set()

    def run(self) -> None:
        """Deduplicate until shutdown(); raises FerrymanError on unrecoverable errors.

        The gRPC server starts first (health NOT_SERVING until the Kafka side
        is up). Drain order on shutdown: health NOT_SERVING, stop consuming,
        commit (or abort) the open transaction, close the Kafka clients, stop
        the gRPC server, flush traces.
        """
        try:
            self._serve()
        finally:
            if self._tracing is not None:
                self._tracing.shutdown()

    def _serve(self) -> None:
        self._hub = ControlHub(self.instance_id, self._flow.name)
        with serving(
            "deduper",
            listen_address=self._listen_address,
            rpc=self._rpc,
            register=[
                lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(ControlServicer(self._hub), s),  # type: ignore[arg-type]
                lambda s: control_pb2_grpc.add_DeduperServiceServicer_to_server(
                    DeduperStatusServicer(self.status, self._translator(), self._group_translator()), s
                ),
                lambda s: flows_pb2_grpc.add_FlowServiceServicer_to_server(
                    FlowServicer(self._registry, storing=lambda: None if self._flow_stored else self._flow.name), s
                ),
            ],
            service_names=(*_SERVICE_NAMES, FLOW_SERVICE_NAME),
            tracer_provider=self._tracing.provider if self._tracing is not None else None,
        ) as self._server:
            # Prometheus endpoint (metrics_address): serves status() from now until the drain is done.
            exporter = deduper_metrics(self._dc.metrics_address, self.status, self._txn.latency.snapshot)
            with exporter:
                self._run_kafka()

    def _translator(self) -> OffsetTranslator:
        def committed(key: PartitionKey) -> int | None:
            state = dict(self._parts.committed).get(key)
            return state.watermark if state is not None else None

        return OffsetTranslator(
            consumer_config=lambda: self._client_conf("translate"),
            names=self._names,
            staging_partitions=self._flow.staging_partitions,
            emits_offset_map=self._flow.emit_offset_mappings,
            committed_watermark=committed,
        )

    def _group_translator(self) -> GroupTranslator:
        return GroupTranslator(
            consumer_config=lambda: self._client_conf("translate"),
            names=self._names,
            staging_partitions=self._flow.staging_partitions,
            emits_offset_map=self._flow.emit_offset_mappings,
        )

    @property
    def port(self) -> int:
        """Bound gRPC port (after run() started the server)."""
        return self._server.port

    def _run_kafka(self) -> None:
        assert self._hub is not None
        admin_conf = self._client_conf("admin")
        renewing = RenewingAdmin(lambda: AdminClient(admin_conf), what="the destination admin client")
        admin = renewing.client  # start-up's steps; the loop's users take renewing.client at each use
        wait_until_reachable(admin, self._flow.target, self._target, self._dc.startup_timeout_s)
        # A broker restart or a slow destination right after it first answered is waited out, not an exit.
        step = partial(wait_out_transient, budget_s=self._dc.startup_timeout_s, setting="deduper.startup_timeout_s")
        if self._eos:
            step(
                lambda: preflight.check_transaction_timeout(
                    admin, self._dc.transaction_timeout_ms, "deduper.transaction_timeout_ms", ADMIN_TIMEOUT_S
                ),
                what="reading the brokers' transaction.max.timeout.ms",
            )
        step(
            lambda: self._topics.ensure(admin),
            what="making the internal topics",
        )
        step(lambda: self._topics.read_ids(renewing), what="describing the staging and state topics")
        # The store wins over the file (ferryman.flows._live); the deduper seeds it with the file's flow.
        flow = self._flow
        self._flow = step(
            lambda: seed_and_check(self._registry, flow),
            what="seeding the flow store",
        )
        self._flow_stored = True
        self._live = LiveFlow(self._target, self._flow, client_id=self._client_id("flows"))
        self._destinations = DestinationTopics(
            admin=renewing,
            consumer_config=self._client_conf("specs"),
            specs_topic=self._names.specs_topic,
            naming=NamingPolicy(self._flow.source, self._flow.naming),
            replicate_configs=self._flow.replicate_topic_configs,
            timeout_s=ADMIN_TIMEOUT_S,
            flow_wrote=self._flow_wrote,
        )
        self._destinations.apply_flow(self._flow)
        step(self._txn.start, what="initialising transactions")
        self._data = DataPath(
            flow=self._flow,
            names=self._names,
            instance_id=self.instance_id,
            txn=self._txn,
            parts=self._parts,
            gaps=self._gaps,
            destinations=self._destinations,
            stats=self.stats,
            recovering=lambda: self._recovery is not None,
            dead_letters=self._quarantine,
            traces=None
            if self._tracing is None
            else DeduperTraces(
                self._tracing, staging_topic=self._names.staging_topic, consumer_group=self._names.deduper_group
            ),
        )
        self._control = ControlTicker(
            hub=self._hub,
            dc=self._dc,
            committed=self._parts.committed,
            gaps=self._gaps,
            staging_lag=self._staging_lag,
            destination_trouble=self._destination_trouble,
            process_resent=self._data.process_resent,
            add_specs=self._destinations.add_specs,
            partition_counters=self.stats.by_partition,
        )
        self._parts.start()
        _log.info(
            "deduper %s starting: flow %s, staging %s, %s, envelope codec %s, produce path %s, latency count %s",
            self.instance_id,
            self._flow.name,
            self._names.staging_topic,
            f"transactional.id {self._txn.transactional_id}" if self._eos else "at-least-once (exactly_once: false)",
            envelope.CODEC,
            self._produce_path(),
            LATENCY_COUNT,
        )
        self._set_serving(True)
        # The last audit verdicts, for status() and the metrics: a thread of its own, off the loop.
        self._verdicts = VerdictFollower(self._client_conf("audit-verdicts"), self._names.audit_topic)
        self._verdicts.start()
        # Group checkpoints from the wrappers, committed at the destination: a thread of its own, off the loop.
        self._group_sync = GroupSync(
            translator=self._group_translator,
            consumer_config=lambda: self._client_conf("group-sync"),
            owned=lambda: set(self._parts.owned),
            staging_partitions=self._flow.staging_partitions,
        )
        self._group_sync.start()
        self._hub.on_group_checkpoints = self._take_checkpoints
        self._server.set_serving(FLOW_SERVICE_NAME, True)
        self._live.start()
        advertiser = Advertiser(
            names=self._names,
            instance_id=self.instance_id,
            address=advertised_address(self._dc.advertised_address, self._listen_address, self.port),
            interval_s=self._dc.advertise_interval_s,
            producer_config=self._client_conf("advertise"),
        )
        try:
            advertiser.start()
            self._loop()
            self._server.begin_drain()
            if self._recovery is None:
                self._commit("shutdown")
        finally:
            advertiser.stop()  # first: wrappers stop dialling a deduper on its way out
            if self._verdicts is not None:
                self._verdicts.stop()
            self._hub.on_group_checkpoints = None
            if self._group_sync is not None:
                self._group_sync.stop()
            self._live.stop()
            self._server.begin_drain()
            self._hub.end_streams()
            self._close()

    def _take_checkpoints(self, checkpoints: control_pb2.GroupCheckpoints) -> None:
        """A wrapper's group checkpoints (a control stream's thread): synced while the flow asks for it."""
        if self._flow.sync_group_offsets and self._group_sync is not None:
            self._group_sync.submit(checkpoints)

    def _set_serving(self, serving: bool) -> None:
        for name in _SERVICE_NAMES:
            self._server.set_serving(name, serving)

    def _health_changed(self) -> None:
        self._health_dirty = True  # applied on the loop thread (_apply_health)

    def _apply_health(self) -> None:
        if self._health_dirty:
            self._health_dirty = False
            self._set_serving(self.health.reachable and self._recovery is None and not self._flow_idle)

    def _follow_flow(self) -> None:
        """Apply what changed in the stored flow (loop thread): renames and created-topic settings, deletion."""
        assert self._live is not None
        change = self._live.take()
        if change is UNCHANGED:
            return
        if not isinstance(change, FlowConfig):
            _log.warning("flow %s is gone from the flow store: idle and NOT_SERVING until it is back", self._flow.name)
            self._flow_idle = True
        else:
            self._flow, self._flow_idle = change, False
            self._destinations.apply_flow(change)
        self._health_dirty = True

    # ------------------------------------------------------------------- loop
    def _loop(self) -> None:
        next_sync = time.monotonic() + _SPEC_SYNC_INTERVAL_S
        while not self._stop.is_set():
            self._txn.note_alive()
            if self._recovery is not None and not self._try_recover():
                continue
            try:
                self._probe_holds()
                self._step()
                now = time.monotonic()
                if now >= next_sync:
                    self._destinations.sync_all()
                    self._topics.watch_periodically()
                    next_sync = now + _SPEC_SYNC_INTERVAL_S
                self._follow_topics()
            except FencedError:
                raise
            except (KafkaException, FerrymanError) as exc:
                if not is_transient(exc) and not self._txn.fence_may_be_ours(exc):
                    raise
                self._fail(exc, "writing the transaction")
            self.health.tick()
            self.health.probe(lambda t: self._txn.producer.list_topics(self._names.staging_topic, timeout=t))
            self._follow_flow()
            self._apply_health()
            self._control_tick()

    def _control_tick(self) -> None:
        assert self._control is not None
        try:
            self._control.tick(time.monotonic())
        except KafkaException as exc:  # the staging lag is read from the consumer: the cluster is away
            _log.debug("control tick: %s", exc)

    def _step(self) -> None:
        """One consume() batch through the open transaction, committing on its budget."""
        timeout = self._dc.poll_timeout_ms / 1000
        msgs = self._parts.consumer.consume(num_messages=self._dc.consume_batch_size, timeout=timeout)
        self._parts.note_errors(msgs)  # first: the batch may be dropped below
        self._check_callbacks()
        if self._recovery is not None:
            return  # a revoke's commit failed: the batch is read again after the rewind
        self._parts.finish_restores()
        # Catching up (a full batch came back): stretch the transaction so
        # commits stay a small share of the time. Caught up: commit on the
        # interval, for latency. Both budgets are checked after every
        # envelope, so a large batch never makes one oversized transaction.
        interval = self._dc.transaction_interval_ms / 1000
        backlogged = len(msgs) >= self._dc.consume_batch_size
        min_age = max(interval, self._commit_cost_budget()) if backlogged else interval
        if msgs:
            self.health.up()
        for msg in msgs:
            self._data.process(msg)
            if self._txn.due(min_age):
                self._budget_commit()
                if self._recovery is not None:
                    return  # the commit failed: the rest of the batch is read again after the rewind
        self._txn.producer.poll(0)
        if self._txn.due(min_age):
            self._budget_commit()

    def _check_callbacks(self) -> None:
        """Surface what a client callback recorded: a fatal consumer error, a failed rebalance callback."""
        failure = self._parts.callback_failure
        if failure is not None:
            self._parts.callback_failure = None
            raise failure
        if self._parts.consumer_failed:
            # The open transaction's offsets belong to the old consumer's generation: abort it first.
            if self._txn.open:
                self._txn.recover(_generation_lost("the staging consumer was fenced"), "staging consumer fenced")
            self._replace_failed_consumer()
        elif self._parts.rejoin_due and self._commit("rejoin"):
            # The open transaction is committed first, so that the revoke which follows finds nothing to commit.
            self._parts.rejoin()

    def _replace_failed_consumer(self) -> None:
        """A new staging consumer for one that hit a fatal error; the open transaction is aborted already."""
        self._parts.check_consumer()

    def _fail(self, exc: BaseException, what: str) -> None:
        """A step failed with a transient fault: recover from the loop, with backoff if need be."""
        self._recovery = (exc, what)
        self._health_dirty = True
        self._try_recover()

    def _try_recover(self) -> bool:
        """Recover the pending failure; on a transient failure of the recovery itself, back off.

        Returns:
            Whether the deduper is recovered (the loop may process again).
        """
        assert self._recovery is not None
        exc, what = self._recovery
        if self._topics.state_lost and self._txn.settled:
            return self._stalled()
        reached = dict(self._txn.next_offsets)  # the failed transaction's (recover forgets them)
        try:
            self._txn.recover(exc, what)
            if self._topics.state_lost:
                return self._stalled()
            self._hold_refused(reached)
            if self._txn.refused_record:
                # Not named to a partition yet: the whole flow waits. The rewind writes the refused record
                # again and fails again at once (at produce() when it is over deduper.max_message_bytes):
                # retry at the slowest backoff, not in a tight loop.
                self._stop.wait(_RECOVERY_BACKOFF_S[1])
                self._serve_consumer()  # what it reads now is read again after the rewind
            if self._parts.consumer_failed:
                # Fenced while backing off (_serve_consumer noted it): every seek of the rewind
                # would fail on the dead consumer, a transient error for ever. Replace it first;
                # its partitions go with it, and the new consumer restores what it is assigned.
                self._replace_failed_consumer()
            self._rewind()
            self._topics.watch_after_failed_transaction(self._destinations.ready_names())
        except FencedError:
            raise
        except (KafkaException, FerrymanError) as again:
            if not is_transient(again):
                raise
            self.health.down(f"{what}: recovery failed: {again}")
            self._topics.watch_state()
            try:
                self._follow_topics()
            except FencedError:
                raise
            except (KafkaException, FerrymanError) as follow_exc:
                _log.debug("following the flow's topics while recovering: %s", follow_exc)
            self._recovery = (again if isinstance(again, WedgedCallError) else exc, what)
            self._stop.wait(self._backoff_s)
            self._backoff_s = min(_RECOVERY_BACKOFF_S[1], self._backoff_s * 2)
            self._serve_consumer()
            self._unstick(what)
            self.health.tick()
            return False
        self._recovery = None
        self._stuck.recovered()
        self._backoff_s = _RECOVERY_BACKOFF_S[0]
        self._health_dirty = True
        self._apply_health()
        return True

    def _hold_refused(self, reached: dict[int, int]) -> None:
        """Hold the staging partitions of a refused record that a failure named (``_holds``); the rewind pauses them.

        reached: the failed transaction's next staging offset per partition (a commit past it took the record).
        """
        refusal = self._txn.refusal()
        if refusal is None:
            return
        refused, reason = refusal
        sps = self._parts.writing_to(refused.topic, refused.partition)
        if not sps:
            return  # not a partition a source partition writes (an internal topic): the whole flow waits
        now = time.monotonic()
        for sp in sorted(sps):
            hold, new = self._parts.holds.hold(sp, refused, reason, reached.get(sp, -1), now)
            if new:
                _log.warning(
                    "holding staging partition %d at the record %s-%d refuses (source partitions %s wait, nothing "
                    "is skipped); the other staging partitions go on. Trying it again in %.0f s, then up to %.0f s "
                    "apart; changing what refuses it lets it go on by itself",
                    sp,
                    refused.topic,
                    refused.partition,
                    ", ".join(f"{s.topic}-{s.partition}" for s in self._parts.held_sources(sp)) or "unknown",
                    hold.backoff_s,
                    RETRY_MAX_S,
                )
            else:
                _log.info("staging partition %d is still refused: trying it again in %.0f s", sp, hold.backoff_s)
        self._txn.refusal_held()
        self._health_dirty = True

    def _probe_holds(self) -> None:
        """Read held staging partitions whose retry is due again from their last commit (``_holds``)."""
        for sp in self._parts.holds.due(time.monotonic()):
            _log.info("trying held staging partition %d again from its last commit", sp)
            self._parts.probe(sp)

    def _stalled(self) -> bool:
        """The state topic is lost: never rewound or restored from again; the flow stalls until an operator acts."""
        self._stop.wait(_RECOVERY_BACKOFF_S[1])
        self._serve_consumer()
        self.health.tick()
        return False

    def _follow_topics(self) -> None:
        """Act on what the topic watch found: the flow's topics deleted (or made again) under it."""
        followed = self._topics.follow()
        if followed is None:
            return
        if self._topics.state_lost:
            self._health_dirty = True
            if self._recovery is None:  # abort the open transaction; the recovery then stalls (`_stalled`)
                self._fail(_generation_lost("the state topic is gone"), "state topic lost")
            return
        if followed.staging_remade:
            self._read_new_staging()
        gone = self._destinations.forget_vanished(followed.found)
        if gone:
            _log.warning(
                "destination topics %s are gone or re-created; each is made again by its next record", ", ".join(gone)
            )
        self._topics.make_again_if_deleted(followed.found)

    def _check_state_topic(self) -> None:
        """After each restore's read: from the state topic this deduper started on, not one made again since."""
        if not self._topics.state_is_original():
            self._health_dirty = True
            raise _generation_lost("the state topic is gone")  # the recovery then stalls (`_stalled`)

    def _read_new_staging(self) -> None:
        """The staging topic was made again under the flow: drop the open work, read the new one from its start."""
        if self._txn.open:
            self._txn.recover(_generation_lost("the staging topic was made again"), "staging topic made again")
            if self._data.traces is not None:
                self._data.traces.aborted("the staging topic was made again")
        self._parts.read_anew()

    def _unstick(self, what: str) -> None:
        """A recovery failing for STUCK_RECOVERY_S while the destination answers: replace the staging consumer."""
        failing_s = self._stuck.failed(lambda t: self._txn.producer.list_topics(self._names.staging_topic, timeout=t))
        if failing_s:
            _log.warning(
                "%s: the recovery has failed for %.0f s while %s answers: replacing the staging consumer",
                what,
                failing_s,
                self.health.name,
            )
            self._parts.rebuild_consumer()

    def _serve_consumer(self) -> None:
        """Keep the group membership alive while recovering: serve callbacks, drop records (rewound later)."""
        try:
            self._parts.note_errors(self._parts.consumer.consume(num_messages=self._dc.consume_batch_size, timeout=0))
        except (KafkaException, RuntimeError) as exc:
            _log.debug("staging consumer while recovering: %s", exc)

    def _rewind(self) -> None:
        """Drop the open transaction's work and resume owned partitions from their last commit."""
        self.stats.rewinds += 1
        if self._data.traces is not None:
            self._data.traces.aborted("rewound to the last commit")
        self._txn.clear()
        self._gaps.clear()
        self._parts.rewind()

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

    # ------------------------------------------------------------ transactions
    def _budget_commit(self) -> None:
        """Commit on the time/size budget, timing it for the adaptive budget."""
        started = time.monotonic()
        self._commit("budget")
        self._last_commit_s = time.monotonic() - started

    def _commit(self, reason: str, *, in_callback: bool = False) -> bool:
        """Commit the open transaction; a failure goes to recovery (the loop's, with backoff).

        in_callback: from the staging consumer's rebalance callback (``Transaction.commit``).
        """
        if not self._txn.open:
            return True
        started_ns, records = time.time_ns(), self._txn.records
        offsets = dict(self._txn.next_offsets) if len(self._parts.holds) else {}
        read = list(self._txn.next_offsets) if self._parts.reading_anew else []
        try:
            committed = self._txn.commit(
                staging_topic=self._names.staging_topic,
                group_metadata=self._parts.consumer.consumer_group_metadata,
                write_state=self._data.write_state,
                commit_consumer_offsets=lambda offsets: self._parts.consumer.commit(
                    offsets=offsets, asynchronous=False
                ),
                offsets_metadata=staging_offsets_metadata(self._topics.staging_id),
                in_callback=in_callback,
            )
        except FencedError:
            raise
        except (KafkaException, FerrymanError) as exc:
            if not is_transient(exc) and not self._txn.fence_may_be_ours(exc):
                raise
            self._recovery = (exc, f"commit ({reason})")
            self._health_dirty = True
            return False
        self._parts.committed.update(committed)
        self._parts.positions_committed(read)
        for hold in self._parts.holds.committed(offsets):
            _log.warning(
                "staging partition %d released: the destination takes the record it refused now (%s-%d, held %.0f s)",
                hold.staging_partition,
                hold.refused.topic,
                hold.refused.partition,
                time.time() - hold.since_ms / 1000,
            )
            self._health_dirty = True
        if self._data.traces is not None:
            self._data.traces.committed(records, started_ns)
        return True

    def _commit_for_revoke(self, lost: bool) -> None:
        """Partitions are leaving (a rebalance callback): commit first, or leave it to recovery.

        Recovery restores state with blocking calls (committed offsets, the
        state topic), which time out inside a callback, so it always runs from
        the loop.
        """
        if not self._txn.open:
            return
        if lost:
            # Our generation is gone: the offsets commit would be refused.
            self._recovery = (_generation_lost("staging partitions lost"), "lost partitions")
        else:
            self._commit("revoke", in_callback=True)

    # ---------------------------------------------------------- status, close
    def _staging_lag(self) -> int:
        # Held partitions wait for the destination, not for this deduper: their lag must not pause the wrappers.
        held = self._parts.holds.paused
        tps = [TopicPartition(self._names.staging_topic, sp) for sp in sorted(self._parts.owned - held)]
        if not tps:
            return 0
        lag = 0
        consumer = self._parts.consumer
        for tp in consumer.position(tps):
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                lag += max(0, high - tp.offset)
        return lag

    def _destination_trouble(self) -> str:
        """Why wrappers should pause for the destination ("" when it is fine)."""
        if not self.health.reachable:
            return f"destination cluster unavailable ({self.health.reason})"
        if self._txn.refused_record:
            return self._txn.refused_record
        failures = self._txn.commits_failing()
        return f"destination cluster unavailable ({failures} failed commits)" if failures >= 2 else ""

    def status(self) -> control_pb2.GetDeduperStatusResponse:
        """Snapshot for DeduperService.GetDeduperStatus (called from gRPC threads)."""
        st = self.stats
        tx = self._txn.stats
        control = self._control
        unavailable = (
            self._topics.state_lost
            or self._destination_trouble()
            or (f"recovering: {self._recovery[1]}" if self._recovery is not None else "")
        )
        watermarks = control.watermarks() if control is not None else []
        owned = {(w.topic, w.partition) for w in watermarks}
        verdicts = self._verdicts.verdicts() if self._verdicts is not None else []
        holds = [h.status(self._parts.held_sources(h.staging_partition)) for h in self._parts.holds.holds()]
        txn_fields = self._txn.status_fields()
        if txn_fields["refused_record"] is None and holds:
            txn_fields["refused_record"] = holds[0].refused_record
        return control_pb2.GetDeduperStatusResponse(
            deduper_id=self.instance_id,
            flow=self._flow.name,
            records_written=st.records_written,
            duplicates_dropped=st.duplicates_dropped,
            gaps_detected=st.gaps_detected,
            gaps_healed=st.gaps_healed,
            transactions_committed=tx.committed,
            transactions_aborted=tx.aborted,
            partitions=watermarks,
            connected_wrappers=self._hub.connected_wrappers() if self._hub is not None else [],
            unavailable_reason=unavailable,
            producer_rebuilds=tx.producer_rebuilds,
            wedged_calls=tx.wedged_calls,
            bad_envelopes=dict(self._quarantine.counts),
            gaps=control.gaps() if control is not None else [],
            staging_losses=list(self._parts.staging_losses),
            acknowledged_lost_records=st.acknowledged_lost_records,
            version=package_version(),
            assigned_staging_partitions=sorted(set(self._parts.owned)),
            audit_verdicts=[v for v in verdicts if (v.topic, v.partition) in owned],
            held_staging_partitions=holds,
            group_offset_syncs=dict(self._group_sync.outcomes) if self._group_sync is not None else {},
            **txn_fields,
        )

    def _close(self) -> None:
        self._destinations.close()
        self._parts.close()
        self._txn.abort_quietly()
        if self._data.traces is not None:
            self._data.traces.aborted("aborted at shutdown")
        self._txn.close()
        _log.info("deduper %s stopped: %s, %s", self.instance_id, self.stats, self._txn.stats)
