"""Topic administration shared by the services: describe, create, grow, configs.

Thin typed wrappers over confluent-kafka's AdminClient futures; every call
takes an explicit timeout and foreign errors surface as KafkaException (for
classification) or as Ferryman errors where the meaning is ours.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from ferryman import controller
from ferryman.errors import KafkaOperationError, TopicShapeError
from ferryman.kafka_errors import authorization_error, retry_retriable

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: Budget of the metadata request that refreshes a partition librdkafka calls unknown (one round trip).
_METADATA_REFRESH_S = 5.0
#: How often settled_ends asks for the last stable offsets again; a wait longer than _SETTLE_LOG_S is logged.
_SETTLE_POLL_S = 0.02
_SETTLE_LOG_S = 0.1
#: The least time given to one ask for offsets in settled_ends.
_SETTLE_ASK_MIN_S = 2.0
#: The longest one ask of committed_ranges waits before asking again (within its budget).
_RANGES_ASK_S = 5.0


def answer(future: concurrent.futures.Future[T], timeout_s: float, what: str, *, admin: AdminClient | None = None) -> T:
    """An admin future's result within timeout_s.

    admin: the client of a request sent to the controller: its metadata is refreshed every
    `controller.CONTROLLER_WAIT_S` while the request waits, so that it follows a controller that is gone
    (`ferryman.controller`; right after a kill, a refresh may still name the dead node).

    Raises:
        KafkaOperationError: no answer in time (a transient fault: the cluster is slow or away), with
            ``concurrent.futures.TimeoutError`` as its cause. Left bare, that error is no Kafka or
            Ferryman error, and a service loop would exit on it instead of waiting it out.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while admin is not None and deadline - time.monotonic() > controller.CONTROLLER_WAIT_S:
            try:
                return future.result(timeout=controller.CONTROLLER_WAIT_S)
            except concurrent.futures.TimeoutError:
                controller.refresh(admin)
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError as exc:
        raise KafkaOperationError(f"{what}: no answer within {round(timeout_s, 2):g} s", exc) from exc


#: Topic configs never copied to the destination: broker-specific or
#: destination-policy settings (MirrorMaker 2's DefaultConfigPropertyFilter).
#: message.timestamp.type is among them: destination records keep the source
#: timestamp as their CreateTime.
EXCLUDED_TOPIC_CONFIGS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"follower\.replication\.throttled\.replicas",
        r"leader\.replication\.throttled\.replicas",
        r"message\.timestamp\.difference\.max\.ms",
        r"message\.timestamp\.before\.max\.ms",
        r"message\.timestamp\.after\.max\.ms",
        r"message\.timestamp\.type",
        r"unclean\.leader\.election\.enable",
        r"min\.insync\.replicas",
    )
)


@dataclass(frozen=True)
class TopicInfo:
    """What Ferryman needs to know about a topic."""

    name: str
    topic_id: bytes
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)


def watermark_offsets(consumer: Consumer, topic: str, partition: int, *, budget_s: float) -> tuple[int, int]:
    """A partition's (low, high) offsets as consumer sees them.

    High is the last stable offset for a read_committed consumer. A topic created
    a moment ago may have no leader yet; such errors come from this call with the
    code only, and are retried within budget_s (``retry_retriable``).

    An unknown partition is asked for afresh before the next try: librdkafka answers
    it from its metadata cache, which a broker's first answer after a freeze can leave
    without the topic's partitions for good (a CI run: a deduper's restore consumer
    got ``_UNKNOWN_PARTITION`` for its whole 30 s budget after the destination broker
    thawed; a new consumer read the same partitions at once).
    """
    tp = TopicPartition(topic, partition)

    def ask() -> tuple[int, int]:
        try:
            return consumer.get_watermark_offsets(tp, timeout=budget_s)
        except KafkaException as exc:
            if _has_code(exc, KafkaError._UNKNOWN_PARTITION):
                _refresh_metadata(consumer, (topic,), timeout_s=min(budget_s, _METADATA_REFRESH_S))
            raise

    return retry_retriable(ask, what=f"reading the offsets of {topic} [{partition}]", budget_s=budget_s)


