"""The deduper's data path: a staging envelope to destination records, inside the open transaction.

Decode (the compiled codec where built), decide by the dedup rule
(``_decide``), write accepted records to the destination byte for byte on the
source's partition number, account for gaps, and at commit time write the
transaction's offset mappings and watermarks. Runs on the loop thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from ferryman import envelope, rowproduce
from ferryman.config import AcknowledgedLoss, FlowConfig
from ferryman.errors import EnvelopeError
from ferryman.kafka_errors import record_refused
from ferryman.naming import FlowNames
from ferryman.state import PartitionKey, offset_mapping
from ferryman.v1 import envelope_pb2, state_pb2

from ferryman_deduper import _quarantine as quarantine
from ferryman_deduper._decide import PartitionState, Verdict, decide
from ferryman_deduper._destinations import DestinationTopics
from ferryman_deduper._gaps import Filled, GapTracker
from ferryman_deduper._partitions import StagingPartitions
from ferryman_deduper._traces import DeduperTraces
from ferryman_deduper._transaction import Slice, Transaction

_log = logging.getLogger(__name__)


@dataclass
class PartitionCounters:
    """Data-path figures of one source partition since start (status: per-partition lag and replays)."""

    duplicates_dropped: int = 0
    #: Source timestamp of the last record written (committed or in the open transaction), -1 if none.
    written_timestamp_ms: int = -1


@dataclass
class DeduperStats:
    """Data-path counters since start (transactions: ``Transaction.stats``)."""

    envelopes: int = 0
    records_written: int = 0
    duplicates_dropped: int = 0
    gaps_detected: int = 0
    stale_topic_envelopes: int = 0
    topics_recreated: int = 0
    gaps_healed: int = 0
    acknowledged_lost_records: int = 0
    rewinds: int = 0
    by_partition: dict[PartitionKey, PartitionCounters] = field(default_factory=dict)

    def partition(self, key: PartitionKey) -> PartitionCounters:
        """Key's counters (created at first use)."""
        counters = self.by_partition.get(key)
        if counters is None:
            counters = self.by_partition[key] = PartitionCounters()
        return counters


