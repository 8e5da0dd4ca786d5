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
``_specs`` (topic discovery), ``_control`` (the control link) and this module
(set-up, the loop, the data path).

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
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import grpc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman import envelope, protocol, topics
from ferryman.client_config import base_config, connected_producer, data_producer_config, streaming_consumer_config
from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.errors import FencedError, FerrymanError, KafkaOperationError, SourceDataLostError
from ferryman.flows import UNCHANGED, FlowStore, LiveFlow, stored_or
from ferryman.group_close import close_group_consumer
from ferryman.health import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, ClusterHealth, StuckRecovery, wait_until_reachable
from ferryman.kafka_errors import (
    FenceWindow,
    authorization_error,
    is_authorization_failure,
    is_fatal_client_error,
    is_membership_fence,
    is_transient,
)
from ferryman.metrics import wrapper_metrics
from ferryman.naming import FlowNames, TopicFilter
from ferryman.rpc import serving
from ferryman.state import COMPACTED_TOPIC_CONFIGS, PartitionKey, decode_watermarks, read_compacted
from ferryman.status import package_version
from ferryman.topics import InternalTopic
from ferryman.tracing import start_tracing
from ferryman.v1 import control_pb2, control_pb2_grpc, state_pb2
from ferryman.watchdog import park

from ferryman_wrapper._assignment import SourcePartitions
from ferryman_wrapper._commits import SYNC_COMMIT_BUDGET_S, SourceCommits
from ferryman_wrapper._control import RESEND_READ_BUDGET_S, ControlLink, ResendWorker
from ferryman_wrapper._discovery import DeduperDiscovery
from ferryman_wrapper._envelopes import batch_flags, build_envelopes, partition_runs
from ferryman_wrapper._specs import SourceView, SpecPublisher
from ferryman_wrapper._traces import WrapperTraces

_log = logging.getLogger(__name__)

#: Admin/metadata calls are small; 30 s covers a leader election on the way.
_ADMIN_TIMEOUT_S = 30.0
#: Staging records are kept a week by default: longer than any deduper outage
#: we plan for, and long enough for an audit to look back.
_STAGING_RETENTION_MS = str(7 * 24 * 3600 * 1000)
_SERVICE_NAME = "ferryman.v1.WrapperService"
#: A consumer's close commits nothing and leaves the group; longer means it is stuck.
_CLOSE_DEADLINE_S = 15.0
#: Slack beyond the loop's longest blocking step (a flush, then a synchronous commit, both in a revoke).
_POLL_INTERVAL_SLACK_S = 30.0
#: Backoff between recovery attempts while a cluster is away (first quick, then capped).
_RECOVERY_BACKOFF_S = (0.2, 5.0)
#: A source consumer not in the group again this long after its session timed out, while the source
#: has answered for ORPHANED_ANSWERING_S, is replaced (`_orphaned`): a rejoin once a broker is back takes
#: a few seconds. librdkafka can leave it without a coordinator far longer: after a freeze the first
#: metadata answer may list no broker, and the handle of the only one is decommissioned but held by a
#: pending offset commit until that expires (~60 s; the family of librdkafka #5511). A new client has
#: fresh handles.
ORPHANED_REBUILD_S = 15.0
ORPHANED_ANSWERING_S = 10.0