def settled_ends(
    consumer_config: Mapping[str, object],
    consumer: Consumer,
    partitions: Sequence[tuple[str, int]],
    deadline: float,
) -> dict[tuple[str, int], tuple[int, int]]:
    """Each (topic, partition)'s (low, last stable offset) once no transaction begun before the call is open there.

    The high watermarks are taken first (a read_uncommitted probe built from
    consumer_config); then the last stable offsets (consumer, read_committed)
    are asked for until each has reached its high watermark. A transaction's
    markers reach its partitions one by one after the coordinator's decision:
    a reader that knows a transaction committed (its offsets or its state are
    visible) must wait for the markers of the other partitions it reads too.
    A CI chaos run caught a state partition's marker written 0.2 s after the
    offsets' one, and a deduper that read it meanwhile restored no state. A
    transaction not decided yet holds the wait until it ends (a dead writer's:
    transaction.timeout.ms).

    Raises:
        KafkaOperationError: a transaction still open at deadline (transient).
    """
    probe = Consumer({**consumer_config, "isolation.level": "read_uncommitted"})
    try:
        highs = {
            tp: watermark_offsets(probe, *tp, budget_s=max(_SETTLE_ASK_MIN_S, deadline - time.monotonic()))[1]
            for tp in partitions
        }
    finally:
        probe.close()
    started = time.monotonic()
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    unsettled = list(partitions)
    while True:
        # The last ask may overrun the deadline a little rather than time out with the answer on its way.
        budget = max(_SETTLE_ASK_MIN_S, deadline - time.monotonic())
        for tp in unsettled:
            ends[tp] = watermark_offsets(consumer, *tp, budget_s=budget)
        unsettled = [tp for tp in unsettled if ends[tp][1] < highs[tp]]
        waited = time.monotonic() - started
        if not unsettled:
            if waited > _SETTLE_LOG_S:
                _log.info("%d partitions settled after %.2f s", len(partitions), waited)
            return ends
        if time.monotonic() >= deadline:
            shown = ", ".join(
                f"{t} [{p}] last stable offset {ends[(t, p)][1]} < high watermark {highs[(t, p)]}"
                for t, p in unsettled[:5]
            )
            where = f"{len(unsettled)} partition{'s' if len(unsettled) > 1 else ''}"
            raise KafkaOperationError(
                f"waiting {waited:.0f} s for the transactions open on {where} to end ({shown})",
                TimeoutError(
                    "a transaction's markers are not written yet, or its writer is gone and the coordinator "
                    "has not aborted it yet (transaction.timeout.ms)"
                ),
            )
        time.sleep(_SETTLE_POLL_S)


def committed_ranges(
    admin: AdminClient, partitions: Mapping[str, int], timeout_s: float
) -> dict[tuple[str, int], tuple[int, int]]:
    """Every partition's (low, high) offsets as a read_committed reader sees them, asked for all at once.

    partitions maps each topic to its partition count. High is the last stable
    offset, as a read_committed consumer's ``get_watermark_offsets`` returns it,
    but the whole set costs two ListOffsets requests per partition leader
    instead of a round trip per partition. A retriable error (a leader moving)
    is retried within timeout_s.

    Raises:
        KafkaOperationError: no answer within timeout_s (transient).
        KafkaException: a non-retriable error.
    """
    wanted = [TopicPartition(topic, p) for topic, n in partitions.items() for p in range(n)]
    if not wanted:
        return {}
    what = f"reading the offsets of {len(wanted)} partitions of {len(partitions)} topics"

    # confluent-kafka's stub leaves OffsetSpec's constructors untyped.
    specs = {"low": OffsetSpec.earliest(), "high": OffsetSpec.latest()}  # type: ignore[no-untyped-call]

    # One ask waits _RANGES_ASK_S at most: a request to a leader that is gone waits its whole request timeout,
    # and the next ask may find the new leader (a 3-node test: a 60 s ask to the killed node's partitions).
    ask_s = min(timeout_s, _RANGES_ASK_S)

    def ask() -> dict[tuple[str, int], tuple[int, int]]:
        asked = {
            end: admin.list_offsets(
                dict.fromkeys(wanted, spec), isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=ask_s
            )
            for end, spec in specs.items()
        }
        ends: dict[str, dict[tuple[str, int], int]] = {}
        for end, futures in asked.items():
            # Bounded: the future of a partition without a leader may not resolve on its own.
            try:
                ends[end] = {(tp.topic, tp.partition): answer(fut, ask_s, what).offset for tp, fut in futures.items()}
            except KafkaOperationError as exc:
                _refresh_metadata(admin, partitions)
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, str(exc))) from exc  # asked again
        unknown = sorted(key for key in ends["high"] if min(ends["low"][key], ends["high"][key]) < 0)
        if unknown:
            # librdkafka answers OFFSET_INVALID (-1001), not an error, for a partition whose leader is away
            # (seen with a broker of three down): read as offsets, it made a partition look empty. The client
            # keeps asking the old leader until its metadata is refreshed (it did not within 60 s on its own).
            _refresh_metadata(admin, {t for t, _ in unknown})
            shown = ", ".join(f"{t} [{p}]" for t, p in unknown[:5])
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"{what}: no offsets for {shown}"))
        return {key: (ends["low"][key], ends["high"][key]) for key in ends["high"]}

    return retry_retriable(ask, what=what, budget_s=timeout_s)


