"""Options of the ``ferryman-kafka`` data source, parsed once on the driver.

Spark hands a Python data source its options as a case-insensitive mapping of
strings; they are checked here, so a typo fails the read at once with the
option's name instead of being ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ferryman_auditor.kafka_source._errors import KafkaSourceError

#: The name the source is registered under (``spark.read.format(NAME)``).
NAME = "ferryman-kafka"

#: Prefix of options passed through to librdkafka as they are (``kafka.security.protocol``).
KAFKA_PREFIX = "kafka."

#: Offsets of a span split into input partitions of at most this many offsets. A
#: million 100-byte records read in a couple of seconds here, so a split is a
#: task of seconds: small enough to spread, large enough that task start-up
#: (~10-50 ms in local mode) stays a small share.
DEFAULT_MAX_OFFSETS_PER_SPLIT = 1_000_000
#: An executor gives up on a split after this long without reading anything new.
#: Fetches answer within fetch.wait.max.ms; a minute without progress is a broker
#: down or a partition without a leader, not a slow read.
DEFAULT_STALL_TIMEOUT_MS = 60_000
#: Driver-side budget of one metadata or offset request (watermarks, offsets for times).
DEFAULT_REQUEST_TIMEOUT_MS = 30_000

#: Start or end of a partition's range: ``earliest``, ``latest`` or an offset.
Bound = Literal["earliest", "latest"] | int

_KNOWN = frozenset(
    {
        "bootstrap.servers",
        "topic",
        "partitions",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "isolation.level",
        "maxoffsetspersplit",
        "stalltimeoutms",
        "requesttimeoutms",
    }
)


@dataclass(frozen=True)
class BoundSpec:
    """Where every partition's range starts (or ends): one default, per-partition overrides, or a time."""

    default: Bound
    """The bound of partitions not named in ``per_partition``."""
    per_partition: Mapping[int, Bound] = field(default_factory=dict)
    """Bounds of named partitions."""
    timestamp_ms: int | None = None
    """When set, the first offset whose timestamp is at or after this time (ms since the epoch) wins."""

    def of(self, partition: int) -> Bound:
        """The offset bound of one partition (when no timestamp is set)."""
        return self.per_partition.get(partition, self.default)


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one read."""

    topic: str
    """The topic to read."""
    partitions: tuple[int, ...] | None
    """Partitions to read; None: every partition of the topic."""
    start: BoundSpec
    """Start of each partition's range (inclusive)."""
    end: BoundSpec
    """End of each partition's range (exclusive)."""
    kafka_config: Mapping[str, str]
    """librdkafka properties of every consumer of the read (bootstrap.servers, isolation.level, ``kafka.*``)."""
    max_offsets_per_split: int = DEFAULT_MAX_OFFSETS_PER_SPLIT
    """Largest offset span of one input partition."""
    stall_timeout_ms: int = DEFAULT_STALL_TIMEOUT_MS
    """How long an executor waits without reading anything before failing its split."""
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    """Budget of one driver-side metadata or offset request."""


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check and parse the options of a read.

    Raises:
        KafkaSourceError: an option is missing, unknown or malformed (the message names it).
    """
    opts = {k.lower(): str(v) for k, v in options.items() if k.lower() != "path"}
    unknown = sorted(k for k in opts if k not in _KNOWN and not k.startswith(KAFKA_PREFIX))
    if unknown:
        raise KafkaSourceError(
            f"unknown option(s) {', '.join(unknown)}; librdkafka properties take the prefix {KAFKA_PREFIX!r}"
        )
    for required in ("bootstrap.servers", "topic"):
        if not opts.get(required):
            raise KafkaSourceError(f"option {required!r} is required")
    isolation = opts.get("isolation.level", "read_committed")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise KafkaSourceError(f"isolation.level must be read_committed or read_uncommitted, not {isolation!r}")
    kafka_config = {k[len(KAFKA_PREFIX) :]: v for k, v in opts.items() if k.startswith(KAFKA_PREFIX)}
    kafka_config.update({"bootstrap.servers": opts["bootstrap.servers"], "isolation.level": isolation})
    return SourceOptions(
        topic=opts["topic"],
        partitions=_partitions(opts.get("partitions")),
        start=_bound_spec(opts, "startingoffsets", "startingtimestamp", "earliest"),
        end=_bound_spec(opts, "endingoffsets", "endingtimestamp", "latest"),
        kafka_config=kafka_config,
        max_offsets_per_split=_positive(opts, "maxoffsetspersplit", DEFAULT_MAX_OFFSETS_PER_SPLIT),
        stall_timeout_ms=_positive(opts, "stalltimeoutms", DEFAULT_STALL_TIMEOUT_MS),
        request_timeout_ms=_positive(opts, "requesttimeoutms", DEFAULT_REQUEST_TIMEOUT_MS),
    )


def _partitions(raw: str | None) -> tuple[int, ...] | None:
    if raw is None or not raw.strip():
        return None
    try:
        parts = sorted({int(p) for p in raw.split(",") if p.strip()})
    except ValueError as exc:
        raise KafkaSourceError(f"partitions must be a comma-separated list of numbers, not {raw!r}") from exc
    if any(p < 0 for p in parts):
        raise KafkaSourceError(f"partitions must not be negative: {raw!r}")
    return tuple(parts)


def _bound(value: object, name: str) -> Bound:
    """A bound from JSON or option text: earliest/latest (or Spark's -2/-1), or an offset."""
    if value in ("earliest", -2, "-2"):
        return "earliest"
    if value in ("latest", -1, "-1"):
        return "latest"
    try:
        offset = int(str(value))
    except (TypeError, ValueError) as exc:
        raise KafkaSourceError(f"{name}: {value!r} is not earliest, latest or an offset") from exc
    if offset < 0:
        raise KafkaSourceError(f"{name}: offset {offset} is negative")
    return offset


def _bound_spec(opts: Mapping[str, str], offsets_key: str, timestamp_key: str, default: Bound) -> BoundSpec:
    raw_ts = opts.get(timestamp_key)
    if raw_ts is not None:
        if offsets_key in opts:
            raise KafkaSourceError(f"give {offsets_key} or {timestamp_key}, not both")
        try:
            return BoundSpec(default=default, timestamp_ms=int(raw_ts))
        except ValueError as exc:
            raise KafkaSourceError(f"{timestamp_key} must be milliseconds since the epoch, not {raw_ts!r}") from exc
    raw = opts.get(offsets_key)
    if raw is None:
        return BoundSpec(default=default)
    text = raw.strip()
    if not text.startswith("{"):
        return BoundSpec(default=_bound(text, offsets_key))
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KafkaSourceError(f"{offsets_key} is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise KafkaSourceError(f"{offsets_key} must be a JSON object of partition: offset")
    try:
        per_partition = {int(p): _bound(o, offsets_key) for p, o in parsed.items()}
    except ValueError as exc:
        raise KafkaSourceError(f"{offsets_key}: partition numbers must be integers ({exc})") from exc
    return BoundSpec(default=default, per_partition=per_partition)


def _positive(opts: Mapping[str, str], key: str, default: int) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise KafkaSourceError(f"{key} must be a positive integer, not {raw!r}") from exc
    if value <= 0:
        raise KafkaSourceError(f"{key} must be a positive integer, not {raw!r}")
    return value
