"""``DeduperService.TranslateGroupOffsets``: where a consumer group resumes at the destination.

A group's committed offset O at the source is the next record it reads: it has read every record before O
(the last of them, R, is at O - 1 unless transaction markers lie between: the wrapper then says where, as
``last_record_offset``). At the destination it resumes right after the copy of the last replicated record up
to R, so
that every destination record before the translated offset comes from a source record before O and every one
from it on from a source record at or past O (`resolve` says this once, for the unit tests).

Where the last replicated record is: the flow's committed state (every staging partition's, whichever
deduper owns it) names each source partition's watermark W, the highest source offset written, and its
destination offset. A group at or past W needs nothing more; a group behind W needs the flow's offset map,
read once per offset-map partition for all the group's partitions behind (``scan_offset_map``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeAlias

from ferryman import envelope
from ferryman.errors import InvalidRequestError, PreconditionError
from ferryman.group_offsets import commit_group_offsets
from ferryman.naming import FlowNames
from ferryman.state import PartitionKey, decode_watermarks, mapped_source_offsets, read_compacted
from ferryman.v1 import control_pb2, state_pb2

from ferryman_deduper._translate import MAX_BUDGET_S, scan_offset_map

Status: TypeAlias = control_pb2.GroupOffsetStatus.ValueType
TRANSLATED: Status = control_pb2.GROUP_OFFSET_STATUS_TRANSLATED
AHEAD: Status = control_pb2.GROUP_OFFSET_STATUS_AHEAD_OF_REPLICATION
NOT_REPLICATED: Status = control_pb2.GROUP_OFFSET_STATUS_NOT_REPLICATED


@dataclass
class MapLookup:
    """What the offset map says about one source partition, below a target source offset."""

    target: int
    #: Destination offset of the replicated record with the highest source offset <= target.
    below: int | None = None
    #: Destination offset of the partition's first mapped record.
    first: int | None = None
    #: A mapping starting past target was seen: no later mapping changes ``below``.
    done: bool = False

    def visit(self, mapping: state_pb2.OffsetMapping) -> None:
        """Take one mapping of the partition (mappings come in source-offset order)."""
        sources = list(mapped_source_offsets(mapping))
        if not sources:
            return
        if self.first is None:
            self.first = mapping.first_destination_offset
        if sources[0] > self.target:
            self.done = True
            return
        index = max(i for i, s in enumerate(sources) if s <= self.target)
        self.below = mapping.first_destination_offset + index


def last_read(source: control_pb2.GroupOffset) -> int:
    """The offset of the last record the group read: the wrapper's ``last_record_offset``, else offset - 1."""
    return source.last_record_offset if source.HasField("last_record_offset") else source.offset - 1


def resolve(read: int, state: state_pb2.WatermarkState | None, lookup: MapLookup | None) -> tuple[Status, int]:
    """(status, destination offset; -1 when NOT_REPLICATED) after the group's last record read, read.

    state: the flow's committed state of the partition. lookup: the offset map up to read, needed only when
    the group is behind the watermark (``lookup_for``).
    """
    if state is None or state.watermark < 0:
        return NOT_REPLICATED, -1
    if read >= state.watermark and state.destination_offset >= 0:
        return (TRANSLATED if read == state.watermark else AHEAD), state.destination_offset + 1
    if lookup is None:
        return NOT_REPLICATED, -1
    if lookup.below is not None:
        return (TRANSLATED if read <= state.watermark else AHEAD), lookup.below + 1
    if lookup.first is not None:
        return TRANSLATED, lookup.first  # nothing the group read was replicated: from the flow's first record
    return NOT_REPLICATED, -1


def lookup_for(read: int, state: state_pb2.WatermarkState | None) -> MapLookup | None:
    """The offset-map lookup resolve needs for this partition, or None when the state answers alone.

    Its target is the last record the group read, or the watermark when the group is past it: the state was
    read first, so a mapping past the watermark is a later commit's, not part of this answer.
    """
    if state is None or state.watermark < 0:
        return None
    if read >= state.watermark and state.destination_offset >= 0:
        return None
    return MapLookup(min(read, state.watermark))


