"""``DeduperService.TranslateOffsets``: a source position to its destination offset, from the offset map.

The deduper writes one offset-map record per run of records it commits
(``ferryman.state.offset_mapping``), keyed ``<topic>/<partition>/<first source
offset>``, on the offset-map partition numbered like the source partition's
staging partition, inside the same transaction as the records. A lookup reads
that one partition ``read_committed`` from its start and stops at the first
mapping of the source partition that starts past the offset asked (mappings of
one source partition come in source-offset order). It costs a read of the
partition up to that point: fine for an operator's question, not for a hot path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from ferryman import envelope
from ferryman.errors import InvalidRequestError, KafkaOperationError, NotFoundError, PreconditionError
from ferryman.naming import FlowNames
from ferryman.state import PartitionKey, mapped_source_offsets
from ferryman.topics import watermark_offsets
from ferryman.v1 import control_pb2, state_pb2

_log = logging.getLogger(__name__)

#: Longest a lookup may read, whatever the caller's deadline: a person is waiting.
MAX_BUDGET_S = 30.0
#: Records fetched per consume() call while scanning the map.
_BATCH = 500


class OffsetTranslator:
    """Answers TranslateOffsets from the destination cluster; safe to call from several gRPC threads."""

    def __init__(
        self,
        *,
        consumer_config: Callable[[], dict[str, object]],
        names: FlowNames,
        staging_partitions: int,
        emits_offset_map: bool,
        committed_watermark: Callable[[PartitionKey], int | None],
    ) -> None:
        """Look positions up in names' offset-map topic.

        Args:
            consumer_config: librdkafka properties of a destination-cluster consumer (a new one per lookup).
            names: The flow's topic names.
            staging_partitions: Partitions of the staging (and offset-map) topic.
            emits_offset_map: False when the flow writes no offset map (every lookup is then refused).
            committed_watermark: The committed watermark of a source partition this deduper owns, else None.
        """
        self._consumer_config = consumer_config
        self._names = names
        self._n = staging_partitions
        self._enabled = emits_offset_map
        self._committed = committed_watermark

    def translate(
        self, request: control_pb2.TranslateOffsetsRequest, budget_s: float
    ) -> control_pb2.TranslateOffsetsResponse:
        """The destination position of the request's source position.

        Raises:
            InvalidRequestError: a field is out of range (named).
            PreconditionError: the flow writes no offset map.
            NotFoundError: the position is not replicated yet, or has no mapping.
            KafkaOperationError: the destination cluster did not answer within the budget.
        """
        if not request.topic:
            raise InvalidRequestError("topic", "must name a source topic")
        if request.partition < 0:
            raise InvalidRequestError("partition", f"must be >= 0, not {request.partition}")
        if request.offset < 0:
            raise InvalidRequestError("offset", f"must be >= 0, not {request.offset}")
        if not self._enabled:
            raise PreconditionError("this flow writes no offset map (emit_offset_mappings is off)")
        key = PartitionKey(request.topic, request.partition)
        where = f"{request.topic} [{request.partition}] offset {request.offset}"
        watermark = self._committed(key)
        if watermark is not None and request.offset > watermark:
            raise NotFoundError(f"{where} is not replicated yet (committed up to offset {watermark})")
        deadline = time.monotonic() + min(max(budget_s, 0.1), MAX_BUDGET_S)
        mapping = self._find(key, request.offset, deadline)
        if mapping is None:
            raise NotFoundError(f"{where} has no offset mapping (not replicated yet, or not by this flow)")
        index = list(mapped_source_offsets(mapping)).index(request.offset)
        return control_pb2.TranslateOffsetsResponse(
            source_topic=request.topic,
            source_partition=request.partition,
            source_offset=request.offset,
            destination_topic=mapping.destination_topic,
            destination_partition=mapping.destination_partition,
            destination_offset=mapping.first_destination_offset + index,
        )

    def _find(self, key: PartitionKey, offset: int, deadline: float) -> state_pb2.OffsetMapping | None:
        prefix = f"{key.topic}/{key.partition}/".encode()
        found: list[state_pb2.OffsetMapping] = []

        def visit(k: bytes, value: bytes) -> bool:
            done, mapping = _match(k, value, prefix, offset)
            if mapping is not None:
                found.append(mapping)
            return done

        partition = envelope.staging_partition(key.topic, key.partition, self._n)
        scan_offset_map(self._consumer_config, self._names.offset_map_topic, partition, deadline, visit)
        return found[0] if found else None


def scan_offset_map(
    consumer_config: Callable[[], dict[str, object]],
    topic: str,
    partition: int,
    deadline: float,
    visit: Callable[[bytes, bytes], bool],
) -> None:
    """Read one offset-map partition ``read_committed`` from its start, handing each record to visit.

    Stops when visit returns True or at the partition's end (its last stable offset when the read starts).

    Raises:
        KafkaOperationError: the partition could not be read to that point before deadline (monotonic).
    """
    conf = {
        **consumer_config(),
        "group.id": "ferryman-translate",  # never joined nor committed: assign() only
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }
    consumer = Consumer(conf)
    try:
        low, high = watermark_offsets(consumer, topic, partition, budget_s=max(deadline - time.monotonic(), 0.1))
        if high <= low:
            return
        consumer.assign([TopicPartition(topic, partition, low)])
        while time.monotonic() < deadline:
            for msg in consumer.consume(_BATCH, timeout=min(0.5, max(deadline - time.monotonic(), 0.0))):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaOperationError(f"reading {topic} [{partition}]", KafkaException(error))
                key, value = msg.key(), msg.value()
                if key is not None and value is not None and visit(key, value):
                    return
                if (msg.offset() or 0) >= high - 1:
                    return
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= high:
                return
        raise KafkaOperationError(
            f"reading {topic} [{partition}]", TimeoutError("the offset map was not read within the deadline")
        )
    except KafkaException as exc:
        raise KafkaOperationError(f"reading {topic} [{partition}]", exc) from exc
    finally:
        consumer.close()


def _match(key: bytes, value: bytes, prefix: bytes, offset: int) -> tuple[bool, state_pb2.OffsetMapping | None]:
    """(True, the mapping holding offset), (True, None) when no later record can hold it, (False, None) to read on."""
    if not key.startswith(prefix):
        return False, None
    first = key[len(prefix) :]
    if not first.isdigit():
        return False, None
    if int(first) > offset:
        return True, None  # mappings of a source partition come in order: none later holds offset
    mapping = state_pb2.OffsetMapping()
    mapping.ParseFromString(value)
    if offset in mapped_source_offsets(mapping):
        return True, mapping
    return False, None
