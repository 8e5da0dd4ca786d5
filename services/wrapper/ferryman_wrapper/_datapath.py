"""The wrapper's data path: consumed source records to envelopes in the staging topic, and its counters.

Each run of records of one source partition is packed into envelopes
(``_envelopes``) and produced to the one staging partition of that source
partition; its delivery reports move the partition's acknowledged prefix
(``ProgressTracker``) or mark it for a rewind. Error events of a batch are
handled here too: an offset that left the source log (retention) is gone past
loudly, never skipped silently. Runs on the loop thread only (delivery reports
come on it too, from the producer's ``poll()``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from ferryman import envelope, topics
from ferryman.config import FlowConfig
from ferryman.errors import SourceDataLostError
from ferryman.health import ClusterHealth
from ferryman.kafka_errors import is_authorization_failure, is_fatal_client_error, record_too_large
from ferryman.kafka_log import RepeatFilter
from ferryman.state import PartitionKey

from ferryman_wrapper._assignment import SourcePartitions
from ferryman_wrapper._clients import LoopClients
from ferryman_wrapper._envelopes import build_envelopes, partition_runs
from ferryman_wrapper._specs import SpecPublisher
from ferryman_wrapper._traces import WrapperTraces

_log = logging.getLogger(__name__)


class DataPath:
    """Consumed records to staging envelopes, and what a consume error means (loop thread only)."""

    def __init__(
        self,
        *,
        parts: SourcePartitions,
        clients: LoopClients,
        specs: Callable[[], SpecPublisher],
        flow: Callable[[], FlowConfig],
        staging_topic: str,
        wrapper_id: str,
        envelope_max_records: int,
        envelope_max_bytes: int,
        staging_max_message_bytes: int,
        source_health: ClusterHealth,
        target_health: ClusterHealth,
        timeout_s: float,
        traces: WrapperTraces | None = None,
    ) -> None:
        """Prepare (nothing is sent before wrap()).

        Args:
            parts: the assigned source partitions (chain, epoch, progress).
            clients: the loop's clients (the current producer and consumer; fatal consumer errors go there).
            specs: the topic spec publisher (a re-created topic is told apart from retention).
            flow: the flow as it is now (the store may change it).
            staging_topic: where envelopes go.
            wrapper_id: identity written into the envelopes.
            envelope_max_records: records per envelope at most.
            envelope_max_bytes: bytes per envelope at most.
            staging_max_message_bytes: the producer's message.max.bytes (named when a record is larger).
            source_health: the source cluster's health (transient consume errors).
            target_health: the staging cluster's health (acknowledged envelopes).
            timeout_s: budget of one admin or metadata call (the source log's watermarks).
            traces: record spans; None when tracing is off (no trace decision is made at all).
        """
        self._parts = parts
        self._clients = clients
        self._specs = specs
        self._flow = flow
        self._staging_topic = staging_topic
        self._wrapper_id = wrapper_id
        self._envelope_max_records = envelope_max_records
        self._envelope_max_bytes = envelope_max_bytes
        self._staging_max = staging_max_message_bytes
        #: Source partitions held at a record too large to stage: the offset held at and the envelope's bytes.
        self._refused: dict[PartitionKey, tuple[int, int]] = {}
        self._refusals = RepeatFilter()
        self._source_health = source_health
        self._target_health = target_health
        self._timeout_s = timeout_s
        self._traces = traces
        self.records_sent = 0
        self.envelopes_sent = 0
        self.source_records_lost = 0
        #: The last source offset counted in source_records_lost, by partition.
        self._lost_through: dict[PartitionKey, int] = {}

    def wrap(self, msgs: Sequence[Message], *, headers: bool) -> None:
        """Wrap a batch of records (no error events); headers: whether one of them may have headers."""
        for (topic, partition), run in partition_runs(msgs).items():
            key = PartitionKey(topic, partition)
            if key not in self._parts.chain:
                continue  # revoked while the batch was in hand
            self._send_run(key, run, headers=headers)

    def _hold_refused(self, key: PartitionKey, size: int, exc: KafkaException) -> None:
        """An envelope too large to stage: hold its partition at its first record; the others go on.

        The partition is paused and sought back to that record, so that whatever resumes it (a backpressure
        resume, a new assignment) reads it again and meets the same refusal: nothing past it is sent, and
        the deduper sees no gap. Only a restart with a larger ``wrapper.staging_max_message_bytes`` moves it.
        """
        held_at = self._parts.chain[key] + 1  # everything before it was produced
        self._refused[key] = (held_at, size)
        tp = TopicPartition(key.topic, key.partition, held_at)
        self._clients.consumer.pause([tp])
        self._clients.consumer.seek(tp)  # also drops what was fetched past it
        repeats = self._refusals.admit(key)
        if repeats is not None:
            again = f" (met {repeats[0]} more times in {repeats[1]:.0f} s)" if repeats[0] else ""
            _log.error(
                "source partition %s is held at offset %d: its envelope of %d bytes is larger than staging takes "
                "(%s); raise wrapper.staging_max_message_bytes (now %d) and the staging topic's max.message.bytes, "
                "then restart the wrapper (the other partitions go on; nothing is skipped)%s",
                key,
                held_at,
                size,
                f"{exc.args[0].name()}: {exc.args[0].str()}" if exc.args else exc,
                self._staging_max,
                again,
            )

    def held(self) -> list[tuple[PartitionKey, int, int]]:
        """The assigned partitions held at a record too large to stage: (partition, offset, envelope bytes)."""
        assigned = self._parts.chain
        return [(k, at, size) for k, (at, size) in sorted(dict(self._refused).items()) if k in assigned]

    def records_only(self, msgs: Sequence[Message]) -> list[Message]:
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
        sp = envelope.staging_partition(key.topic, key.partition, self._flow().staging_partitions)
        produce = self._clients.producer.produce
        traces = self._traces
        traced = traces.start(key.topic, key.partition, run, headers=headers) if traces is not None else None
        for built in build_envelopes(
            run,
            self._parts.sources[key],
            self._parts.chain[key],
            wrapper_id=self._wrapper_id,
            wrapper_epoch=self._parts.epoch[key],
            max_records=self._envelope_max_records,
            max_bytes=self._envelope_max_bytes,
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
                    self._target_health.up()
                elif self._parts.tracker.failed(key):  # once per partition and rewind: an outage fails them all
                    _log.warning("staging write of %s up to offset %d failed: %s; it is sent again", key, last, err)

            while True:
                try:
                    produce(
                        self._staging_topic,
                        value=built.value,
                        key=self._parts.staging_keys[key],
                        partition=sp,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    # Local queue full: serve delivery reports to make room.
                    self._clients.producer.poll(0.05)
                except KafkaException as exc:
                    if record_too_large(exc) is None:
                        raise
                    self._hold_refused(key, len(built.value), exc)
                    return  # the rest of the run is read again once the partition goes on
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
            self._clients.on_consumer_error(err)  # acted on by the loop (LoopClients.check_callbacks)
            return
        key = PartitionKey(str(msg.topic()), msg.partition() or 0)
        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE) and key in self._parts.chain:
            self._continue_after_deleted(key, err)
            return
        self._source_health.client_error(err, "source consumer")

    def _continue_after_deleted(self, key: PartitionKey, err: KafkaError) -> None:
        """The next offset to replicate left the source log (retention): go on from the log start, loudly.

        Never a silent skip: the chain restarts just before the log start, so the
        next envelope shows the deleted range to the deduper as a gap, which it
        holds and reports as lost (a resend answer tells it the source no longer
        has the records) until an operator acknowledges the loss.
        """
        # A topic deleted and re-created under us looks the same from here: its offsets start again at 0.
        specs = self._specs()
        specs.refresh([key.topic])
        if key.topic in specs.recreated:
            _log.warning("source partition %s is out of range (%s): its topic was re-created", key, err.str())
            return  # the loop replaces the consumer, which starts the new topic from its beginning
        low, high = topics.watermark_offsets(self._clients.consumer, key.topic, key.partition, budget_s=self._timeout_s)
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
        self._clients.consumer.incremental_unassign([tp])
        self._clients.consumer.incremental_assign([TopicPartition(key.topic, key.partition, low)])