class DataPath:
    """Staging envelopes to destination records, exactly once (with the open transaction)."""

    def __init__(
        self,
        *,
        flow: FlowConfig,
        names: FlowNames,
        instance_id: str,
        txn: Transaction,
        parts: StagingPartitions,
        gaps: GapTracker,
        destinations: DestinationTopics,
        stats: DeduperStats,
        recovering: Callable[[], bool],
        dead_letters: quarantine.Quarantine,
        traces: DeduperTraces | None = None,
    ) -> None:
        self._flow = flow
        self._names = names
        self._instance_id = instance_id
        self._txn = txn
        self._parts = parts
        self._gaps = gaps
        self._destinations = destinations
        self.stats = stats
        self._recovering = recovering
        self._quarantine = dead_letters
        self._acknowledged: dict[PartitionKey, list[AcknowledgedLoss]] = {}
        for loss in flow.acknowledged_losses:
            self._acknowledged.setdefault(PartitionKey(loss.topic, loss.partition), []).append(loss)
        #: Record spans (None: tracing off); the staging record being applied, for their attributes.
        self.traces = traces
        self._staging_at: tuple[int, int | None] = (-1, None)

    def process(self, msg: Message) -> None:
        """One consumed staging record: decode, decide, write (inside the open transaction)."""
        err = msg.error()
        sp = msg.partition()
        if err is not None:
            return  # handed over when the batch was consumed (StagingPartitions.note_errors)
        if sp is None or sp not in self._parts.owned or sp in self._parts.holds.paused:
            return  # held: fetched before the pause, read again by the probe from the committed offset
        self._txn.begin()
        offset = msg.offset()
        assert offset is not None
        self._txn.next_offsets[sp] = offset + 1
        self._parts.note_position(sp, offset)
        self.stats.envelopes += 1
        try:
            env = quarantine.check(msg, self._flow.staging_partitions)
        except quarantine.RejectedRecordError as rejected:
            # No watermark moves: a good copy (a resend) is still accepted.
            self._quarantine.put(self._txn.producer, msg, rejected)
            return
        self._quarantine.good(sp)
        self._staging_at = (sp, offset)
        self._apply(PartitionKey(env.source.topic, env.source.partition), env, resent=False)

    def process_resent(self, env_msg: envelope_pb2.Envelope) -> None:
        """An envelope that came over the control link in answer to a resend request."""
        try:
            env = envelope.verify(env_msg)
        except EnvelopeError as exc:
            self._quarantine.counts[quarantine.reason_of(exc).value] += 1
            _log.error("resent envelope rejected (it is asked for again while the gap is open): %s", exc)
            return
        key = PartitionKey(env.source.topic, env.source.partition)
        sp = envelope.staging_partition(key.topic, key.partition, self._flow.staging_partitions)
        if sp not in self._parts.owned or sp in self._parts.holds.paused or self._recovering():
            return  # another deduper owns it now, it is held, or we are rewinding; it will be asked for again
        self._txn.begin()
        self._staging_at = (sp, None)
        self._apply(key, env, resent=True)

    def _apply(self, key: PartitionKey, env: envelope.DecodedEnvelope, *, resent: bool) -> None:
        """Decide on one envelope and act on the verdict (inside the open transaction)."""
        src = env.source
        state = self._txn.pending.get(key) or self._parts.committed.get(key)
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
            self._txn.pending[key] = d.new_state
            self._parts.cluster_ids[key] = src.cluster_id
        verdict = d.verdict
        if verdict is Verdict.ACCEPT:
            self._write(key, src, env.run, d.start, env)
            self.stats.partition(key).written_timestamp_ms = env.run.timestamps_ms[-1]
            assert d.new_state is not None  # an ACCEPT always moves the watermark
            self._fill_gap(key, d.new_state.watermark, resent=resent)
        elif verdict is Verdict.DUPLICATE:
            self.stats.duplicates_dropped += len(env.run)
            self.stats.partition(key).duplicates_dropped += len(env.run)
        elif verdict is Verdict.GAP:
            if self._skip_acknowledged(key, src, d.missing_from, d.missing_to):
                self._apply(key, env, resent=resent)  # decided again past the acknowledged loss
                return
            self.stats.gaps_detected += 1
            self._note_gap(key, src, d.missing_from, max(d.missing_to, env.last_offset))
            if key not in self._txn.pending:
                # The state is written in this transaction, with the gap (``_produce_state``): the staging
                # offset that revealed it is committed with it, and a restore asks for the gap again.
                self._txn.pending[key] = state if state is not None else PartitionState(topic_id=src.topic_id)
                self._parts.cluster_ids[key] = src.cluster_id
        elif verdict is Verdict.STALE_TOPIC:
            self.stats.stale_topic_envelopes += 1

    def _skip_acknowledged(
        self, key: PartitionKey, src: envelope_pb2.SourcePartition, missing_from: int, missing_to: int
    ) -> bool:
        """Move key's watermark past the start of a gap that an operator acknowledged as lost; True if it moved.

        Only records flows[].acknowledged_losses names are skipped, and only when a gap shows them missing.
        """
        through = max((a.through_offset for a in self._acknowledged.get(key, ())), default=-1)
        if through < missing_from:
            return False
        skip_to = min(through, missing_to)
        state = self._txn.pending.get(key) or self._parts.committed.get(key)
        topic_id = state.topic_id if state is not None else src.topic_id
        retired = set(state.retired_topic_ids) if state is not None else set()
        self._txn.pending[key] = PartitionState(skip_to, topic_id, retired)
        self._parts.cluster_ids[key] = src.cluster_id
        self.stats.acknowledged_lost_records += skip_to - missing_from + 1
        _log.error(
            "acknowledged loss: records %d..%d of source partition %s skipped (flows[%s].acknowledged_losses: %s)",
            missing_from,
            skip_to,
            key,
            self._flow.name,
            "; ".join(a.note for a in self._acknowledged[key] if a.note) or "no note",
        )
        return True

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
                "; asking the wrapper to resend them",
            )

    def _write(
        self,
        key: PartitionKey,
        src: envelope_pb2.SourcePartition,
        run: envelope.RecordRun,
        start: int,
        env: envelope.DecodedEnvelope,
    ) -> None:
        """Produce run[start:] to the destination, on the source's partition number, byte for byte.

        Traced records (tracing on, and named by env.record_traces) also carry a ``traceparent`` (``_traces``).
        """
        dest = self._destinations.resolve(src)
        self._parts.dest_topics[key] = dest
        partition = src.partition
        count = len(run) - start
        headers = run.header_column()
        if self.traces is not None and env.record_traces:
            sp, staging_offset = self._staging_at
            headers = self.traces.written(
                env, start, destination=dest, staging_partition=sp, staging_offset=staging_offset, headers=headers
            )
        columns: list[Sequence[Any]] = [run.values, run.keys, run.timestamps_ms]
        if headers is not None:
            columns.append(headers)
        try:
            self._produce(key, src, run, start, dest=dest, columns=columns)
        except KafkaException as exc:  # refused at produce() (over deduper.max_message_bytes): name where
            err = record_refused(exc)
            if err is not None:
                self._txn.refused_at(dest, partition, err.str())
            raise
        self._txn.timestamps.append((run.timestamps_ms, start))
        self._txn.records += count
        self.stats.records_written += count

    def _produce(
        self,
        key: PartitionKey,
        src: envelope_pb2.SourcePartition,
        run: envelope.RecordRun,
        start: int,
        *,
        dest: str,
        columns: list[Sequence[Any]],
    ) -> None:
        """Hand run[start:] to the producer (with the offset map's two delivery callbacks when the flow has one)."""
        producer, direct = self._txn.producer, self._txn.direct
        partition, count = src.partition, len(run) - start
        if not self._flow.emit_offset_mappings:
            rowproduce.produce_run(producer, dest, partition, columns, start=start, n=count, direct=direct)
            return
        # Only the first and last record of a run carry a delivery callback:
        # the offset map needs just those two destination offsets.
        slc = Slice(key, src, dest, run.offsets[start:] if start else run.offsets)
        self._txn.slices.append(slc)
        first_cb = self._slice_callback(slc, first=True, last=count == 1)
        rowproduce.produce_row(producer, dest, partition, tuple(c[start] for c in columns), first_cb)
        if count > 1:
            rowproduce.produce_run(producer, dest, partition, columns, start=start + 1, n=count - 2, direct=direct)
            last_row = tuple(c[start + count - 1] for c in columns)
            last_cb = self._slice_callback(slc, first=False, last=True)
            rowproduce.produce_row(producer, dest, partition, last_row, last_cb)

    def _slice_callback(self, slc: Slice, *, first: bool, last: bool) -> Any:
        txn = self._txn

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                # The cause, not the purge of the rest of the transaction it failed (a report that may come last).
                if txn.delivery_error is None or txn.delivery_error.code() == KafkaError._PURGE_QUEUE:
                    txn.delivery_error = err
                    txn.refused_at(str(msg.topic()), int(msg.partition() or 0), err.str())
                return
            off = msg.offset()
            if off is None:
                return
            if first:
                slc.first_destination_offset = off
            if last:
                slc.last_destination_offset = off

        return on_delivery

    def write_state(self) -> None:
        """Produce the open transaction's offset mappings, then its watermarks (its commit calls this)."""
        # Mappings first: they learn the destination offset each state record names.
        self._produce_mappings()
        self._produce_state()

    def _produce_state(self) -> None:
        now_ms = int(time.time() * 1000)
        n = self._flow.staging_partitions
        parts = self._parts
        for key, st in self._txn.pending.items():
            value = state_pb2.WatermarkState(
                watermark=st.watermark,
                topic_id=st.topic_id,
                retired_topic_ids=sorted(st.retired_topic_ids),
                # Learnt from the offset map's delivery reports: without the map, never, so -1 (unknown).
                destination_offset=parts.last_dest_offset.get(key, -1),
                destination_topic=parts.dest_topics.get(key, ""),
                updated_at_ms=now_ms,
                deduper_id=self._instance_id,
            )
            gap = self._gaps.get(key)
            if gap is not None and gap.missing_to > st.watermark:
                value.gap_to = gap.missing_to
            self._txn.producer.produce(
                self._names.state_topic,
                key=key.encode(parts.cluster_ids.get(key, "")),
                value=value.SerializeToString(),
                partition=envelope.staging_partition(key.topic, key.partition, n),
            )

    def _produce_mappings(self) -> None:
        """One offset-map record per run of a source partition's records at consecutive destination offsets.

        A transaction holds one slice per envelope, and at many partitions a streaming wrapper sends
        envelopes of a few records each (a consume batch spread over hundreds of partitions): a record per
        slice made the map cost a record per envelope. Slices of one source partition that continue each
        other at the destination (the usual case: one producer, one partition, in order) merge into one
        record; readers take mappings of any length (``mapped_source_offsets``), in order per partition.
        """
        n = self._flow.staging_partitions
        runs: dict[PartitionKey, list[_MapRun]] = {}
        for slc in self._txn.slices:
            count = len(slc.source_offsets)
            if slc.last_destination_offset >= 0:
                # Slices of a key come in order: the last one ends at the key's new watermark.
                self._parts.last_dest_offset[slc.key] = slc.last_destination_offset
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
            key_runs = runs.setdefault(slc.key, [])
            if not (key_runs and key_runs[-1].extend(slc)):
                key_runs.append(_MapRun(slc))
        for key, key_runs in runs.items():
            partition = envelope.staging_partition(key.topic, key.partition, n)
            for run in key_runs:
                offsets = run.source_offsets()
                mapping = offset_mapping(run.source, run.destination_topic, run.first_destination_offset, offsets)
                self._txn.producer.produce(
                    self._names.offset_map_topic,
                    key=f"{key.topic}/{key.partition}/{offsets[0]}".encode(),
                    value=mapping.SerializeToString(),
                    partition=partition,
                )


