"""A service's recovery stuck on its group consumer (real brokers): a fence, and the net for other causes.

A static member's fatal error comes once, as an event of a consume() batch. A
recovery rewinds by seeking the consumer's partitions; on a fenced consumer
every seek fails (``_STATE``: the partition is not fetched), a transient error,
so a recovery that seeks before replacing the consumer backs off for ever and
the service replicates nothing again:

* the deduper keeps its membership alive while it backs off
  (``Deduper._serve_consumer``), so it takes the fence then, and must replace
  the consumer before the rewind;
* the wrapper does not consume while it backs off, so the event is still unread
  when its rewind seeks: a partition no longer fetched means the consumer is
  gone, and it must be replaced (with or without a fatal event to read).

A recovery that fails for ``StuckRecovery``'s window while the clusters answer replaces the consumer too:
the net for a stall of the same family not known yet.

Each service runs in process. The first fault is played by its step failing
once, the destination "away" by the next step of its recovery failing until the
test lets it through; the fence is real: a twin consumer joins the group with
the service's ``group.instance.id``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from ferryman.config import FerrymanConfig, parse_config
from ferryman.errors import KafkaOperationError
from ferryman.watchdog import park
from ferryman_deduper._deduper import Deduper
from ferryman_wrapper._wrapper import Wrapper

from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, static_member_config, wait_until
from tests.helpers.services import flow_config, running_in_thread

pytestmark = pytest.mark.integration

_PARTITIONS = 2
_TIMEOUT_S = 60.0


def _wait(what: str, done: Callable[[], bool]) -> None:
    wait_until(done, _TIMEOUT_S, message=what)


def _transport(what: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, f"played: {what}"))


class _Faults:
    """The service's step fails once when tripped; its recovery fails while the destination is "away"."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, service: Deduper | Wrapper, recovery: tuple[object, str]
    ) -> None:
        self.trip = threading.Event()
        self.away = threading.Event()
        self.recover_calls = 0
        step = service._step
        owner, name = recovery
        recover = getattr(owner, name)

        def failing_step() -> None:
            if self.trip.is_set():
                self.trip.clear()
                raise _transport("the destination went away")
            step()

        def failing_recover(*args: Any, **kwargs: Any) -> Any:
            self.recover_calls += 1
            if self.away.is_set():
                raise KafkaOperationError(f"recovering ({name})", _transport("still away"))
            return recover(*args, **kwargs)

        monkeypatch.setattr(service, "_step", failing_step)
        monkeypatch.setattr(owner, name, failing_recover)

    def start(self) -> None:
        self.away.set()
        self.trip.set()
        _wait("the service recovers and backs off", lambda: self.recover_calls >= 2)


def _twin(bootstrap: str, group: str, instance_id: str, topic: str) -> Consumer:
    """A consumer with the service's group.instance.id: its join fences the service's member."""
    twin = Consumer(static_member_config(bootstrap, group, instance_id))
    twin.subscribe([topic])

    def assigned() -> bool:
        twin.consume(timeout=0.2)  # serves the join
        return bool(twin.assignment())

    wait_until(assigned, _TIMEOUT_S, 0.0, message="the twin is assigned")
    return twin


