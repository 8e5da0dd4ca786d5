"""The wrapper service: source topics to envelopes in the staging topic.

Reads the selected source topics with ``read_committed``, packs each run of
records of one source partition into an envelope and writes it with an
idempotent producer to the one staging partition of that source partition.
Source offsets are committed (to the source cluster) only up to the last
envelope acknowledged with every envelope before it; a failed send rewinds to
there. Everything it writes may be written again after a crash: the deduper
drops what it has already seen.
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
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from ferryman import envelope, protocol, topics
from ferryman.client_config import base_config, connected_producer, streaming_consumer_config
from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.errors import FerrymanError, KafkaOperationError, SourceDataLostError
from ferryman.kafka_errors import ErrorClass, classify, retry_retriable
from ferryman.naming import FlowNames, TopicFilter
from ferryman.rpc import serving
from ferryman.state import COMPACTED_TOPIC_CONFIGS, PartitionKey, decode_watermarks, read_compacted
from ferryman.topics import InternalTopic
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2

from ferryman_wrapper._control import RESEND_READ_BUDGET_S, ControlLink, ResendWorker
from ferryman_wrapper._envelopes import build_envelopes, has_errors, partition_runs
from ferryman_wrapper._progress import ProgressTracker
from ferryman_wrapper._specs import SourceView, SpecPublisher

_log = logging.getLogger(__name__)

#: Admin/metadata calls are small; 30 s covers a leader election on the way.
_ADMIN_TIMEOUT_S = 30.0
#: Staging records are kept a week by default: longer than any deduper outage
#: we plan for, and long enough for an audit to look back.
_STAGING_RETENTION_MS = str(7 * 24 * 3600 * 1000)
_SERVICE_NAME = "ferryman.v1.WrapperService"


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
        self._tracker = ProgressTracker()
        # Per assigned source partition: last offset sent (the chain) and epoch.
        self._chain: dict[PartitionKey, int] = {}
        self._epoch: dict[PartitionKey, int] = {}
        self._last_epoch = 0
        self._sources: dict[PartitionKey, envelope_pb2.SourcePartition] = {}
        self._staging_keys: dict[PartitionKey, bytes] = {}
        self._topic_ids: dict[str, bytes] = {}
        self._producer_fatal: KafkaError | None = None
        self._fatal: BaseException | None = None
        self._pause_wanted: tuple[bool, str] = (False, "")
        self._paused = False
        self._watermarks: dict[PartitionKey, control_pb2.PartitionWatermark] = {}
        self._links: list[ControlLink] = []
        self._progress_snapshot: list[control_pb2.PartitionProgress] = []
        # Since when asynchronous source offset commits have been failing (None: the last one passed).
        self._commit_failing_since: float | None = None
        self.records_sent = 0
        self.envelopes_sent = 0
        self.rewinds = 0

    # ------------------------------------------------------------------ setup
    def _make_producer(self) -> Producer:
        conf = base_config(self._target, f"{self.wrapper_id}-staging")
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
        conf = streaming_consumer_config(self._source, f"{self.wrapper_id}-source")
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
                "on_commit": self._on_commit,
            }
        )
        if self._wc.instance_id or self._static_id:
            conf["group.instance.id"] = self._static_id or self._wc.instance_id
        return Consumer(conf)

    def _on_producer_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._producer_fatal = err
        else:
            _log.warning("staging producer: %s", err)

    def _ensure_topics(self, target_admin: AdminClient) -> None:
        staging_configs = {
            "cleanup.policy": "delete",
            "max.message.bytes": str(self._wc.staging_max_message_bytes),
            "retention.ms": _STAGING_RETENTION_MS,
        }
        wanted = [
            InternalTopic(self._names.staging_topic, self._flow.staging_partitions, staging_configs, "staging"),
            InternalTopic(self._names.specs_topic, 1, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
        ]
        topics.ensure_internal_topics(target_admin, wanted, _ADMIN_TIMEOUT_S)

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Ask run() to drain and return. Safe from signal handlers and threads."""
        self._stop.set()

    def run(self) -> None:
        """Replicate until shutdown(); raises FerrymanError on unrecoverable errors.

        The gRPC server starts first (health NOT_SERVING until the Kafka side
        is up). Drain order on shutdown: health NOT_SERVING, stop consuming,
        flush staging writes and commit what was acknowledged, close the
        control links, stop the gRPC server.
        """
        with serving(
            "wrapper",
            listen_address=self._listen_address,
            rpc=self._config.rpc,
            register=[
                lambda s: control_pb2_grpc.add_WrapperServiceServicer_to_server(WrapperStatusServicer(self.status), s)
            ],
            service_names=[_SERVICE_NAME],
        ) as self._server:
            self._run_kafka()

    @property
    def port(self) -> int:
        """Bound gRPC port (after run() started the server)."""
        return self._server.port

    def _run_kafka(self) -> None:
        source_admin = AdminClient(base_config(self._source, f"{self.wrapper_id}-admin"))
        target_admin = AdminClient(base_config(self._target, f"{self.wrapper_id}-admin"))
        self._cluster_id = topics.cluster_id(source_admin, _ADMIN_TIMEOUT_S)
        self._ensure_topics(target_admin)
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
        try:
            self._loop()
        finally:
            self._server.begin_drain()
            self._close()

    def _subscribe(self, names: list[str]) -> None:
        self._subscribed = names
        if names:
            self._consumer.subscribe(names, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
            _log.info("subscribed to %d source topics: %s", len(names), ", ".join(names[:20]))
        else:
            self._consumer.unsubscribe()
            _log.warning("no source topic matches flow %s yet", self._flow.name)

    def _loop(self) -> None:
        self._subscribe(self._specs.discover())
        next_refresh = time.monotonic() + self._wc.topic_refresh_interval_s
        next_commit = time.monotonic() + self._wc.commit_interval_ms / 1000
        next_progress = 0.0
        discovery: Future[SourceView] | None = None  # the periodic source reads run off this thread
        timeout = self._wc.poll_timeout_ms / 1000
        while not self._stop.is_set():
            if self._fatal is not None:
                raise self._fatal
            msgs = self._consumer.consume(num_messages=self._wc.consume_batch_size, timeout=timeout)
            if self._fatal is not None:
                raise self._fatal
            if msgs:
                self._wrap(msgs)
            self._producer.poll(0)
            if self._producer_fatal is not None:
                self._rebuild_producer()
            if self._tracker.any_failed:
                self._rewind("a staging write failed")
            now = time.monotonic()
            if now >= next_commit:
                self._commit(synchronous=False)
                next_commit = now + self._wc.commit_interval_ms / 1000
            self._apply_backpressure()
            if self._links and now >= next_progress:
                self._send_progress()
                next_progress = now + self._wc.progress_interval_s
            if discovery is not None and discovery.done():
                # result() raises what the source reads raised, as a discovery on this thread would.
                names = self._specs.publish(discovery.result())
                if names != self._subscribed:
                    self._subscribe(names)
                discovery = None
                next_refresh = now + self._wc.topic_refresh_interval_s
            elif discovery is None and now >= next_refresh:
                discovery = self._specs.observe_in_background()

    def _close(self) -> None:
        """Drain in order: flush staging writes, commit acknowledged offsets, close."""
        try:
            remaining = self._producer.flush(self._wc.shutdown_timeout_s)
            if remaining:
                _log.warning("%d envelopes unacknowledged at shutdown; they will be re-sent", remaining)
            self._commit()
        except (KafkaException, FerrymanError) as exc:
            _log.warning("final commit failed (%s); uncommitted records will be re-sent", exc)
        finally:
            self._consumer.close()
            for link in self._links:
                link.stop()
            if self._links:
                self._resender.stop()
        _log.info(
            "wrapper %s stopped: %d records in %d envelopes, %d rewinds",
            self.wrapper_id,
            self.records_sent,
            self.envelopes_sent,
            self.rewinds,
        )

    # ------------------------------------------------------------ control link
    def _start_control(self) -> None:
        if not self._wc.deduper_addresses:
            return
        self._resender = ResendWorker(
            consumer_config={
                **base_config(self._source, f"{self.wrapper_id}-resend"),
                "group.id": f"{self._names.wrapper_group}.resend",
            },
            wrapper_id=self.wrapper_id,
            max_records=self._wc.envelope_max_records,
            max_bytes=self._wc.envelope_max_bytes,
            read_budget_s=RESEND_READ_BUDGET_S,
            topic_id=lambda t: spec.topic_id if (spec := self._specs.published.get(t)) is not None else None,
        )
        self._resender.start()
        for address in self._wc.deduper_addresses:
            link = ControlLink(
                address=address,
                rpc=self._config.rpc,
                hello=self._hello,
                specs=lambda: list(self._specs.published.values()),
                on_backpressure=self._on_backpressure,
                on_resend=self._resender.submit,
                on_watermarks=self._on_watermarks,
            )
            link.start()
            self._links.append(link)
        self._specs.on_change = self._send_specs

    def _hello(self) -> control_pb2.Hello:
        return control_pb2.Hello(
            version=protocol.current_version(),
            wrapper_id=self.wrapper_id,
            epoch=self._last_epoch,
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
        """Pause or resume reading the source as the deduper asked (loop thread only)."""
        paused, reason = self._pause_wanted
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
        for key in sorted(self._chain):
            try:
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(key.topic, key.partition), cached=True)
            except KafkaException:
                high = -1
            out.append(
                control_pb2.PartitionProgress(
                    topic=key.topic, partition=key.partition, log_end_offset=high, last_wrapped_offset=self._chain[key]
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
        )

    # ---------------------------------------------------------------- data path
    def _wrap(self, msgs: Sequence[Message]) -> None:
        if has_errors(msgs):
            msgs = self._records_only(msgs)
        for (topic, partition), run in partition_runs(msgs).items():
            key = PartitionKey(topic, partition)
            if key not in self._chain:
                continue  # revoked while the batch was in hand
            self._send_run(key, run)

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

    def _send_run(self, key: PartitionKey, run: list[Message]) -> None:
        sp = envelope.staging_partition(key.topic, key.partition, self._flow.staging_partitions)
        produce = self._producer.produce
        for built in build_envelopes(
            run,
            self._sources[key],
            self._chain[key],
            wrapper_id=self.wrapper_id,
            wrapper_epoch=self._epoch[key],
            max_records=self._wc.envelope_max_records,
            max_bytes=self._wc.envelope_max_bytes,
        ):
            last = built.last_offset
            epoch = self._epoch[key]

            def on_delivery(
                err: KafkaError | None, _msg: Message, key: PartitionKey = key, last: int = last, epoch: int = epoch
            ) -> None:
                if self._epoch.get(key) != epoch:
                    return  # report of an envelope sent before a rewind
                if err is None:
                    self._tracker.acked(key, last)
                else:
                    _log.error("staging write of %s up to offset %d failed: %s", key, last, err)
                    self._tracker.failed(key)

            while True:
                try:
                    produce(
                        self._names.staging_topic,
                        value=built.value,
                        key=self._staging_keys[key],
                        partition=sp,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    # Local queue full: serve delivery reports to make room.
                    self._producer.poll(0.05)
            self._tracker.sent(key, last)
            self._chain[key] = last
            self.records_sent += built.record_count
            self.envelopes_sent += 1

    def _on_consume_error(self, msg: Message, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            raise SourceDataLostError(
                f"source partition {msg.topic()}-{msg.partition()}: the next offset to replicate is no longer "
                f"in the log ({err.str()}); records were deleted before they were replicated. Refusing to skip "
                f"ahead. Inspect the loss, then reset the wrapper group {self._names.wrapper_group} offsets "
                f"explicitly to continue."
            )
        if err.fatal():
            raise KafkaOperationError("source consumer", KafkaException(err))
        _log.warning("source consumer: %s", err)

    # ------------------------------------------------------------- commits
    def _commit(self, keys: list[PartitionKey] | None = None, *, synchronous: bool = True) -> None:
        """Commit the acknowledged prefix of each partition (of ``keys``, or all) to the source cluster.

        Synchronous (shutdown, rewind, revoke: the next reader must find it): retriable
        errors are retried within the admin budget, a rebalance's is logged and skipped.
        The periodic commit is asynchronous: the loop does not wait for the round trip
        (7-28 ms at 250 k rec/s here, every record behind it delayed by as much); its
        outcome arrives in ``_on_commit``, and a failed one is covered by the next.
        """
        positions = self._tracker.commit_positions(keys)
        if not positions:
            if keys is None:
                self._commit_failing_since = None  # everything acknowledged is committed
            return
        # The topic id rides along as commit metadata: after a source topic is
        # deleted and re-created, old offsets are recognised as meaningless.
        offsets = [
            TopicPartition(k.topic, k.partition, nxt, metadata=self._sources[k].topic_id.hex())
            for k, nxt in positions.items()
            if k in self._sources
        ]
        if not offsets:
            return  # librdkafka refuses an empty commit (_NO_OFFSET), which would stop the wrapper
        if not synchronous:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:  # refused before it was sent
                self._commit_failed(exc, "committing source offsets")
            return
        try:
            retry_retriable(
                lambda: self._consumer.commit(offsets=offsets, asynchronous=False),
                what="committing source offsets",
                budget_s=_ADMIN_TIMEOUT_S,
            )
        except KafkaException as exc:
            if classify(exc) is ErrorClass.ABORTABLE:
                # A rebalance moved partitions: the new owner resumes from the
                # last commit and the deduper drops what we already sent.
                _log.warning("source offset commit skipped during a rebalance: %s", exc)
                return
            raise
        self._tracker.mark_committed(positions)
        self._commit_failing_since = None

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Outcome of a source offset commit (consumer callback, on the loop thread)."""
        if err is not None:
            self._commit_failed(err, "committing source offsets")
            return
        done: dict[PartitionKey, int] = {}
        for tp in partitions:
            if tp.error is not None:
                self._commit_failed(tp.error, f"committing source offset of {tp.topic}-{tp.partition}")
            elif tp.offset >= 0:
                done[PartitionKey(tp.topic, tp.partition)] = tp.offset
        if done:
            self._tracker.mark_committed(done)
            if len(done) == len(partitions):
                self._commit_failing_since = None

    def _commit_failed(self, error: KafkaError | KafkaException, what: str) -> None:
        """A commit the loop did not wait for failed: the next one covers it, unless it cannot pass.

        A rebalance's error is only logged (the new owner resumes from the last commit).
        Fenced or fatal errors stop the wrapper, as a synchronous commit's do; so do
        retriable ones lasting the admin budget (a synchronous commit retries that long).
        """
        cls = classify(error)
        if cls is ErrorClass.ABORTABLE:
            _log.warning("%s skipped during a rebalance: %s", what, error)
            return
        if cls is ErrorClass.RETRIABLE:
            now = time.monotonic()
            if self._commit_failing_since is None:
                self._commit_failing_since = now
            if now - self._commit_failing_since < _ADMIN_TIMEOUT_S:
                _log.warning("%s failed (%s); the next commit covers it", what, error)
                return
        self._fatal = KafkaOperationError(what, error if isinstance(error, KafkaException) else KafkaException(error))

    def _rewind(self, why: str) -> None:
        """Resume every partition just after its acknowledged prefix."""
        self.rewinds += 1
        _log.warning("rewinding the wrapper: %s", why)
        self._producer.flush(self._wc.shutdown_timeout_s)
        self._commit()
        positions = self._tracker.rewind_positions()
        for key, (nxt, logical) in positions.items():
            self._restart_partition(key, nxt, logical)
            self._consumer.seek(TopicPartition(key.topic, key.partition, nxt if logical is None else logical))

    def _rebuild_producer(self) -> None:
        err = self._producer_fatal
        _log.error("staging producer hit a fatal error (%s); rebuilding it and rewinding", err)
        self._producer_fatal = None
        # Whatever was acknowledged before the error stays acknowledged.
        self._producer.purge()
        self._producer.flush(1.0)
        self._producer = self._make_producer()
        self._specs.producer = self._producer
        for key in list(self._chain):
            self._tracker.failed(key)
        self._rewind("producer rebuilt")

    def _restart_partition(self, key: PartitionKey, next_offset: int, logical: int | None = None) -> None:
        """(Re)start reading key at next_offset (or a logical offset) under a new epoch.

        The chain restarts at next_offset - 1: everything before next_offset was
        acknowledged (we commit last offset + 1), or, for a logical start,
        at -1 (the start of replication for the partition).
        """
        self._last_epoch += 1
        self._epoch[key] = self._last_epoch
        self._chain[key] = next_offset - 1 if logical is None else -1
        self._tracker.start(key, next_offset, logical)

    # ------------------------------------------------------------ rebalances
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._assign(consumer, partitions)
        except BaseException as exc:  # surfaced from the loop: callbacks must not raise
            _log.exception("partition assignment failed")
            self._fatal = exc
            self._stop.set()

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        # Describe the assigned topics afresh: a topic deleted and re-created
        # since we last looked has a new id, and envelopes must carry it.
        self._specs.refresh(sorted({tp.topic for tp in partitions}))
        committed = retry_retriable(
            lambda: consumer.committed(partitions, timeout=_ADMIN_TIMEOUT_S),
            what="reading committed source offsets",
            budget_s=_ADMIN_TIMEOUT_S * 2,
        )
        for tp in committed:
            topic_id = self._specs.published[tp.topic].topic_id
            if tp.offset >= 0 and tp.metadata and tp.metadata != topic_id.hex():
                _log.error(
                    "source topic %s was re-created (topic id changed): its committed offset %d in partition %d "
                    "belongs to the old topic and is ignored",
                    tp.topic,
                    tp.offset,
                    tp.partition,
                )
                tp.offset = OFFSET_INVALID
        missing = [PartitionKey(tp.topic, tp.partition) for tp in committed if tp.offset < 0]
        watermarks = self._deduper_watermarks(missing) if missing else {}
        start: list[TopicPartition] = []
        for tp in committed:
            key = PartitionKey(tp.topic, tp.partition)
            spec = self._specs.published[tp.topic]
            self._sources[key] = envelope_pb2.SourcePartition(
                cluster_id=self._cluster_id, topic=tp.topic, topic_id=spec.topic_id, partition=tp.partition
            )
            self._staging_keys[key] = f"{tp.topic}/{tp.partition}".encode()
            if tp.offset >= 0:
                nxt = tp.offset
            elif key in watermarks:
                nxt = watermarks[key] + 1
                _log.warning(
                    "source partition %s has no committed offset in group %s but the deduper has replicated it up "
                    "to offset %d: resuming at %d (offsets were reset or expired)",
                    key,
                    self._names.wrapper_group,
                    watermarks[key],
                    nxt,
                )
            else:
                nxt = -1  # never replicated: the flow's start position
            if nxt >= 0:
                self._restart_partition(key, nxt)
                start.append(TopicPartition(tp.topic, tp.partition, nxt))
            else:
                pos = OFFSET_BEGINNING if self._flow.start_position == "earliest" else OFFSET_END
                self._restart_partition(key, 0, pos)
                start.append(TopicPartition(tp.topic, tp.partition, pos))
                _log.info("source partition %s is new to the flow: starting at %s", key, self._flow.start_position)
        consumer.incremental_assign(start)
        if self._paused:
            consumer.pause(start)

    def _deduper_watermarks(self, keys: list[PartitionKey]) -> dict[PartitionKey, int]:
        """Watermarks the deduper committed for keys (empty if it never ran)."""
        admin = AdminClient(base_config(self._target, f"{self.wrapper_id}-admin"))
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

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [PartitionKey(tp.topic, tp.partition) for tp in partitions]
        try:
            # Hand over cleanly: everything sent is acknowledged and committed,
            # so the next owner re-sends nothing.
            self._producer.flush(self._wc.shutdown_timeout_s)
            self._commit(keys)
        except (KafkaException, FerrymanError) as exc:
            _log.warning("commit on revoke failed (%s): the next owner re-sends from the last commit", exc)
        self._drop(keys)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        _log.warning("lost %d source partitions (session expired); the new owner re-sends", len(partitions))
        self._drop([PartitionKey(tp.topic, tp.partition) for tp in partitions])

    def _drop(self, keys: list[PartitionKey]) -> None:
        for key in keys:
            self._tracker.forget(key)
            self._chain.pop(key, None)
            self._epoch.pop(key, None)