def _refresh_metadata(
    client: AdminClient | Consumer, topics: Iterable[str], *, timeout_s: float = _METADATA_REFRESH_S
) -> None:
    """Ask for the topics' metadata: the client's cache then names their current leaders and partitions."""
    for topic in topics:
        with contextlib.suppress(KafkaException):
            client.list_topics(topic, timeout=timeout_s)


def uuid_bytes(uuid: object) -> bytes:
    """16-byte form of a confluent-kafka Uuid (topic id)."""
    msb = uuid.get_most_significant_bits()  # type: ignore[attr-defined]
    lsb = uuid.get_least_significant_bits()  # type: ignore[attr-defined]
    return int(msb).to_bytes(8, "big", signed=True) + int(lsb).to_bytes(8, "big", signed=True)


def cluster_id(admin: AdminClient, timeout_s: float) -> str:
    """The cluster id reported by the cluster itself."""
    result = answer(admin.describe_cluster(request_timeout=timeout_s), timeout_s, "describe cluster", admin=admin)
    cid = result.cluster_id
    if not cid:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "cluster reported no cluster id"))
    return str(cid)


def list_topic_names(admin: AdminClient, timeout_s: float) -> list[str]:
    """Names of all topics visible to this client."""
    md = admin.list_topics(timeout=timeout_s)
    return sorted(name for name, t in md.topics.items() if t.error is None)


def describe_topics(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, TopicInfo]:
    """Describe existing topics; missing ones are left out of the result."""
    names = list(names)
    if not names:
        return {}
    futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
    out: dict[str, TopicInfo] = {}
    for name, fut in futures.items():
        try:
            desc = answer(fut, timeout_s, f"describe topic {name}", admin=admin)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            denied = authorization_error(exc, operation="describe topic", resource=name)
            if denied is not None:
                raise denied from exc
            raise
        out[name] = TopicInfo(name=name, topic_id=uuid_bytes(desc.topic_id), partitions=len(desc.partitions))
    return out


def replicable_configs(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, dict[str, str]]:
    """Topic configs set explicitly on each topic, minus the excluded ones."""
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    if not resources:
        return {}
    out: dict[str, dict[str, str]] = {}
    for res, fut in admin.describe_configs(resources, request_timeout=timeout_s).items():
        entries = answer(fut, timeout_s, f"describe the configs of topic {res.name}", admin=admin)
        out[res.name] = {
            k: e.value
            for k, e in entries.items()
            if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            and e.value is not None
            and not e.is_sensitive
            and not any(p.fullmatch(k) for p in EXCLUDED_TOPIC_CONFIGS)
        }
    return out


def create_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    configs: Mapping[str, str],
    timeout_s: float,
    *,
    replication_factor: int = -1,
) -> bool:
    """Create a topic; return False if it already existed.

    replication_factor -1 uses the broker's ``default.replication.factor``.
    """
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(configs))
    return name in create_topics(admin, [topic], timeout_s)


