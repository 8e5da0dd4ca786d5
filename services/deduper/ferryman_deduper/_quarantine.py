"""Quarantine: staging records that are not a good envelope of this flow go to the dead-letter topic.

A staging record is checked in this order, and the first failed check names
the reason:

1. ``foreign``: its key is not the ``<topic>/<partition>`` key every wrapper
   writes (someone else wrote to the staging topic);
2. ``unknown_schema_version``: an envelope of a layout newer than this reader;
3. ``checksum_mismatch``: the records do not match the envelope's CRC (bit flips);
4. ``malformed``: the bytes do not parse as an envelope, its records are
   inconsistent (truncation, bit flips in the structure), or its source
   coordinates differ from its staging key (the CRC covers only the records);
5. ``wrong_staging_partition``: a valid envelope on a staging partition its
   source partition does not map to (a wrapper with another
   ``staging_partitions``).

A quarantined record is produced to the flow's dead-letter topic (same
partition number as its staging partition) inside the open transaction, so
it is quarantined exactly once with the staging offsets that pass it. It moves
no watermark: a good copy (a resend) is still accepted, and the envelope after
it shows a gap that asks the wrapper for the records. Logged once per episode
(the first bad record of a staging partition, then a summary when a good
envelope follows), never per record.
"""

from __future__ import annotations

import collections
import enum
import logging
from dataclasses import dataclass, field

from confluent_kafka import Message, Producer
from ferryman import envelope
from ferryman.errors import CorruptEnvelopeError, EnvelopeError, FerrymanError, UnsupportedEnvelopeError
from ferryman.state import PartitionKey

_log = logging.getLogger(__name__)

#: Dead-letter record headers (the contract, also in the README).
HEADER_REASON = "ferryman.dlq.reason"
HEADER_DETAIL = "ferryman.dlq.detail"
HEADER_TOPIC = "ferryman.dlq.staging.topic"
HEADER_PARTITION = "ferryman.dlq.staging.partition"
HEADER_OFFSET = "ferryman.dlq.staging.offset"
HEADER_ORIGINAL_SIZE = "ferryman.dlq.original.size"
#: Room left for the headers when an original value is near the producer's message size limit: the value is
#: then cut to fit (HEADER_ORIGINAL_SIZE tells), rather than a too large record failing every transaction.
DLQ_HEADER_ROOM_BYTES = 64 * 1024


class Reason(enum.StrEnum):
    """Why a staging record was quarantined (the ``ferryman.dlq.reason`` header and the metric label)."""

    FOREIGN = "foreign"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    MALFORMED = "malformed"
    WRONG_STAGING_PARTITION = "wrong_staging_partition"


class RejectedRecordError(FerrymanError):
    """A staging record failed a check (internal to this module and the data path)."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def reason_of(exc: EnvelopeError) -> Reason:
    """The quarantine reason of a decode error."""
    if isinstance(exc, UnsupportedEnvelopeError):
        return Reason.UNKNOWN_SCHEMA_VERSION
    if isinstance(exc, CorruptEnvelopeError):
        return Reason.CHECKSUM_MISMATCH
    return Reason.MALFORMED


def _key_of(raw: bytes | None) -> PartitionKey | None:
    """The source partition a wrapper's staging key names (``<topic>/<partition>``), or None."""
    if not raw:
        return None
    try:
        topic, _, partition = raw.decode().rpartition("/")
        number = int(partition)
    except (UnicodeDecodeError, ValueError):
        return None
    return PartitionKey(topic, number) if topic and number >= 0 and str(number) == partition else None


def check(msg: Message, staging_partitions: int) -> envelope.DecodedEnvelope:
    """Decode a staging record and check it belongs where it was found.

    Raises:
        RejectedRecordError: with the reason to quarantine it.
    """
    key = _key_of(msg.key())
    if key is None:
        raise RejectedRecordError(Reason.FOREIGN, f"staging key {msg.key()!r} is not a wrapper's <topic>/<partition>")
    try:
        env = envelope.decode(msg.value())
    except EnvelopeError as exc:
        raise RejectedRecordError(reason_of(exc), str(exc)) from exc
    src = env.source
    if src.topic != key.topic or src.partition != key.partition:
        raise RejectedRecordError(
            Reason.MALFORMED, f"envelope of {src.topic}-{src.partition} under the staging key of {key} (altered)"
        )
    expected = envelope.staging_partition(src.topic, src.partition, staging_partitions)
    if expected != msg.partition():
        raise RejectedRecordError(
            Reason.WRONG_STAGING_PARTITION,
            f"envelope of {key} on staging partition {msg.partition()}, expected {expected}: a wrapper with "
            f"another staging_partitions setting wrote it",
        )
    return env


@dataclass
class _Episode:
    """Bad records of one staging partition since its last good envelope."""

    first_offset: int
    last_offset: int = -1
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)


class Quarantine:
    """Produces rejected staging records to the dead-letter topic and counts them (loop thread only)."""

    def __init__(self, *, staging_topic: str, dlq_topic: str, max_message_bytes: int) -> None:
        self._staging_topic = staging_topic
        self.dlq_topic = dlq_topic
        self._max_value_bytes = max_message_bytes - DLQ_HEADER_ROOM_BYTES
        self.counts: collections.Counter[str] = collections.Counter()
        """Records quarantined since start, by reason (a rewind re-reads and counts them again)."""
        self._episodes: dict[int, _Episode] = {}

    def put(self, producer: Producer, msg: Message, rejected: RejectedRecordError) -> None:
        """Produce msg to the dead-letter topic with the reason (inside the caller's open transaction)."""
        sp, offset = msg.partition(), msg.offset()
        assert sp is not None
        assert offset is not None
        value = msg.value() or b""
        headers: list[tuple[str, str | bytes | None]] = [
            (HEADER_REASON, rejected.reason.value.encode()),
            (HEADER_DETAIL, rejected.detail.encode()[:1024]),
            (HEADER_TOPIC, self._staging_topic.encode()),
            (HEADER_PARTITION, str(sp).encode()),
            (HEADER_OFFSET, str(offset).encode()),
            (HEADER_ORIGINAL_SIZE, str(len(value)).encode()),
        ]
        original = msg.headers()  # a consumed record's headers are a list of pairs
        if isinstance(original, list):
            headers.extend(original)
        producer.produce(
            self.dlq_topic, value=value[: self._max_value_bytes], key=msg.key(), partition=sp, headers=headers
        )
        self.counts[rejected.reason.value] += 1
        episode = self._episodes.get(sp)
        if episode is None:
            episode = self._episodes[sp] = _Episode(first_offset=offset)
            _log.error(
                "staging record %s-%d@%d quarantined to %s (%s): %s. Nothing of it is written to the destination; "
                "the partition keeps flowing (further bad records are summed up when a good envelope follows)",
                self._staging_topic,
                sp,
                offset,
                self.dlq_topic,
                rejected.reason.value,
                rejected.detail,
            )
        episode.last_offset = offset
        episode.reasons[rejected.reason.value] += 1

    def good(self, sp: int) -> None:
        """A good envelope was read from staging partition sp: an open episode ends (one summary line)."""
        episode = self._episodes.pop(sp, None) if self._episodes else None
        if episode is not None:
            _log.warning(
                "staging partition %s-%d flows again: %d record(s) at offsets %d..%d quarantined to %s (%s)",
                self._staging_topic,
                sp,
                episode.reasons.total(),
                episode.first_offset,
                episode.last_offset,
                self.dlq_topic,
                ", ".join(f"{r}: {n}" for r, n in sorted(episode.reasons.items())),
            )
