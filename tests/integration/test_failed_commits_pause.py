"""The wrappers' pause for a deduper's failed commits ends, even when nothing is left to commit (real brokers).

After two failed commits in a row the deduper asks its wrappers to pause source
reads ("destination cluster unavailable (N failed commits)"). Only a commit
reset that count, and with the wrappers paused a deduper with nothing left to
write commits nothing: the long chaos run of 2026-11-29 kept both wrappers
paused 16 minutes that way (e6f1c1d). The pause now ends
``FAILED_COMMITS_PAUSE_S`` after the last failure unless another commit fails.

Here both services run in process, linked as in production (the wrapper finds
the deduper in the destination cluster). Each failed commit is a commit whose
answer was lost: EndTxn reaches the coordinator, then the call fails, so the
deduper recovers (a new producer), rewinds to what was committed, and finds
nothing to write again. The window is shortened to keep the test short.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from ferryman.config import parse_config
from ferryman.errors import KafkaOperationError
from ferryman_deduper import _transaction
from ferryman_deduper._deduper import Deduper
from ferryman_wrapper._wrapper import Wrapper

from tests.helpers.kafka import KafkaCluster, assert_sequences, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import flow_config, running_in_thread

pytestmark = pytest.mark.integration

T = TypeVar("T")

_PARTITIONS = 2
_BATCH = 10
_TIMEOUT_S = 60.0
_PAUSE_S = 8.0


class _LostCommitAnswers:
    """While failing: every commit_transaction goes through, then fails as if its answer was lost."""

    def __init__(self, deduper: Deduper, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failing = threading.Event()
        self.failed = 0
        self.last_failed_at = 0.0
        txn = deduper._txn
        retrying = txn._retrying

        def lost_answer(fn: Callable[[float], T], what: str, budget_s: float) -> T:
            result = retrying(fn, what, budget_s)
            if what == "commit_transaction" and self.failing.is_set():
                self.failed += 1
                self.last_failed_at = time.monotonic()
                raise KafkaOperationError(what, TimeoutError("played: the commit's answer was lost"))
            return result

        monkeypatch.setattr(txn, "_retrying", lost_answer)


@pytest.fixture
def pair(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[str, Wrapper, Deduper]]:
    """A linked wrapper and deduper (in process) replicating a 2-partition topic; yields the topic too."""
    monkeypatch.setattr(_transaction, "FAILED_COMMITS_PAUSE_S", _PAUSE_S)
    topic = unique_name("src")
    create_topic(source_cluster.bootstrap_servers, topic, _PARTITIONS)
    config = parse_config(
        flow_config(
            source_bootstrap=source_cluster.bootstrap_servers,
            destination_bootstrap=destination_cluster.bootstrap_servers,
            flow=unique_name("pause"),
            topics=[topic],
            staging_partitions=_PARTITIONS,
            deduper={"instance_id": "d1"},
        )
    )
    deduper = Deduper(config, config.flows[0])
    wrapper = Wrapper(config, config.flows[0])
    with running_in_thread(deduper), running_in_thread(wrapper):
        wait_until(
            lambda: wrapper.status().control_connected, _TIMEOUT_S, message="the wrapper is linked to the deduper"
        )
        yield topic, wrapper, deduper


def test_the_pause_for_failed_commits_ends_when_nothing_is_left_to_commit(
    pair: tuple[str, Wrapper, Deduper],
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic, wrapper, deduper = pair
    source, destination = source_cluster.bootstrap_servers, destination_cluster.bootstrap_servers
    expected: dict[int, list[bytes]] = {p: [] for p in range(_PARTITIONS)}

    def produce(batch: int) -> None:
        for p, values in produce_sequences(source, topic, _PARTITIONS, _BATCH, start=batch * _BATCH).items():
            expected[p].extend(values)

    def copied() -> None:
        """Every record produced so far is at the destination (read_committed), once and in order."""
        count = sum(len(values) for values in expected.values())
        assert_sequences(read_all(destination, f"src.{topic}", expected=count), expected)

    produce(0)
    copied()

    # Every commit fails from here (after it went through), two batches' worth at least.
    faults = _LostCommitAnswers(deduper, monkeypatch)
    faults.failing.set()
    produce(1)
    wait_until(lambda: faults.failed >= 1, _TIMEOUT_S, message="a commit fails")
    produce(2)
    wait_until(lambda: faults.failed >= 2, _TIMEOUT_S, message="a second commit fails")
    wait_until(lambda: wrapper.status().paused, _TIMEOUT_S, message="the wrapper pauses its source reads")
    assert "failed commits" in wrapper.status().pause_reason
    # The "failed" commits committed every record: the rewinds find nothing left to write, so no commit
    # comes to reset the count.
    copied()
    faults.failing.clear()
    failures = deduper._txn.consecutive_failures
    assert failures == faults.failed >= 2

    # Records produced now wait for the pause to end; it ends FAILED_COMMITS_PAUSE_S after the last failure.
    produce(3)
    wait_until(lambda: not wrapper.status().paused, _PAUSE_S + _TIMEOUT_S, message="the wrapper resumes")
    held_s = time.monotonic() - faults.last_failed_at
    assert held_s >= _PAUSE_S - 1.0, f"the pause ended {held_s:.1f} s after the last failure"
    copied()
    wait_until(lambda: deduper.status().unavailable_reason == "", _TIMEOUT_S, message="the deduper is available")
    assert deduper._txn.consecutive_failures == 0