def create_topics(admin: AdminClient, new: Sequence[NewTopic], timeout_s: float) -> set[str]:
    """Create topics in one CreateTopics request; return the names created (those that already existed are not).

    Every topic's outcome is awaited before an error is raised, so the topics the
    cluster did create are logged even when another of the request failed.

    Raises:
        KafkaException: the first topic that failed otherwise than by existing already
            (translated to a Ferryman error where authorization was refused).
    """
    if not new:
        return set()
    futures = admin.create_topics(list(new), request_timeout=timeout_s, operation_timeout=timeout_s)
    created: set[str] = set()
    failed: list[tuple[str, KafkaException]] = []
    for t in new:
        try:
            answer(futures[t.topic], timeout_s, f"create topic {t.topic}", admin=admin)
        except KafkaException as exc:
            if not _has_code(exc, KafkaError.TOPIC_ALREADY_EXISTS):
                failed.append((t.topic, exc))
            continue
        _log.info("created topic %s with %d partitions %s", t.topic, t.num_partitions, t.config or "")
        created.add(t.topic)
    if failed:
        name, error = failed[0]
        denied = authorization_error(error, operation="create topic", resource=name)
        if denied is not None:
            raise denied from error
        raise error
    return created


def _has_code(exc: KafkaException, code: int) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() == code


def grow_partitions(admin: AdminClient, name: str, partitions: int, timeout_s: float) -> None:
    """Grow topic name to the given partition count."""
    grow_topics(admin, {name: partitions}, timeout_s)


def grow_topics(admin: AdminClient, partitions: Mapping[str, int], timeout_s: float) -> None:
    """Grow each topic to its partition count, all in one CreatePartitions request.

    A topic someone else grew first is fine as long as the count is reached
    (``await_topics`` tells). Every topic's outcome is awaited before the first
    other error is raised.
    """
    if not partitions:
        return
    futures = admin.create_partitions(
        [NewPartitions(name, n) for name, n in partitions.items()], request_timeout=timeout_s
    )
    failed: list[KafkaException] = []
    for name, n in partitions.items():
        try:
            answer(futures[name], timeout_s, f"grow topic {name}", admin=admin)
        except KafkaException as exc:
            if not _has_code(exc, KafkaError.INVALID_PARTITIONS):
                failed.append(exc)
                continue
        _log.info("grew topic %s to %d partitions", name, n)
    if failed:
        raise failed[0]


@dataclass(frozen=True)
class InternalTopic:
    """A topic a service owns: created if missing, its shape checked if not."""

    name: str
    partitions: int
    configs: Mapping[str, str]
    purpose: str
    """What the topic is for, in errors ("staging", "state", ...)."""
    setting: str = ""
    """The configuration setting its partition count comes from, named in errors ("" if none)."""


def ensure_internal_topics(
    admin: AdminClient, wanted: Sequence[InternalTopic], timeout_s: float, *, visible_budget_s: float | None = None
) -> list[str]:
    """Create the internal topics that are missing and check the shape of every one; return those created.

    Existing topics are checked before anything is created, so a wrong shape
    stops the service without leaving new topics behind (a corrected
    configuration would then find those topics with the old shape). Requests
    cover all topics at once: a service starting up waits for a few round trips
    (describe, create, describe, describe configs), not a few per topic.

    A topic the cluster accepted is waited for until it shows in the metadata,
    for up to ``visible_budget_s`` (default ``timeout_s``): a broker creates
    every partition's log before it describes the topic, which took over 30 s
    for a few hundred partitions on a loaded machine here.

    Raises:
        TopicShapeError: a topic exists with another partition count, cleanup
            policy or a smaller max.message.bytes than Ferryman needs.
        KafkaOperationError: a created topic did not show in the metadata in
            time (transient: the cluster is slow, nothing is misconfigured).
    """
    existing = describe_topics(admin, [t.name for t in wanted], timeout_s)
    _check_shapes(admin, [t for t in wanted if t.name in existing], existing, timeout_s)
    missing = [t for t in wanted if t.name not in existing]
    if not missing:
        return []
    create_topics(
        admin,
        [NewTopic(t.name, num_partitions=t.partitions, replication_factor=-1, config=dict(t.configs)) for t in missing],
        timeout_s,
    )
    # Another service of the flow may have created some of them first: check them all the same.
    budget_s = timeout_s if visible_budget_s is None else max(timeout_s, visible_budget_s)
    found = await_topics(admin, {t.name: 1 for t in missing}, budget_s)
    unseen = [t.name for t in missing if t.name not in found]
    if unseen:
        raise KafkaOperationError(
            f"creating topics {', '.join(unseen)}",
            TimeoutError(f"created, but not in the cluster's metadata after {budget_s:.0f} s"),
        )
    _check_shapes(admin, missing, found, timeout_s)
    return [t.name for t in missing]


