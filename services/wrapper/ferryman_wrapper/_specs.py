"""Source topic discovery and topic-spec publication.

The wrapper is the only half with credentials for the source cluster, so it
describes the selected source topics (partitions, topic id, replicable configs)
and publishes them to the flow's compacted topic-spec topic on the destination
cluster before it sends any envelope of a topic or a new partition of it. The
deduper creates and grows destination topics from those specs.

A discovery has two steps. ``observe()`` reads the source (list, describe,
describe configs) and touches nothing shared, so the periodic one runs on a
thread of its own (``observe_in_background()``): a slow source answer, up to
the admin timeout, no longer stops the wrapper's loop. ``publish()`` then runs
on the loop thread, which owns the producer and the published specs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer
from ferryman import topics
from ferryman.errors import FerrymanError, KafkaOperationError
from ferryman.kafka_errors import is_transient
from ferryman.naming import TopicFilter
from ferryman.renewing_admin import RenewingAdmin
from ferryman.state import spec_key
from ferryman.topics import TopicInfo
from ferryman.v1 import state_pb2

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceView:
    """What one observation read at the source."""

    started: float  # time.monotonic() before the first read: orders observations
    names: list[str]  # the selected topic names the view is about
    infos: dict[str, TopicInfo]  # those that could be described (a topic may go meanwhile)
    configs: dict[str, dict[str, str]]  # replicable configs by topic; empty when not replicated


@dataclass
class SpecPublisher:
    """Keeps the destination's view of the source topics up to date."""

    source_admin: RenewingAdmin
    producer: Producer
    specs_topic: str
    cluster_id: str
    topic_filter: TopicFilter
    replicate_configs: bool
    timeout_s: float

    def __post_init__(self) -> None:
        self.published: dict[str, state_pb2.TopicSpec] = {}
        self.on_change: Callable[[list[state_pb2.TopicSpec]], None] | None = None
        #: Topics whose id changed since this process published them (deleted and re-created): the wrapper
        #: replaces its source consumer, which may never fetch a re-created topic it knew by its old id.
        self.recreated: set[str] = set()
        # When the observation that last published or confirmed each topic began.
        self._seen_at: dict[str, float] = {}
        #: Every published spec is to be sent again (the spec topic was made again, empty), at the next publish.
        self._republish_due = False

    def discover(self) -> list[str]:
        """Selected source topics now; publishes specs of new or changed ones."""
        return self.publish(self.observe())

    def refresh(self, names: list[str]) -> None:
        """Describe names at the source and publish every spec that changed."""
        self.publish(self.observe(names))

    def observe(self, names: list[str] | None = None) -> SourceView:
        """Read the source: names (default: every topic the filter selects), described.

        Reads only what the constructor set, so any thread may call it.
        """
        started = time.monotonic()
        admin = self.source_admin.client
        try:
            if names is None:
                listed = topics.list_topic_names(admin, self.timeout_s)
                names = [t for t in listed if self.topic_filter.matches(t)]
            infos = topics.describe_topics(admin, names, self.timeout_s)
            configs = topics.replicable_configs(admin, infos.keys(), self.timeout_s) if self.replicate_configs else {}
        except (KafkaException, FerrymanError) as exc:
            if is_transient(exc):  # the source away, or this client stuck: a new one answering replaces it
                self.source_admin.suspect()
            raise
        return SourceView(started, names, infos, configs)

    def observe_in_background(self) -> Future[SourceView]:
        """observe() on a daemon thread of its own; the future holds the view or what the reads raised.

        A daemon, so that a source slow to answer cannot hold up the process's exit.
        """
        future: Future[SourceView] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self.observe())
            except BaseException as exc:  # handed to whoever takes the result
                future.set_exception(exc)

        threading.Thread(target=run, name="ferryman-discovery", daemon=True).start()
        return future

    def publish(self, view: SourceView) -> list[str]:
        """Publish every spec of view that changed; the selected topics with a published spec.

        Call it on the thread that owns the producer. A topic that a later
        observation has already published or confirmed keeps that spec: a view
        read before a topic was re-created must not bring back its old id.
        """
        self._republish_if_due()
        infos = {n: i for n, i in view.infos.items() if view.started >= self._seen_at.get(n, view.started)}
        changed = []
        for name, info in infos.items():
            spec = state_pb2.TopicSpec(
                cluster_id=self.cluster_id,
                topic=name,
                topic_id=info.topic_id,
                partitions=info.partitions,
                configs=view.configs.get(name, {}),
            )
            old = self.published.get(name)
            if (
                old is not None
                and old.topic_id == spec.topic_id
                and old.partitions == spec.partitions
                and dict(old.configs) == dict(spec.configs)
            ):
                continue
            spec.observed_at_ms = int(time.time() * 1000)
            changed.append(spec)
        if changed:
            self._send(changed)
        for name in infos:
            self._seen_at[name] = view.started
        return sorted(self.published.keys() & set(view.names))

    def republish(self) -> None:
        """Publish every spec again: the spec topic was made again, empty (``StagingTopics.make_again_if_deleted``).

        A topic just made can be unknown to the producer for a moment: what fails is sent again by the next
        `publish` (else the specs of the topics known before were never in the new topic).
        """
        self._republish_due = True
        self._republish_if_due()

    def _republish_if_due(self) -> None:
        if self._republish_due and self.published:
            self._send(list(self.published.values()))
        self._republish_due = False

    def _send(self, specs: list[state_pb2.TopicSpec]) -> None:
        """Produce specs to the spec topic, then confirm them (``_confirm``)."""
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        for spec in specs:
            self.producer.produce(
                self.specs_topic,
                key=spec_key(self.cluster_id, spec.topic),
                value=spec.SerializeToString(),
                on_delivery=on_delivery,
            )
        self._confirm(specs, errors)

    def _confirm(self, changed: list[state_pb2.TopicSpec], errors: list[str]) -> None:
        """Wait until the destination has the changed specs, then record and announce them."""
        remaining = self.producer.flush(self.timeout_s)
        if remaining or errors:
            raise KafkaOperationError(
                f"publishing topic specs to {self.specs_topic}",
                TimeoutError(f"{remaining} not acknowledged, errors: {errors}"),
            )
        for spec in changed:
            old = self.published.get(spec.topic)
            if old is not None and old.topic_id != spec.topic_id:
                self.recreated.add(spec.topic)
            self.published[spec.topic] = spec
            _log.info(
                "published spec of source topic %s: %d partitions, configs %s",
                spec.topic,
                spec.partitions,
                dict(spec.configs) or "{}",
            )
        if self.on_change is not None:
            self.on_change(changed)