class WrapperStatusServicer(control_pb2_grpc.WrapperServiceServicer):
    """``ferryman.v1.WrapperService``: status for operators and tools."""

    def __init__(self, status: Callable[[], control_pb2.GetWrapperStatusResponse]) -> None:
        self._status = status

    def GetWrapperStatus(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.GetWrapperStatusRequest, context: grpc.ServicerContext
    ) -> control_pb2.GetWrapperStatusResponse:
        """Snapshot of counters, pause state and partition progress."""
        return self._status()


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
        self._parts = SourcePartitions(
            cluster_id=lambda: self._cluster_id,
            specs=lambda: self._specs,
            start_position=flow.start_position,
            wrapper_group=self._names.wrapper_group,
            deduper_watermarks=self._deduper_watermarks,
            hand_over=self._hand_over,
            paused=lambda: self._paused,
        )
        self._commits = SourceCommits(
            consumer=lambda: self._consumer,
            tracker=self._parts.tracker,
            sources=self._parts.sources,
            health=self.source_health,
        )
        self._producer_fatal: KafkaError | None = None
        self._consumer_fatal: KafkaError | None = None
        self._subscribed: list[str] = []
        # A missing ACL reported by a consumer callback (a fetch or a group refused): a configuration error
        # raised by the loop (_check_callbacks), never retried as an outage.
        self._consumer_denied: KafkaError | None = None
        self._fences = FenceWindow()
        self._next_orphan_probe = 0.0
        #: Since when the source's admin client has seen brokers, while the consumer is out of the group.
        self._answering_since: float | None = None
        self._pause_wanted: tuple[bool, str] = (False, "")
        self._paused = False
        self._watermarks: dict[PartitionKey, control_pb2.PartitionWatermark] = {}
        self._links: list[ControlLink] = []
        #: Finds the dedupers in the destination cluster when deduper_addresses is empty.
        self._finder: DeduperDiscovery | None = None
        self._progress_snapshot: list[control_pb2.PartitionProgress] = []
        #: Why the last step failed, while the loop is recovering from it.
        self._recovering: str = ""
        self._backoff_s = _RECOVERY_BACKOFF_S[0]
        #: A recovery failing while both clusters answer: the source consumer is replaced.
        self._stuck = StuckRecovery()
        self._health_dirty = False
        self.records_sent = 0
        self.envelopes_sent = 0
        self.source_records_lost = 0
        #: The last source offset counted in source_records_lost, by partition.
        self._lost_through: dict[PartitionKey, int] = {}
        self.rewinds = 0
        self.producer_rebuilds = 0
        self.consumer_rebuilds = 0
        #: Record and gRPC tracing; None when tracing is off (the data path then makes no trace decision at all).
        self._tracing = start_tracing(config.tracing, "ferryman-wrapper")
        self._traces = (
            None if self._tracing is None else WrapperTraces(self._tracing, consumer_group=self._names.wrapper_group)
        )
        #: This flow as the flow store has it (the store wins), followed live.
        self._live: LiveFlow | None = None
        #: The flow is deleted (or re-created as this process cannot run it): reads paused, NOT_SERVING.
        self._flow_idle = False
        #: The topic filter changed while a discovery was under way: its result is dropped.
        self._filter_stale = False

    # ------------------------------------------------------------------ setup
    def _make_producer(self) -> Producer:
        conf = data_producer_config(self._target, f"{self.wrapper_id}-staging")
        conf.update(
            {
                # Idempotence keeps envelopes of one staging partition in order
                # with up to 5 requests in flight: the max-offset dedup rule
                # relies on it.
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": self._wc.linger_ms,
                "compression.type": self._wc.compression_type,
                "message.max.bytes": self._wc.staging_max_message_bytes,
                "error_cb": self._on_producer_error,
            }
        )
        return connected_producer(conf, self._names.staging_topic)

    def _make_consumer(self) -> Consumer:
        conf = streaming_consumer_config(
            self._source, f"{self.wrapper_id}-source", on_session_timeout=self._fences.consumer_built()
        )
        conf.update(
            {
                "group.id": self._names.wrapper_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # Start positions are chosen explicitly on assignment; an
                # out-of-range committed offset (retention ran ahead of us)
                # must be an error, never a silent jump.
                "auto.offset.reset": "error",
                "partition.assignment.strategy": "cooperative-sticky",
                "topic.metadata.refresh.interval.ms": max(1000, int(self._wc.topic_refresh_interval_s * 1000)),
                "session.timeout.ms": self._wc.session_timeout_ms,
                # A consumer given up (parked) keeps heartbeating from librdkafka's thread and stays in the
                # group until this passes without a poll; every rebalance meanwhile waits for it (librdkafka's
                # default, 5 min, was one chaos run's 5-minute stall). So: the loop's longest blocking step.
                "max.poll.interval.ms": max(
                    self._wc.session_timeout_ms,
                    int((self._wc.shutdown_timeout_s + SYNC_COMMIT_BUDGET_S + _POLL_INTERVAL_SLACK_S) * 1000),
                ),
                "on_commit": self._commits.on_commit,
                "error_cb": self._on_consumer_error,
            }
        )
        if self._static_id:
            conf["group.instance.id"] = self._static_id
        return Consumer(conf)

    def _on_producer_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._producer_fatal = err
        else:
            self.target_health.client_error(err, "staging producer")

    def _on_consumer_error(self, err: KafkaError) -> None:
        if is_authorization_failure(err):
            self._consumer_denied = self._consumer_denied or err
            return
        # A fatal consumer error comes as code _FATAL, its cause in the text.
        if is_fatal_client_error(err):
            self._consumer_fatal = err
            _log.error("source consumer: %s", err)
        else:
            self.source_health.client_error(err, "source consumer")

    def _ensure_topics(self, target_admin: AdminClient) -> None:
        staging_configs = {
            "cleanup.policy": "delete",
            "max.message.bytes": str(self._wc.staging_max_message_bytes),
            "retention.ms": _STAGING_RETENTION_MS,
        }
        wanted = [
            InternalTopic(
                self._names.staging_topic,
                self._flow.staging_partitions,
                staging_configs,
                "staging",
                f"flows[{self._flow.name}].staging_partitions",
            ),
            InternalTopic(self._names.specs_topic, 1, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
        ]
        topics.ensure_internal_topics(
            target_admin, wanted, _ADMIN_TIMEOUT_S, visible_budget_s=self._wc.startup_timeout_s
        )

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Ask run() to drain and return. Safe from signal handlers and threads."""
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
                lambda s: control_pb2_grpc.add_WrapperServiceServicer_to_server(WrapperStatusServicer(self.status), s)
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
        source_admin = AdminClient(base_config(self._source, f"{self.wrapper_id}-admin"))
        self._target_admin = AdminClient(base_config(self._target, f"{self.wrapper_id}-admin"))
        wait_until_reachable(source_admin, self._flow.source, self._source, self._wc.startup_timeout_s)
        wait_until_reachable(self._target_admin, self._flow.target, self._target, self._wc.startup_timeout_s)
        self._cluster_id = topics.cluster_id(source_admin, _ADMIN_TIMEOUT_S)
        self._ensure_topics(self._target_admin)
        store = FlowStore(self._flow.target, self._target, client_id=f"{self.wrapper_id}-flows")
        self._flow = stored_or(store, self._flow)
        self._live = LiveFlow(self._target, self._flow, client_id=f"{self.wrapper_id}-flows")
        self._producer = self._make_producer()
        self._specs = SpecPublisher(
            source_admin=source_admin,
            producer=self._producer,
            specs_topic=self._names.specs_topic,
            cluster_id=self._cluster_id,
            topic_filter=TopicFilter.of(self._flow),
            replicate_configs=self._flow.replicate_topic_configs,
            timeout_s=_ADMIN_TIMEOUT_S,
        )
        self._consumer = self._make_consumer()
        self._parts.rejoin_after_first_assignment = bool(self._static_id)  # see SourcePartitions.on_assign
        self._start_control()
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

    def _subscribe(self, names: list[str]) -> None:
        self._subscribed = names
        if names:
            self._parts.joins.subscribed()
            self._consumer.subscribe(
                names, on_assign=self._on_assign, on_revoke=self._parts.on_revoke, on_lost=self._parts.on_lost
            )
            _log.info("subscribed to %d source topics: %s", len(names), ", ".join(names[:20]))
        else:
            self._parts.joins.unsubscribed()
            self._consumer.unsubscribe()
            _log.warning("no source topic matches flow %s yet", self._flow.name)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._fences.assigned()  # in the group again: a fence from now on is counted
        self._parts.on_assign(consumer, partitions)

    def _health_changed(self) -> None:
        self._health_dirty = True  # applied on the loop thread (_apply_health)

    def _apply_health(self) -> None:
        if self._health_dirty:
            self._health_dirty = False
            serving = (
                self.source_health.reachable
                and self.target_health.reachable
                and not self._recovering
                and not self._flow_idle
            )
            self._server.set_serving(_SERVICE_NAME, serving)

    # ------------------------------------------------------------------- loop
    def _loop(self) -> None:
        self._subscribe(self._discover_at_start())
        self._next_refresh = time.monotonic() + self._refresh_interval_s()
        self._next_commit = time.monotonic() + self._wc.commit_interval_ms / 1000
        self._next_progress = 0.0
        self._discovery: Future[SourceView] | None = None  # the periodic source reads run off this thread
        while not self._stop.is_set():
            try:
                if self._recovering:
                    self._rewind(self._recovering)
                    self._recovered()
                self._step()
            except (FencedError, SourceDataLostError):
                raise
            except (KafkaException, FerrymanError) as exc:
                if not is_transient(exc):
                    raise
                self._failed(exc)
            self.source_health.tick()
            self.target_health.tick()
            self.source_health.probe(lambda t: self._consumer.list_topics(timeout=t))
            self.target_health.probe(lambda t: self._producer.list_topics(self._names.staging_topic, timeout=t))
            self._apply_health()

    def _discover_at_start(self) -> list[str]:
        """The first topic discovery (the source answered a moment ago; a blip is retried)."""
        while True:
            try:
                return self._specs.discover()
            except (KafkaException, FerrymanError) as exc:
                if not is_transient(exc) or self._stop.is_set():
                    raise
                self.source_health.down(f"topic discovery: {exc}")
                self._stop.wait(self._next_backoff())

    def _step(self) -> None:
        """One consume() batch wrapped, then what is due: commits, progress, discovery, client failures."""
        timeout = self._wc.poll_timeout_ms / 1000
        msgs = self._consumer.consume(num_messages=self._wc.consume_batch_size, timeout=timeout)
        flags = batch_flags(msgs)
        if flags.errors:
            # Before _check_callbacks, which may raise and drop the batch: a group consumer's
            # fatal error comes once, as an event of a batch (librdkafka gives error_cb none).
            msgs = self._records_only(msgs)
        self._check_callbacks()
        if msgs:
            self.source_health.up()
            self._wrap(msgs, headers=flags.headers)
        self._producer.poll(0)
        if self._producer_fatal is not None:
            self._rebuild_producer()
        if self._parts.tracker.any_failed:
            self._rewind("a staging write failed")
        now = time.monotonic()
        if now >= self._next_commit:
            self._commits.commit(synchronous=False)
            self._next_commit = now + self._wc.commit_interval_ms / 1000
        self._apply_backpressure()
        if self._links and now >= self._next_progress:
            self._send_progress()
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
                return
            if names != self._subscribed:
                self._subscribe(names)
        elif discovery is None and now >= self._next_refresh:
            self._discovery = self._specs.observe_in_background()
        self._follow_flow()

    def _refresh_interval_s(self) -> float:
        return self._flow.topic_refresh_interval_s or self._wc.topic_refresh_interval_s

    def _follow_flow(self) -> None:
        """Apply what changed in the stored flow (loop thread): topics, excludes, renames, pause, deletion.

        New topic filters take effect with a discovery started at once (or right after the one
        under way); pause and deletion through `_apply_backpressure`, as the deduper's pause does.
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

    def _check_callbacks(self) -> None:
        """Act on what client callbacks recorded: a failed assignment, a fenced or failed consumer."""
        failure = self._parts.callback_failure
        if failure is not None:
            self._parts.callback_failure = None
            raise failure
        denied = self._consumer_denied
        if denied is not None:
            error = authorization_error(
                KafkaException(denied),
                operation=f"read flows[{self._flow.name}].topics with group {self._names.wrapper_group}",
                resource=", ".join(self._flow.topics),
            )
            assert error is not None  # only authorization failures are recorded
            raise error
        err = self._consumer_fatal
        if err is not None:
            self._consumer_fatal = None
            own = self._fences.session_lost
            if is_membership_fence(err) and self._fences.twin():
                raise FencedError(
                    f"the source consumer was fenced twice within {FenceWindow.WINDOW_S:.0f} s by a member with "
                    f"instance id {self._static_id!r} ({err.str()}): two live wrappers must not share it"
                )
            self._rebuild_consumer(
                f"the source consumer failed ({err.str()}); "
                + (FenceWindow.OWN_REJOIN if own else "after a broker restart a fence is our own earlier session")
            )
        elif self._commits.wedged:
            self._commits.wedged = False
            self._rebuild_consumer("a source offset commit never returned")
        elif self._orphaned():
            self._rebuild_consumer(
                f"not assigned again {self._fences.lost_for():.0f} s after its session timed out, though the "
                "source answers (librdkafka can leave a consumer without its coordinator after a broker freeze)"
            )
        elif self._specs.recreated:
            names = ", ".join(sorted(self._specs.recreated))
            self._specs.recreated.clear()
            # librdkafka keeps the topic ids it has seen: after a re-creation an assigned partition may
            # fetch nothing, with no error, until the client is replaced (confluent-kafka-python #1787).
            self._rebuild_consumer(f"source topic {names} was re-created (new topic id)")
        elif self._parts.resubscribe_due:
            _log.info("rejoining the source consumer group: %s", self._parts.resubscribe_due)
            self._parts.resubscribe_due = ""
            self._consumer.unsubscribe()
            self._subscribe(self._subscribed)

    def _orphaned(self) -> bool:
        """The consumer is out of the group ORPHANED_REBUILD_S after its session timed out; the source answers.

        The source must have answered for ORPHANED_ANSWERING_S, through the admin client, whose broker
        handles are its own. While the source is away nothing is replaced (an outage is waited out), and
        once it is back the consumer gets the time of a rejoin first.
        """
        lost_for = self._fences.lost_for()
        if not lost_for:
            self._answering_since = None
            return False
        now = time.monotonic()
        if now >= self._next_orphan_probe:
            self._next_orphan_probe = now + PROBE_INTERVAL_S
            try:
                brokers = self._specs.source_admin.list_topics(timeout=PROBE_TIMEOUT_S).brokers
            except KafkaException:
                brokers = {}
            if not brokers:
                self._answering_since = None
            elif self._answering_since is None:
                self._answering_since = now
        since = self._answering_since
        return lost_for >= ORPHANED_REBUILD_S and since is not None and now - since >= ORPHANED_ANSWERING_S

    def _failed(self, exc: BaseException) -> None:
        """A step failed with a transient fault: back off, then rewind (from the loop, retried)."""
        what = f"{type(exc).__name__}: {exc}"
        if not self._recovering:
            _log.warning("wrapper step failed (%s); rewinding to the acknowledged offsets", what)
        self._recovering = what
        self._health_dirty = True
        self._stop.wait(self._next_backoff())
        failing_s = self._stuck.failed(self._both_answer)
        if failing_s:
            self._rebuild_consumer(f"the recovery has failed for {failing_s:.0f} s while both clusters answer ({what})")

    def _both_answer(self, timeout_s: float) -> None:
        """Metadata from both clusters (raises KafkaException while one does not answer)."""
        self._specs.source_admin.list_topics(timeout=timeout_s)
        self._producer.list_topics(self._names.staging_topic, timeout=timeout_s)

    def _next_backoff(self) -> float:
        backoff = self._backoff_s
        self._backoff_s = min(_RECOVERY_BACKOFF_S[1], self._backoff_s * 2)
        return backoff

    def _recovered(self) -> None:
        _log.info("wrapper recovered from: %s", self._recovering)
        self._recovering = ""
        self._stuck.recovered()
        self._backoff_s = _RECOVERY_BACKOFF_S[0]
        self._health_dirty = True

    def _close(self) -> None:
        """Drain in order: flush staging writes, commit acknowledged offsets, close."""
        try:
            remaining = self._producer.flush(self._wc.shutdown_timeout_s)
            if remaining:
                _log.warning("%d envelopes unacknowledged at shutdown; they will be re-sent", remaining)
            self._commits.commit()
        except (KafkaException, FerrymanError) as exc:
            _log.warning("final commit failed (%s); uncommitted records will be re-sent", exc)
        finally:
            if self._consumer_fatal is None:
                close_group_consumer(
                    self._consumer,
                    self._parts.joins,
                    what="closing the source consumer",
                    deadline_s=_CLOSE_DEADLINE_S,
                )
            self._commits.shutdown()
            if self._finder is not None:
                self._finder.stop()  # first: it would start links to dedupers it finds meanwhile
            for link in self._links:
                link.stop()
            if self._links or self._finder is not None:
                self._resender.stop()
        _log.info(
            "wrapper %s stopped: %d records in %d envelopes, %d rewinds",
            self.wrapper_id,
            self.records_sent,
            self.envelopes_sent,
            self.rewinds,
        )

    # -------------------------------------------------------- rewinds, rebuilds
    def _hand_over(self, keys: list[PartitionKey]) -> None:
        """Before partitions leave (revoke): everything sent acknowledged and committed, so nothing is re-sent."""
        self._producer.flush(self._wc.shutdown_timeout_s)
        self._commits.commit(keys)

    def _rewind(self, why: str) -> None:
        """Resume every partition just after its acknowledged prefix."""
        self.rewinds += 1
        _log.warning("rewinding the wrapper: %s", why)
        self._producer.flush(self._wc.shutdown_timeout_s)
        self._commits.commit()
        for key, (nxt, logical) in self._parts.tracker.rewind_positions().items():
            self._parts.restart(key, nxt, logical)
            try:
                self._consumer.seek(TopicPartition(key.topic, key.partition, nxt if logical is None else logical))
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError._STATE:
                    self._replace_unfetching_consumer(key, exc)
                    return
                raise KafkaOperationError(f"seeking source partition {key} to {nxt}", exc) from exc

    def _replace_unfetching_consumer(self, key: PartitionKey, exc: KafkaException) -> None:
        """A rewind found a partition no longer fetched: the consumer lost it with no rebalance callback.

        It failed: fenced while the loop backed off, which does not consume, so its
        fatal error (an event of the next batch) is still unread. Every seek would
        fail the same way, a transient error for ever. The batch's error events are
        taken first, so that a fence is counted (a twin stops the wrapper); the
        consumer is replaced either way, and every partition starts again from its
        commit (the records of that batch with it).
        """
        for msg in self._consumer.consume(num_messages=self._wc.consume_batch_size, timeout=0):
            err = msg.error()
            if err is not None and is_fatal_client_error(err):
                self._on_consumer_error(err)
        if self._consumer_fatal is not None:
            self._check_callbacks()
        else:
            self._rebuild_consumer(f"source partition {key} is no longer fetched ({exc.args[0].str()})")

    def _rebuild_producer(self) -> None:
        err = self._producer_fatal
        _log.error("staging producer hit a fatal error (%s); rebuilding it and rewinding", err)
        self.producer_rebuilds += 1
        self._producer_fatal = None
        # Whatever was acknowledged before the error stays acknowledged.
        self._producer.purge()
        self._producer.flush(1.0)
        self._producer = self._make_producer()
        self._specs.producer = self._producer
        for key in list(self._parts.chain):
            self._parts.tracker.failed(key)
        self._rewind("producer rebuilt")

    def _rebuild_consumer(self, why: str) -> None:
        """Replace the source consumer: it rejoins the group and every partition starts again from its commit.

        Nothing is committed first: the old consumer is fenced, failed or stuck in a commit, so a commit
        through it would fail or hang too; the deduper drops what the new one re-sends.
        """
        _log.warning("replacing the source consumer: %s", why)
        self.consumer_rebuilds += 1
        self._commits.wedged = False
        self._parts.drop_all()
        # Never closed: a consumer in a fatal state does not return from close() (see ferryman.watchdog.park).
        # A parked member leaves the group by max.poll.interval.ms, or at once when the new one has its
        # group.instance.id; the new one's first assignment is followed by a rejoin (SourcePartitions.on_assign).
        park(self._consumer)
        self._consumer = self._make_consumer()
        self._parts.rejoin_after_first_assignment = bool(self._static_id)
        self._subscribe(self._subscribed)

    def _deduper_watermarks(self, keys: list[PartitionKey]) -> dict[PartitionKey, int]:
        """Watermarks the deduper committed for keys (empty if it never ran)."""
        admin = self._target_admin
        if self._names.state_topic not in topics.describe_topics(admin, [self._names.state_topic], _ADMIN_TIMEOUT_S):
            return {}
        parts = {envelope.staging_partition(k.topic, k.partition, self._flow.staging_partitions) for k in keys}
        conf: dict[str, Any] = base_config(self._target, f"{self.wrapper_id}-state")
        records = read_compacted(conf, self._names.state_topic, parts, _ADMIN_TIMEOUT_S * 2)
        out: dict[PartitionKey, int] = {}
        for recs in records.values():
            for key, st in decode_watermarks(recs, self._cluster_id).items():
                spec = self._specs.published.get(key.topic)
                # A watermark of an earlier incarnation of the topic says nothing about this one.
                same_topic = spec is not None and (not st.topic_id or st.topic_id == spec.topic_id)
                if key in keys and st.watermark >= 0 and same_topic:
                    out[key] = st.watermark
        return out

    # ------------------------------------------------------------ control link
    def _start_control(self) -> None:
        self._resender = ResendWorker(
            consumer_config={
                **base_config(self._source, f"{self.wrapper_id}-resend"),
                "group.id": f"{self._names.wrapper_group}.resend",
            },
            wrapper_id=self.wrapper_id,
            max_records=self._wc.envelope_max_records,
            max_bytes=self._wc.envelope_max_bytes,
            read_budget_s=RESEND_READ_BUDGET_S,
            tracing=self._tracing,
            consumer_group=self._names.wrapper_group,
            topic_id=lambda t: spec.topic_id if (spec := self._specs.published.get(t)) is not None else None,
        )
        self._resender.start()
        for address in self._wc.deduper_addresses:
            link = self._new_link(address)
            link.start()
            self._links.append(link)
        if not self._wc.deduper_addresses and self._wc.discover_dedupers:
            self._finder = DeduperDiscovery(
                names=self._names,
                consumer_config=base_config(self._target, f"{self.wrapper_id}-discovery"),
                make_link=self._new_link,
                links=self._links,
            )
            self._finder.start(self._target_admin, _ADMIN_TIMEOUT_S)
        self._specs.on_change = self._send_specs

    def _new_link(self, address: str) -> ControlLink:
        return ControlLink(
            address=address,
            rpc=self._config.rpc,
            hello=self._hello,
            specs=lambda: list(self._specs.published.values()),
            on_backpressure=self._on_backpressure,
            on_resend=self._resender.submit,
            on_watermarks=self._on_watermarks,
            tracer_provider=self._tracing.provider if self._tracing is not None else None,
        )

    def _hello(self) -> control_pb2.Hello:
        return control_pb2.Hello(
            version=protocol.current_version(),
            wrapper_id=self.wrapper_id,
            epoch=self._parts.last_epoch,
            flow=self._flow.name,
            source_cluster_id=self._cluster_id,
        )

    def _send_specs(self, specs: list[state_pb2.TopicSpec]) -> None:
        msg = control_pb2.ConnectRequest(topic_specs=control_pb2.TopicSpecs(specs=specs))
        for link in self._links:
            link.send(msg)

    def _on_backpressure(self, paused: bool, reason: str) -> None:
        self._pause_wanted = (paused, reason)

    def _on_watermarks(self, watermarks: control_pb2.Watermarks) -> None:
        for w in watermarks.partitions:
            self._watermarks[PartitionKey(w.topic, w.partition)] = w

    def _apply_backpressure(self) -> None:
        """Pause or resume reading the source as the deduper asked, or while staging is unreachable (loop thread).

        Paused partitions keep the consumer polled (group membership, callbacks)
        while nothing more is read for a producer that cannot deliver.
        """
        paused, reason = self._pause_wanted
        if self._flow.paused or self._flow_idle:
            paused, reason = True, f"flow {self._flow.name} {'deleted' if self._flow_idle else 'paused'}"
        elif not self.target_health.reachable:
            paused, reason = True, f"{self.target_health.name} unreachable"
        if paused == self._paused:
            return
        assignment = self._consumer.assignment()
        if paused:
            self._consumer.pause(assignment)
            _log.warning("pausing source reads: %s", reason)
        else:
            self._consumer.resume(assignment)
            _log.info("resuming source reads (%s)", reason)
        self._paused = paused

    def _progress(self) -> list[control_pb2.PartitionProgress]:
        out = []
        chain = self._parts.chain
        for key in sorted(chain):
            try:
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(key.topic, key.partition), cached=True)
            except KafkaException:
                high = -1
            out.append(
                control_pb2.PartitionProgress(
                    topic=key.topic, partition=key.partition, log_end_offset=high, last_wrapped_offset=chain[key]
                )
            )
        return out

    def _send_progress(self) -> None:
        self._progress_snapshot = self._progress()
        msg = control_pb2.ConnectRequest(progress=control_pb2.Progress(partitions=self._progress_snapshot))
        for link in self._links:
            link.send(msg)

    def status(self) -> control_pb2.GetWrapperStatusResponse:
        """Snapshot for WrapperService.GetWrapperStatus (called from gRPC threads)."""
        return control_pb2.GetWrapperStatusResponse(
            wrapper_id=self.wrapper_id,
            flow=self._flow.name,
            records_sent=self.records_sent,
            envelopes_sent=self.envelopes_sent,
            rewinds=self.rewinds,
            paused=self._paused,
            pause_reason=self._pause_wanted[1] if self._paused else "",
            control_connected=any(link.connected for link in self._links),
            resends_served=self._resender.served if self._links else 0,
            partitions=self._progress_snapshot,
            watermarks=[w for _, w in sorted(dict(self._watermarks).items())],
            unavailable_reason=self._unavailable_reason(),
            producer_rebuilds=self.producer_rebuilds,
            source_records_lost=self.source_records_lost,
            version=package_version(),
            control_links=[
                control_pb2.ControlLinkState(address=link.address, connected=link.connected)
                for link in list(self._links)
            ],
        )

    def _unavailable_reason(self) -> str:
        for health in (self.source_health, self.target_health):
            if not health.reachable:
                return f"{health.name} unreachable: {health.reason}"
        return f"recovering: {self._recovering}" if self._recovering else ""

    # ---------------------------------------------------------------- data path
    def _wrap(self, msgs: Sequence[Message], *, headers: bool) -> None:
        """Wrap a batch of records (no error events); headers: whether one of them may have headers."""
        for (topic, partition), run in partition_runs(msgs).items():
            key = PartitionKey(topic, partition)
            if key not in self._parts.chain:
                continue  # revoked while the batch was in hand
            self._send_run(key, run, headers=headers)

    def _records_only(self, msgs: Sequence[Message]) -> list[Message]:
        """The records of a batch that also holds error events, which are handled here (or raise)."""
        records = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                records.append(msg)
            else:
                self._on_consume_error(msg, err)
        return records

    def _send_run(self, key: PartitionKey, run: list[Message], *, headers: bool) -> None:
        """Wrap and produce one partition's run; headers: whether a record of its batch has headers."""
        sp = envelope.staging_partition(key.topic, key.partition, self._flow.staging_partitions)
        produce = self._producer.produce
        traces = self._traces
        traced = traces.start(key.topic, key.partition, run, headers=headers) if traces is not None else None
        for built in build_envelopes(
            run,
            self._parts.sources[key],
            self._parts.chain[key],
            wrapper_id=self.wrapper_id,
            wrapper_epoch=self._parts.epoch[key],
            max_records=self._wc.envelope_max_records,
            max_bytes=self._wc.envelope_max_bytes,
            record_traces=traced.suffix if traced is not None else None,
        ):
            last = built.last_offset
            epoch = self._parts.epoch[key]

            def on_delivery(
                err: KafkaError | None, _msg: Message, key: PartitionKey = key, last: int = last, epoch: int = epoch
            ) -> None:
                if self._parts.epoch.get(key) != epoch:
                    return  # report of an envelope sent before a rewind
                if err is None:
                    self._parts.tracker.acked(key, last)
                    self.target_health.up()
                else:
                    _log.error("staging write of %s up to offset %d failed: %s", key, last, err)
                    self._parts.tracker.failed(key)

            while True:
                try:
                    produce(
                        self._names.staging_topic,
                        value=built.value,
                        key=self._parts.staging_keys[key],
                        partition=sp,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    # Local queue full: serve delivery reports to make room.
                    self._producer.poll(0.05)
            self._parts.tracker.sent(key, last)
            self._parts.chain[key] = last
            self.records_sent += built.record_count
            self.envelopes_sent += 1
        if traced is not None:
            traced.end()

    def _on_consume_error(self, msg: Message, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if is_fatal_client_error(err) or is_authorization_failure(err):
            self._on_consumer_error(err)  # acted on by the loop (_check_callbacks)
            return
        key = PartitionKey(str(msg.topic()), msg.partition() or 0)
        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE) and key in self._parts.chain:
            self._continue_after_deleted(key, err)
            return
        self.source_health.client_error(err, "source consumer")

    def _continue_after_deleted(self, key: PartitionKey, err: KafkaError) -> None:
        """The next offset to replicate left the source log (retention): go on from the log start, loudly.

        Never a silent skip: the chain restarts just before the log start, so the
        next envelope shows the deleted range to the deduper as a gap, which it
        holds and reports as lost (a resend answer tells it the source no longer
        has the records) until an operator acknowledges the loss.
        """
        # A topic deleted and re-created under us looks the same from here: its offsets start again at 0.
        self._specs.refresh([key.topic])
        if key.topic in self._specs.recreated:
            _log.warning("source partition %s is out of range (%s): its topic was re-created", key, err.str())
            return  # the loop replaces the consumer, which starts the new topic from its beginning
        low, high = topics.watermark_offsets(self._consumer, key.topic, key.partition, budget_s=_ADMIN_TIMEOUT_S)
        first_lost = self._parts.chain[key] + 1
        if low <= first_lost <= high:
            # The next offset is in the log: the error is about a fetch position this wrapper has already moved
            # past (a rejoin right after start reassigns the partition while its first out-of-range error is
            # being handled, and the old fetch reports it again).
            _log.warning(
                "source partition %s: a stale out-of-range error (%s); offset %d is in the log (%d..%d)",
                key,
                err.str(),
                first_lost,
                low,
                high,
            )
            return
        if low <= first_lost:
            raise SourceDataLostError(  # the position left the log, yet nothing before it was deleted: unexplained
                f"source partition {key}: the next offset to replicate, {first_lost}, is out of range ({err.str()}) "
                f"while the log starts at {low}; refusing to guess where to go on"
            )
        # Counted once: a partition that comes back from its committed offset (a rejoin, a rebalance) meets
        # the same deleted range again.
        counted_through = self._lost_through.get(key, -1)
        if low - 1 > counted_through:
            _log.error(
                "SOURCE DATA LOST: source partition %s offsets %d..%d were deleted (retention) before this wrapper "
                "read them (%s). Going on from offset %d; the deduper holds the partition at the gap and reports it "
                "until the loss is acknowledged (flows[].acknowledged_losses)",
                key,
                first_lost,
                low - 1,
                err.str(),
                low,
            )
            self.source_records_lost += low - max(first_lost, counted_through + 1)
            self._lost_through[key] = low - 1
        else:
            _log.warning(
                "source partition %s: offsets %d..%d, already reported lost; going on from offset %d",
                key,
                first_lost,
                low - 1,
                low,
            )
        self._parts.chain[key] = low - 1
        # After an offset reset error the partition's fetcher refuses a seek (_STATE): take it out of the
        # local assignment and put it back at the log start (the group's assignment does not change).
        tp = TopicPartition(key.topic, key.partition)
        self._consumer.incremental_unassign([tp])
        self._consumer.incremental_assign([TopicPartition(key.topic, key.partition, low)])