@pytest.fixture
def config(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> FerrymanConfig:
    topic = unique_name("src")
    create_topic(source_cluster.bootstrap_servers, topic, _PARTITIONS)
    return parse_config(
        flow_config(
            source_bootstrap=source_cluster.bootstrap_servers,
            destination_bootstrap=destination_cluster.bootstrap_servers,
            flow=unique_name("fence"),
            topics=[topic],
            staging_partitions=_PARTITIONS,
            wrapper={"session_timeout_ms": 6000},
            deduper={"instance_id": "d1", "session_timeout_ms": 6000},
        )
    )


_ALL = set(range(_PARTITIONS))


@pytest.fixture
def deduper(config: FerrymanConfig) -> Iterator[Deduper]:
    """A running deduper that owns every staging partition."""
    service = Deduper(config, config.flows[0])
    with running_in_thread(service):
        _wait("the deduper owns every staging partition", lambda: service._parts.owned == _ALL)
        yield service


@pytest.fixture
def wrapper(config: FerrymanConfig, source_cluster: KafkaCluster) -> Iterator[Wrapper]:
    """A running wrapper that has sent 10 records of each source partition."""
    service = Wrapper(config, config.flows[0])
    produce_sequences(source_cluster.bootstrap_servers, config.flows[0].topics[0], _PARTITIONS, 10)
    with running_in_thread(service):
        _wait("the wrapper sent every record", lambda: service.records_sent >= 10 * _PARTITIONS)
        yield service


def _owns_all_again(deduper: Deduper) -> None:
    _wait("the deduper recovers", lambda: deduper._recovery is None)
    _wait("the deduper owns every staging partition again", lambda: deduper._parts.owned == _ALL)
    assert deduper._parts.consumer_rebuilds == 1


def _sends_again(wrapper: Wrapper, source: KafkaCluster) -> None:
    _wait("the wrapper recovers", lambda: not wrapper._recovery.reason)
    assert wrapper.consumer_rebuilds == 1
    sent = wrapper.records_sent
    produce_sequences(source.bootstrap_servers, wrapper._flow.topics[0], _PARTITIONS, 10, start=10)
    _wait("the wrapper sends again", lambda: wrapper.records_sent >= sent + 10 * _PARTITIONS)
    assert wrapper.status().unavailable_reason == ""


def test_the_deduper_replaces_a_consumer_fenced_while_it_recovers_before_the_rewind(
    deduper: Deduper, destination_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = deduper._parts
    faults = _Faults(monkeypatch, deduper, (deduper._txn, "recover"))
    faults.start()
    assert parts.owned == _ALL  # still ours: the rewind will seek them
    names = deduper._names
    twin = _twin(destination_cluster.bootstrap_servers, names.deduper_group, "d1", names.staging_topic)
    try:
        _wait("the fence is noted while recovering", lambda: parts.consumer_failed)
        assert deduper._recovery is not None and parts.consumer_rebuilds == 0
        faults.away.clear()
        # A new consumer, whose join fences the twin (no longer polled); it takes every partition again.
        _owns_all_again(deduper)
        status = deduper.status()
        assert status.unavailable_reason == ""
        assert sorted(status.assigned_staging_partitions) == sorted(_ALL)
    finally:
        park(twin)  # fenced by the new consumer: its close() would not return


def test_the_wrapper_replaces_a_consumer_fenced_while_it_recovers(
    wrapper: Wrapper, source_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = _Faults(monkeypatch, wrapper, (wrapper._commits, "commit"))
    faults.start()
    assert wrapper._recovery.reason
    assert wrapper._static_id is not None
    twin = _twin(
        source_cluster.bootstrap_servers, wrapper._names.wrapper_group, wrapper._static_id, wrapper._flow.topics[0]
    )
    try:
        # The member learns of the fence at its next heartbeat: librdkafka then stops its fetchers.
        _wait("the wrapper's consumer is fenced", lambda: not wrapper._clients.consumer.assignment())
        faults.away.clear()
        # The rewind finds its partitions no longer fetched: a new consumer, whose join fences the twin.
        _sends_again(wrapper, source_cluster)
    finally:
        park(twin)  # fenced by the new consumer: its close() would not return


class _Unfetching:
    """The wrapper's consumer, except that its next seek finds the partition no longer fetched (``_STATE``)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.refused = 0

    def seek(self, partition: TopicPartition) -> None:
        if not self.refused:
            self.refused += 1
            raise KafkaException(KafkaError(KafkaError._STATE, "played: the partition is not fetched"))
        self.consumer.seek(partition)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


def test_the_wrapper_replaces_a_consumer_that_no_longer_fetches_a_partition_even_without_a_fatal_event(
    wrapper: Wrapper, source_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    unfetching = _Unfetching(wrapper._clients.consumer)
    monkeypatch.setattr(wrapper._clients, "consumer", unfetching)
    faults = _Faults(monkeypatch, wrapper, (wrapper._commits, "commit"))
    faults.trip.set()
    _wait("the source consumer is replaced", lambda: wrapper.consumer_rebuilds == 1)
    assert unfetching.refused == 1
    assert not isinstance(wrapper._clients.consumer, _Unfetching)
    _sends_again(wrapper, source_cluster)


# The net for stalls not known yet: a recovery that keeps failing on the consumer while the clusters
# answer replaces the consumer after StuckRecovery's window (shortened here). The consumer's failure is
# played: its rewind (deduper) or its commits (wrapper) fail until it has been replaced.
_STUCK_WINDOW_S = 2.0


def test_the_deduper_replaces_its_consumer_when_a_recovery_stays_stuck_while_the_destination_answers(
    deduper: Deduper, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = deduper._parts
    deduper._stuck.after_s = _STUCK_WINDOW_S
    rewind = parts.rewind

    def stuck_rewind() -> None:
        if parts.consumer_rebuilds == 0:
            raise KafkaOperationError("seeking staging partition 0", _transport("a consumer gone bad"))
        rewind()

    monkeypatch.setattr(parts, "rewind", stuck_rewind)
    faults = _Faults(monkeypatch, deduper, (deduper._txn, "recover"))
    faults.trip.set()
    _wait("the staging consumer is replaced", lambda: parts.consumer_rebuilds == 1)
    _owns_all_again(deduper)
    assert faults.recover_calls >= 2


def test_the_wrapper_replaces_its_consumer_when_a_recovery_stays_stuck_while_both_clusters_answer(
    wrapper: Wrapper, source_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper._recovery.stuck.after_s = _STUCK_WINDOW_S
    commit = wrapper._commits.commit

    def stuck_commit(*args: Any, **kwargs: Any) -> None:
        if wrapper.consumer_rebuilds == 0:
            raise KafkaOperationError("committing source offsets", _transport("a consumer gone bad"))
        commit(*args, **kwargs)

    faults = _Faults(monkeypatch, wrapper, (wrapper._commits, "commit"))
    monkeypatch.setattr(wrapper._commits, "commit", stuck_commit)
    faults.trip.set()
    _wait("the source consumer is replaced", lambda: wrapper.consumer_rebuilds == 1)
    _sends_again(wrapper, source_cluster)