def _check_shapes(
    admin: AdminClient, wanted: Sequence[InternalTopic], found: Mapping[str, TopicInfo], timeout_s: float
) -> None:
    """Raise TopicShapeError for the first of ``wanted`` that is missing from ``found`` or shaped otherwise."""
    for t in wanted:
        info = found.get(t.name)
        if info is None:
            raise TopicShapeError(f"{t.purpose} topic {t.name} does not exist and could not be created")
        if info.partitions != t.partitions:
            setting = f" ({t.setting})" if t.setting else ""
            raise TopicShapeError(
                f"{t.purpose} topic {t.name} has {info.partitions} partitions but the flow is configured for "
                f"{t.partitions}{setting}; the source-to-staging partition map depends on this count, so it must "
                f"not change. Fix the configuration or recreate the topic after draining it."
            )
    policed = [t for t in wanted if "cleanup.policy" in t.configs]
    actual = _topic_configs(admin, [t.name for t in policed], timeout_s)
    for t in policed:
        has = actual[t.name]
        if has.get("cleanup.policy") != t.configs["cleanup.policy"]:
            raise TopicShapeError(
                f"{t.purpose} topic {t.name} has cleanup.policy={has.get('cleanup.policy')}, "
                f"expected {t.configs['cleanup.policy']}"
            )
        want_max = t.configs.get("max.message.bytes")
        if want_max is not None and int(has.get("max.message.bytes", "0")) < int(want_max):
            raise TopicShapeError(
                f"{t.purpose} topic {t.name} has max.message.bytes={has.get('max.message.bytes')}, "
                f"below the {want_max} needed for records near the size limit once wrapped"
            )


def await_topics(admin: AdminClient, min_partitions: Mapping[str, int], timeout_s: float) -> dict[str, TopicInfo]:
    """Describe the topics until each exists with its minimum partition count, or the time is up.

    Returns what the last describe found: the caller tells the topics that are
    not there yet (missing, or fewer partitions) from the ones that are.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = describe_topics(admin, min_partitions, timeout_s)
        ready = all(name in found and found[name].partitions >= n for name, n in min_partitions.items())
        if ready or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)  # metadata propagation takes tens of ms: poll briefly


def await_topic(admin: AdminClient, name: str, timeout_s: float, min_partitions: int = 1) -> TopicInfo | None:
    """Describe name until it exists with min_partitions (metadata propagates after creation)."""
    return await_topics(admin, {name: min_partitions}, timeout_s).get(name)


def _topic_configs(admin: AdminClient, names: list[str], timeout_s: float) -> dict[str, dict[str, str]]:
    """Every config value of each topic, in one request.

    On a cluster of several brokers, a topic created a moment ago may be
    unknown to the broker asked (UNKNOWN_TOPIC_OR_PART, seen in 5 of 20 tries on
    three local brokers): retried within timeout_s, as a transient error.
    """
    if not names:
        return {}

    def describe() -> dict[str, dict[str, str]]:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, n) for n in names], request_timeout=timeout_s
        )
        return {
            res.name: {
                k: e.value
                for k, e in answer(fut, timeout_s, f"describe the configs of topic {res.name}", admin=admin).items()
                if e.value is not None
            }
            for res, fut in futures.items()
        }

    return retry_retriable(describe, what=f"reading the configs of {', '.join(names)}", budget_s=timeout_s)
