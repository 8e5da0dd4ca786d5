"""The wrapper service: source topics to envelopes in the staging topic.

Reads the selected source topics with ``read_committed``, packs each run of
records of one source partition into an envelope and writes it with an
idempotent producer to the one staging partition of that source partition.
Source offsets are committed (to the source cluster) only up to the last
envelope acknowledged with every envelope before it; a failed send rewinds to
there. Everything it writes may be written again after a crash: the deduper
drops what it has already seen.

The rooms: ``_assignment`` (where each partition starts, its chain and epoch,
rebalances), ``_commits`` (source offset commits), ``_envelopes`` (packing),
``_datapath`` (the data path: records to envelopes, its counters),
``_clients`` (the source consumer and the staging producer: their faults,
rewinds and replacement, the recovery of a failed step), ``_specs`` (topic
discovery), ``_staging`` (the staging and topic-spec topics, the deduper's
watermarks read back), ``_links`` (the control links to the dedupers, the
pause of source reads), ``_control`` (one control link, the resend worker),
``_status`` (status) and this module (set-up, the loop).

**Riding through faults.** A broker restart, a coordinator moving or an outage
of either cluster is waited out: a failed commit is covered by the next one, a
transient error in the loop rewinds every partition to its acknowledged prefix
(retried with capped backoff while the cluster is away), a consumer fenced by
our own earlier session after a broker restart is replaced. Health is
NOT_SERVING with the reason meanwhile. Only a live twin (fenced twice within
``FenceWindow.WINDOW_S``), configuration errors and refused data loss end the process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from functools import partial

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from ferryman import envelope, topics
from ferryman.client_config import base_config
from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.errors import FencedError, FerrymanError, SourceDataLostError
from ferryman.flows import UNCHANGED, FlowStore, LiveFlow, stored_or
from ferryman.group_close import close_group_consumer
from ferryman.health import ClusterHealth, wait_until_reachable
from ferryman.kafka_errors import is_transient, kafka_error_of, wait_out_transient
from ferryman.metrics import wrapper_metrics
from ferryman.naming import FlowNames, TopicFilter
from ferryman.renewing_admin import RenewingAdmin
from ferryman.rpc import serving
from ferryman.state import PartitionKey
from ferryman.tracing import start_tracing
from ferryman.v1 import control_pb2, control_pb2_grpc

from ferryman_wrapper._assignment import SourcePartitions
from ferryman_wrapper._checkpoints import GroupCheckpointer
from ferryman_wrapper._clients import LoopClients, StepRecovery
from ferryman_wrapper._commits import SourceCommits
from ferryman_wrapper._datapath import DataPath
from ferryman_wrapper._envelopes import batch_flags
from ferryman_wrapper._group_offsets import SourceGroupOffsets
from ferryman_wrapper._links import DeduperLinks
from ferryman_wrapper._specs import SourceView, SpecPublisher
from ferryman_wrapper._staging import StagingTopics
from ferryman_wrapper._status import WrapperStatus, WrapperStatusServicer
from ferryman_wrapper._traces import WrapperTraces

_log = logging.getLogger(__name__)

#: Admin/metadata calls are small; 30 s covers a leader election on the way.
_ADMIN_TIMEOUT_S = 30.0
_SERVICE_NAME = "ferryman.v1.WrapperService"
#: A consumer's close commits nothing and leaves the group; longer means it is stuck.
_CLOSE_DEADLINE_S = 15.0


class Wrapper:
    """Runs one flow's wrapper until shutdown() is called.

    Lifecycle: ``run()`` blocks; ``shutdown()`` (thread- and signal-safe,
    idempotent) makes it stop consuming, flush the staging producer, commit
    what was acknowledged and close its clients.
    """

    def __init__(
        self,
        config: FerrymanConfig,
        flow: FlowConfig,
        *,
        instance_id: str | None = None,
        listen_address: str | None = None,
    ) -> None:
        self._config = config
        self._listen_address = listen_address or config.wrapper.listen_address
        self._flow = flow
        self._wc = config.wrapper
        self._names = FlowNames.of(flow, wrapper_group=self._wc.group_id, deduper_group=config.deduper.group_id)
        self._source = config.clusters[flow.source]
        self._target = config.clusters[flow.target]
        self._static_id = instance_id or config.wrapper.instance_id
        self.wrapper_id = self._static_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self.source_health = ClusterHealth(flow.source, self._source, on_change=self._health_changed)
        self.target_health = ClusterHealth(flow.target, self._target, on_change=self._health_changed)
        self._staging = StagingTopics(
            target=self._target,
            wc=self._wc,
            names=self._names,
            wrapper_id=self.wrapper_id,
            flow=lambda: self._flow,
            admin=lambda: self._target_admin.client,
            cluster_id=lambda: self._cluster_id,
            specs=lambda: self._specs,
            timeout_s=_ADMIN_TIMEOUT_S,
        )
        self._parts = SourcePartitions(
            cluster_id=lambda: self._cluster_id,
            specs=lambda: self._specs,
            start_position=flow.start_position,
            wrapper_group=self._names.wrapper_group,
            deduper_watermarks=self._staging.deduper_watermarks,
            hand_over=self._hand_over,
            paused=lambda: self._dedupers.paused,
        )
        self._commits = SourceCommits(
            consumer=lambda: self._clients.consumer,
            tracker=self._parts.tracker,
            sources=self._parts.sources,
            health=self.source_health,
        )
        self._clients = LoopClients(
            source=self._source,
            target=self._target,
            wc=self._wc,
            names=self._names,
            wrapper_id=self.wrapper_id,
            static_id=self._static_id,
            flow=lambda: self._flow,
            parts=self._parts,
            commits=self._commits,
            specs=lambda: self._specs,
            source_health=self.source_health,
            target_health=self.target_health,
        )
        self._recovery = StepRecovery(clients=self._clients, stop=self._stop, health_changed=self._health_changed)
        self._health_dirty = False
        #: Record and gRPC tracing; None when tracing is off (the data path then makes no trace decision at all).
        self._tracing = start_tracing(config.tracing, "ferryman-wrapper")
        self._data = DataPath(
            parts=self._parts,
            clients=self._clients,
            specs=lambda: self._specs,
            flow=lambda: self._flow,
            staging_topic=self._names.staging_topic,
            wrapper_id=self.wrapper_id,
            envelope_max_records=self._wc.envelope_max_records,
            envelope_max_bytes=self._wc.envelope_max_bytes,
            staging_max_message_bytes=self._wc.staging_max_message_bytes,
            source_health=self.source_health,
            target_health=self.target_health,
            timeout_s=_ADMIN_TIMEOUT_S,
            traces=None
            if self._tracing is None
            else WrapperTraces(self._tracing, consumer_group=self._names.wrapper_group),
        )
        self._dedupers = DeduperLinks(
            source=self._source,
            target=self._target,
            wc=self._wc,
            rpc=config.rpc,
            names=self._names,
            wrapper_id=self.wrapper_id,
            flow=lambda: self._flow,
            cluster_id=lambda: self._cluster_id,
            parts=self._parts,
            specs=lambda: self._specs,
            consumer=lambda: self._clients.consumer,
            target_health=self.target_health,
            tracing=self._tracing,
        )
        self._status = WrapperStatus(
            wrapper_id=self.wrapper_id,
            flow=lambda: self._flow,
            data=self._data,
            clients=self._clients,
            dedupers=self._dedupers,
            source_health=self.source_health,
            target_health=self.target_health,
            recovering=lambda: self._recovery.reason,
        )
        #: This flow as the flow store has it (the store wins), followed live.
        self._live: LiveFlow | None = None
        #: The flow is deleted (or re-created as this process cannot run it): reads paused, NOT_SERVING.
        self._flow_idle = False
        #: The topic filter changed while a discovery was under way: its result is dropped.
        self._filter_stale = False

    # ----------------------------------------------------------------- status
    def status(self) -> control_pb2.GetWrapperStatusResponse:
        """Snapshot for WrapperService.GetWrapperStatus (called from gRPC threads)."""
        return self._status.snapshot()

    @property
    def records_sent(self) -> int:
        """Source records wrapped into envelopes handed to the staging producer, since start."""
        return self._data.records_sent

    @property
    def envelopes_sent(self) -> int:
        """Envelopes handed to the staging producer, since start."""
        return self._data.envelopes_sent

    @property
    def source_records_lost(self) -> int:
        """Source records deleted (retention) before this wrapper read them, each counted once."""
        return self._data.source_records_lost

    @property
    def rewinds(self) -> int:
        """Rewinds to the acknowledged source offsets, since start."""
        return self._clients.rewinds

    @property
    def producer_rebuilds(self) -> int:
        """Staging producers replaced after a fatal error, since start."""
        return self._clients.producer_rebuilds

    @property
    def consumer_rebuilds(self) -> int:
        """Source consumers replaced (fenced, failed, stuck or left out of the group), since start."""
        return self._clients.consumer_rebuilds

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Ask run() to drain and return.

        Any thread, never a signal handler (an Event's lock): SIGTERM comes through `ferryman.signals`.
        """
        self._stop.set()

    def run(self) -> None:
        """Replicate until shutdown(); raises FerrymanError on unrecoverable errors.

        The gRPC server starts first (health NOT_SERVING until the Kafka side
        is up). Drain order on shutdown: health NOT_SERVING, stop consuming,
        flush staging writes and commit what was acknowledged, close the
        control links, stop the gRPC server, flush traces.
        """
        try:
            self._serve()
        finally:
            if self._tracing is not None:
                self._tracing.shutdown()

    def _serve(self) -> None:
        with serving(
            "wrapper",
            listen_address=self._listen_address,
            rpc=self._config.rpc,
            register=[
                lambda s: control_pb2_grpc.add_WrapperServiceServicer_to_server(
                    WrapperStatusServicer(
                        self.status,
                        SourceGroupOffsets(
                            lambda: base_config(self._source, f"{self.wrapper_id}-groups"), lambda: self._flow
                        ),
                    ),
                    s,
                )
            ],
            service_names=[_SERVICE_NAME],
            tracer_provider=self._tracing.provider if self._tracing is not None else None,
        ) as self._server:
            # Prometheus endpoint (metrics_address): serves status() from now until the drain is done.
            link = bool(self._wc.deduper_addresses) or self._wc.discover_dedupers  # listed or discovered
            with wrapper_metrics(self._wc.metrics_address, self.status, control_link=link):
                self._run_kafka()

    @property
    def port(self) -> int:
        """Bound gRPC port (after run() started the server)."""
        return self._server.port

    def _run_kafka(self) -> None:
        source_conf = base_config(self._source, f"{self.wrapper_id}-admin")
        source_admin = RenewingAdmin(lambda: AdminClient(source_conf), what="the source admin client")
        target_conf = base_config(self._target, f"{self.wrapper_id}-admin")
        self._target_admin = RenewingAdmin(lambda: AdminClient(target_conf), what="the destination admin client")
        wait_until_reachable(source_admin.client, self._flow.source, self._source, self._wc.startup_timeout_s)
        wait_until_reachable(self._target_admin.client, self._flow.target, self._target, self._wc.startup_timeout_s)
        # A broker restart or a slow cluster right after both first answered is waited out, not an exit.
        step = partial(wait_out_transient, budget_s=self._wc.startup_timeout_s, setting="wrapper.startup_timeout_s")
        self._cluster_id = step(
            lambda: topics.cluster_id(source_admin.client, _ADMIN_TIMEOUT_S),
            what="reading the source's id",
        )
        step(
            self._staging.ensure,
            what="making the internal topics",
        )
        store = FlowStore(self._flow.target, self._target, client_id=f"{self.wrapper_id}-flows")
        flow = self._flow
        self._flow = step(lambda: stored_or(store, flow), what="reading the flow store")
        self._live = LiveFlow(self._target, self._flow, client_id=f"{self.wrapper_id}-flows")
        self._clients.start_producer()
        self._specs = SpecPublisher(
            source_admin=source_admin,
            producer=self._clients.producer,
            specs_topic=self._names.specs_topic,
            cluster_id=self._cluster_id,
            topic_filter=TopicFilter.of(self._flow),
            replicate_configs=self._flow.replicate_topic_configs,
            timeout_s=_ADMIN_TIMEOUT_S,
        )
        self._clients.start_consumer()
        self._dedupers.start()
        self._checkpoints = GroupCheckpointer(
            admin=source_admin,
            consumer_config=lambda: base_config(self._source, f"{self.wrapper_id}-checkpoints"),
            flow=lambda: self._flow,
            wrapper_group=self._names.wrapper_group,
            assigned=self._dedupers.assigned,
            send=self._dedupers.broadcast,
        )
        self._checkpoints.start()
        _log.info(
            "wrapper %s starting: flow %s, source cluster %s, staging %s, envelope codec %s, checksum %s",
            self.wrapper_id,
            self._flow.name,
            self._cluster_id,
            self._names.staging_topic,
            envelope.CODEC,
            envelope.CHECKSUM,
        )
        self._server.set_serving(_SERVICE_NAME, True)
        self._live.start()
        try:
            self._loop()
        finally:
            self._live.stop()
            self._server.begin_drain()
            self._close()

    def _health_changed(self) -> None:
        self._health_dirty = True  # applied on the loop thread (_apply_health)

    def _apply_health(self) -> None:
        if self._health_dirty:
            self._health_dirty = False
            healthy = (
                self.source_health.reachable
                and self.target_health.reachable
                and not self._recovery.reason
                and not self._flow_idle
            )
            self._server.set_serving(_SERVICE_NAME, healthy)

    # ------------------------------------------------------------------- loop
    def _loop(self) -> None:
        self._clients.subscribe(self._discover_at_start())
        self._next_refresh = time.monotonic() + self._refresh_interval_s()
        self._next_commit = time.monotonic() + self._wc.commit_interval_ms / 1000
        self._next_progress = 0.0
        self._discovery: Future[SourceView] | None = None  # the periodic source reads run off this thread
        #: A step failed on a topic the cluster does not know: is staging gone? (asked before the rewind)
        self._unknown_topic_met = False
        while not self._stop.is_set():
            try:
                if self._recovery.reason:
                    if self._unknown_topic_met:
                        self._staging.make_again_if_deleted()
                        self._unknown_topic_met = False
                    self._clients.rewind(self._recovery.reason)
                    self._recovery.recovered()
                self._step()
            except (FencedError, SourceDataLostError):
                raise
            except (KafkaException, FerrymanError) as exc:
                if not is_transient(exc):
                    raise
                self._unknown_topic_met = self._unknown_topic_met or _unknown_topic(exc)
                self._recovery.failed(exc)
            self.source_health.tick()
            self.target_health.tick()
            self.source_health.probe(lambda t: self._clients.consumer.list_topics(timeout=t))
            self.target_health.probe(lambda t: self._clients.producer.list_topics(self._names.staging_topic, timeout=t))
            self._apply_health()

    def _discover_at_start(self) -> list[str]:
        """The first topic discovery (the source answered a moment ago; a blip is retried)."""
        while True:
            try:
                names = self._specs.discover()
            except (KafkaException, FerrymanError) as exc:
                if not is_transient(exc) or self._stop.is_set():
                    raise
                self.source_health.down(f"topic discovery: {exc}")
                self._stop.wait(self._recovery.next_backoff())
                continue
            self._recovery.reset_backoff()  # the loop's first recovery starts from the short wait again
            return names

    def _step(self) -> None:
        """One consume() batch wrapped, then what is due: commits, progress, discovery, client failures."""
        timeout = self._wc.poll_timeout_ms / 1000
        msgs = self._clients.consumer.consume(num_messages=self._wc.consume_batch_size, timeout=timeout)
        flags = batch_flags(msgs)
        if flags.errors:
            # Before check_callbacks, which may raise and drop the batch: a group consumer's
            # fatal error comes once, as an event of a batch (librdkafka gives error_cb none).
            msgs = self._data.records_only(msgs)
        self._clients.check_callbacks()
        if msgs:
            self.source_health.up()
            self._data.wrap(msgs, headers=flags.headers)
        self._clients.producer.poll(0)
        if self._clients.producer_fatal is not None:
            self._clients.rebuild_producer()
        if self._parts.tracker.any_failed:
            self._clients.rewind("a staging write failed")
        now = time.monotonic()
        if now >= self._next_commit:
            self._commits.commit(synchronous=False)
            self._next_commit = now + self._wc.commit_interval_ms / 1000
        self._dedupers.apply_backpressure(flow_idle=self._flow_idle)
        if self._dedupers.links and now >= self._next_progress:
            self._dedupers.send_progress()
            self._next_progress = now + self._wc.progress_interval_s
        discovery = self._discovery
        if discovery is not None and discovery.done():
            self._discovery = None
            self._next_refresh = now + self._refresh_interval_s()
            if self._filter_stale:  # read with the old topic filter: read again with the new one
                self._filter_stale, self._next_refresh = False, now
                return
            try:
                # result() raises what the source reads raised, as a discovery on this thread would.
                names = self._specs.publish(discovery.result())
            except (KafkaException, FerrymanError) as exc:
                if not is_transient(exc):
                    raise
                _log.warning("topic discovery failed (%s); trying again in %.0f s", exc, self._refresh_interval_s())
                if _unknown_topic(exc):  # the spec topic deleted under the flow: no new topic was ever followed
                    self._make_internal_topics_again()
                return
            if names != self._clients.subscribed:
                self._clients.subscribe(names)
        elif discovery is None and now >= self._next_refresh:
            self._discovery = self._specs.observe_in_background()
        self._follow_flow()

    def _make_internal_topics_again(self) -> None:
        """Make the flow's internal topics again if they are gone; a cluster that does not answer is asked next time."""
        try:
            self._staging.make_again_if_deleted()
        except (KafkaException, FerrymanError) as exc:
            if not is_transient(exc):
                raise
            _log.warning("the flow's internal topics are not made again, or their specs not sent, yet: %s", exc)

    def _refresh_interval_s(self) -> float:
        return self._flow.topic_refresh_interval_s or self._wc.topic_refresh_interval_s

    def _follow_flow(self) -> None:
        """Apply what changed in the stored flow (loop thread): topics, excludes, renames, pause, deletion.

        New topic filters take effect with a discovery started at once (or right after the one
        under way); pause and deletion through `DeduperLinks.apply_backpressure`, as the deduper's pause does.
        """
        assert self._live is not None
        change = self._live.take()
        if change is UNCHANGED:
            return
        self._health_dirty = True
        if not isinstance(change, FlowConfig):
            _log.warning("flow %s is gone from the flow store: source reads paused, NOT_SERVING", self._flow.name)
            self._flow_idle = True
            return
        self._flow, self._flow_idle = change, False
        self._specs.topic_filter = TopicFilter.of(change)
        self._filter_stale = self._discovery is not None
        self._next_refresh = 0.0  # discover with the new filter at once

    def _close(self) -> None:
        """Drain in order: flush staging writes, commit acknowledged offsets, close."""
        try:
            remaining = self._clients.producer.flush(self._wc.shutdown_timeout_s)
            if remaining:
                _log.warning("%d envelopes unacknowledged at shutdown; they will be re-sent", remaining)
            self._commits.commit()
        except (KafkaException, FerrymanError) as exc:
            _log.warning("final commit failed (%s); uncommitted records will be re-sent", exc)
        finally:
            if self._clients.consumer_fatal is None:
                close_group_consumer(
                    self._clients.consumer,
                    self._parts.joins,
                    what="closing the source consumer",
                    deadline_s=_CLOSE_DEADLINE_S,
                )
            self._commits.shutdown()
            self._checkpoints.stop()
            self._dedupers.stop()
        _log.info(
            "wrapper %s stopped: %d records in %d envelopes, %d rewinds",
            self.wrapper_id,
            self.records_sent,
            self.envelopes_sent,
            self.rewinds,
        )

    # ----------------------------------------------------------- partitions
    def _hand_over(self, keys: list[PartitionKey]) -> None:
        """Before partitions leave (revoke): everything sent acknowledged and committed, so nothing is re-sent."""
        self._clients.producer.flush(self._wc.shutdown_timeout_s)
        self._commits.hand_over(keys)


def _unknown_topic(exc: BaseException) -> bool:
    """Whether a step failed on a topic the cluster does not know (staging deleted under the flow?)."""
    err = kafka_error_of(exc) or (kafka_error_of(exc.__cause__) if exc.__cause__ is not None else None)
    return err is not None and err.code() in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART)