class _MapRun:
    """Slices of one source partition at consecutive destination offsets: one offset-map record."""

    def __init__(self, slc: Slice) -> None:
        self.source = slc.source
        self.destination_topic = slc.destination_topic
        self.first_destination_offset = slc.first_destination_offset
        self.last_destination_offset = slc.last_destination_offset
        self._pieces: list[Sequence[int]] = [slc.source_offsets]

    def extend(self, slc: Slice) -> bool:
        """Take slc if it continues this run at the destination (same topic, next offset); False otherwise."""
        if (
            slc.destination_topic != self.destination_topic
            or slc.first_destination_offset != self.last_destination_offset + 1
            or slc.source.topic_id != self.source.topic_id
            or slc.source_offsets[0] <= self._pieces[-1][-1]
        ):
            return False
        self._pieces.append(slc.source_offsets)
        self.last_destination_offset = slc.last_destination_offset
        return True

    def source_offsets(self) -> Sequence[int]:
        """The run's source offsets, as a range when they have no hole (the map then stores two numbers)."""
        pieces = self._pieces
        if len(pieces) == 1:
            return pieces[0]
        first, last = pieces[0][0], pieces[-1][-1]
        total = sum(map(len, pieces))
        if last - first == total - 1:
            return range(first, last + 1)
        return [o for piece in pieces for o in piece]
