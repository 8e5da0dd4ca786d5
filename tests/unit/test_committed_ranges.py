"""``topics.committed_ranges``: a partition whose leader is away has no offsets yet, not an empty range."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec
from ferryman import topics
from ferryman.errors import KafkaOperationError

_INVALID = -1001  # what librdkafka answers, with no error, for a partition whose leader is away
LATEST = object()  # stands for OffsetSpec.latest()


class _Admin:
    """ListOffsets answers: partition 1 has no leader for the first `away` asks, then holds offsets 5..9."""

    def __init__(self, away: int) -> None:
        self.away = away
        self.asks = 0
        self.refreshed: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed.append(topic)  # the metadata request that makes the client ask the new leader

    def list_offsets(self, offsets: dict[TopicPartition, Any], **_kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        self.asks += 1
        out: dict[TopicPartition, Future[Any]] = {}
        for tp, spec in offsets.items():
            latest = spec is LATEST
            if tp.partition == 1 and self.asks <= 2 * self.away:
                offset = _INVALID
            else:
                offset = (10 if latest else 5) if tp.partition == 1 else 0
            fut: Future[Any] = Future()
            fut.set_result(SimpleNamespace(offset=offset))
            out[tp] = fut
        return out


@pytest.fixture(autouse=True)
def _specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OffsetSpec, "latest", lambda: LATEST)
    monkeypatch.setattr(OffsetSpec, "earliest", object)


def test_a_partition_without_offsets_is_asked_again_until_its_leader_answers() -> None:
    admin = _Admin(away=2)
    ranges = topics.committed_ranges(admin, {"t": 2}, timeout_s=5.0)  # type: ignore[arg-type]
    assert ranges == {("t", 0): (0, 0), ("t", 1): (5, 10)}
    assert admin.asks == 6  # two asks (low and high) per attempt: two without partition 1's leader, then one
    assert admin.refreshed == ["t", "t"]  # after each attempt without partition 1's offsets


def test_a_partition_whose_leader_stays_away_is_a_transient_failure_not_an_empty_range() -> None:
    with pytest.raises(KafkaOperationError, match=r"no offsets for t \[1\]"):
        topics.committed_ranges(_Admin(away=1000), {"t": 2}, timeout_s=0.3)  # type: ignore[arg-type]