class GroupTranslator:
    """Answers TranslateGroupOffsets from the destination cluster; safe to call from several gRPC threads."""

    def __init__(
        self,
        *,
        consumer_config: Callable[[], dict[str, object]],
        names: FlowNames,
        staging_partitions: int,
        emits_offset_map: bool,
    ) -> None:
        """Translate from names' state and offset-map topics; commit with consumer_config's cluster.

        Args:
            consumer_config: librdkafka properties of a destination-cluster consumer (a new one per call).
            names: The flow's topic names.
            staging_partitions: Partitions of the staging (state and offset-map) topics.
            emits_offset_map: False when the flow writes no offset map (every call is then refused).
        """
        self._consumer_config = consumer_config
        self._names = names
        self._n = staging_partitions
        self._enabled = emits_offset_map

    def translate(
        self, request: control_pb2.TranslateGroupOffsetsRequest, budget_s: float
    ) -> control_pb2.TranslateGroupOffsetsResponse:
        """The destination positions of the request's committed source offsets.

        Raises:
            InvalidRequestError: a field is out of range (named).
            PreconditionError: the flow writes no offset map.
            KafkaOperationError: the destination cluster did not answer within the budget.
        """
        rows, _ = self._translate(request.group, request.source_offsets, _deadline(budget_s))
        return control_pb2.TranslateGroupOffsetsResponse(group=request.group, offsets=rows)

    def commit(
        self, request: control_pb2.CommitGroupOffsetsRequest, budget_s: float
    ) -> control_pb2.CommitGroupOffsetsResponse:
        """Translate, then commit the destination positions for the group at the destination.

        Raises:
            InvalidRequestError: a field is out of range (named).
            PreconditionError: the flow writes no offset map, the group has members at the destination or a
                partition is not replicated yet (nothing is committed then).
            KafkaOperationError: the destination cluster did not answer within the budget.
        """
        deadline = _deadline(budget_s)
        rows, commits = self._translate(request.group, request.source_offsets, deadline)
        missing = [f"{r.source.topic} [{r.source.partition}]" for r in rows if r.status == NOT_REPLICATED]
        if missing:
            raise PreconditionError(
                f"not replicated yet: {', '.join(missing)}; nothing committed (the group would start those "
                "partitions from its auto.offset.reset at the destination)"
            )
        commit_group_offsets(self._consumer_config(), request.group, commits, _left(deadline))
        return control_pb2.CommitGroupOffsetsResponse(group=request.group, offsets=rows)

    def positions(
        self, group: str, source_offsets: Sequence[control_pb2.GroupOffset], budget_s: float
    ) -> tuple[list[control_pb2.TranslatedGroupOffset], dict[tuple[str, int], int]]:
        """One row per source offset, and the destination offset of each partition replicated (to commit).

        Raises:
            As translate.
        """
        return self._translate(group, source_offsets, _deadline(budget_s))

    def _translate(
        self, group: str, source_offsets: Sequence[control_pb2.GroupOffset], deadline: float
    ) -> tuple[list[control_pb2.TranslatedGroupOffset], dict[tuple[str, int], int]]:
        """One row per source offset, and the destination offsets to commit."""
        _validate(group, source_offsets)
        if not self._enabled:
            raise PreconditionError("this flow writes no offset map (emit_offset_mappings is off)")
        records = read_compacted(
            self._consumer_config(), self._names.state_topic, range(self._n), _left(deadline), settle=True
        )
        states: dict[PartitionKey, state_pb2.WatermarkState] = {}
        for part in records.values():
            states.update(decode_watermarks(part))
        keys = [PartitionKey(o.topic, o.partition) for o in source_offsets]
        lookups = {
            key: lookup
            for key, o in zip(keys, source_offsets, strict=True)
            if (lookup := lookup_for(last_read(o), states.get(key))) is not None
        }
        self._read_map(lookups, deadline)
        rows: list[control_pb2.TranslatedGroupOffset] = []
        commits: dict[tuple[str, int], int] = {}
        for key, source in zip(keys, source_offsets, strict=True):
            state = states.get(key)
            status, offset = resolve(last_read(source), state, lookups.get(key))
            row = control_pb2.TranslatedGroupOffset(
                source=source, status=status, replicated_up_to=state.watermark if state is not None else -1
            )
            if offset >= 0 and state is not None:
                row.destination.CopyFrom(
                    control_pb2.GroupOffset(topic=state.destination_topic, partition=key.partition, offset=offset)
                )
                commits[(state.destination_topic, key.partition)] = offset
            rows.append(row)
        return rows, commits

    def _read_map(self, lookups: dict[PartitionKey, MapLookup], deadline: float) -> None:
        by_partition: dict[int, dict[bytes, MapLookup]] = {}
        for key, lookup in lookups.items():
            prefix = f"{key.topic}/{key.partition}/".encode()
            by_partition.setdefault(envelope.staging_partition(key.topic, key.partition, self._n), {})[prefix] = lookup
        for partition, wanted in sorted(by_partition.items()):
            scan_offset_map(
                self._consumer_config, self._names.offset_map_topic, partition, deadline, partial(_visit, wanted)
            )


def _visit(wanted: dict[bytes, MapLookup], key: bytes, value: bytes) -> bool:
    """Feed one offset-map record to the lookup its key names; True once every lookup is done."""
    prefix, _, first = key.rpartition(b"/")
    lookup = wanted.get(prefix + b"/")
    if lookup is not None and not lookup.done and first.isdigit():
        lookup.visit(state_pb2.OffsetMapping.FromString(value))
    return all(lookup.done for lookup in wanted.values())


def _deadline(budget_s: float) -> float:
    return time.monotonic() + min(max(budget_s, 0.1), MAX_BUDGET_S)


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.1)


def _validate(group: str, source_offsets: Sequence[control_pb2.GroupOffset]) -> None:
    if not group:
        raise InvalidRequestError("group", "must name a consumer group")
    seen: set[tuple[str, int]] = set()
    for i, o in enumerate(source_offsets):
        where = f"source_offsets[{i}]"
        if not o.topic:
            raise InvalidRequestError(f"{where}.topic", "must name a source topic")
        if o.partition < 0:
            raise InvalidRequestError(f"{where}.partition", f"must be >= 0, not {o.partition}")
        if o.offset < 0:
            raise InvalidRequestError(f"{where}.offset", f"must be >= 0, not {o.offset}")
        if o.HasField("last_record_offset") and not -1 <= o.last_record_offset < o.offset:
            raise InvalidRequestError(
                f"{where}.last_record_offset", f"must be below offset ({o.offset}), not {o.last_record_offset}"
            )
        if (o.topic, o.partition) in seen:
            raise InvalidRequestError(f"{where}", f"{o.topic} [{o.partition}] is given twice")
        seen.add((o.topic, o.partition))
