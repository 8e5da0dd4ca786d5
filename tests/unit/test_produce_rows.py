"""The deduper's produce loop through produce(): every row exactly once, in order, also when the queue is full.

The direct path (``_rdproduce``) needs a real producer; tests/integration/test_direct_produce.py
holds it to the same contract on a broker.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from ferryman import rowproduce


class _Producer:
    """produce() records its positional arguments and refuses the calls numbered in ``refuse`` (queue full)."""

    def __init__(self, refuse: set[int]) -> None:
        self.calls = itertools.count()
        self.refuse = refuse
        self.rows: list[tuple[Any, ...]] = []
        self.polls = 0

    def produce(self, *args: Any) -> None:
        if next(self.calls) in self.refuse:
            raise BufferError("Local: Queue full")
        self.rows.append(args)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def _columns(with_headers: bool) -> list[Sequence[Any]]:
    values = [f"v{i}".encode() for i in range(10)]
    keys = [None if i % 3 == 0 else f"k{i}".encode() for i in range(10)]
    columns: list[Sequence[Any]] = [values, keys, list(range(100, 110))]
    if with_headers:
        columns.append([[("h", str(i).encode())] if i % 2 else None for i in range(10)])
    return columns


@pytest.mark.parametrize("direct", [False, True], ids=["produce-calls", "direct-requested"])
@pytest.mark.parametrize("refuse", [set(), {0}, {3}, {9}, {0, 1, 2}, {2, 5, 7}], ids=str)
@pytest.mark.parametrize("with_headers", [False, True], ids=["no-headers", "headers"])
@pytest.mark.parametrize(("start", "n"), [(0, 10), (2, 6), (0, 0)], ids=["all", "middle", "none"])
def test_every_row_is_produced_once_in_order(
    refuse: set[int], with_headers: bool, start: int, n: int, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if direct:
        # An adopted producer whose direct path takes no row: every row must then reach produce().
        monkeypatch.setattr(rowproduce, "rdproduce", _TakesNothing())
    columns = _columns(with_headers)
    producer = _Producer(refuse)
    rowproduce.produce_run(producer, "dest", 5, columns, start=start, n=n, direct=direct)  # type: ignore[arg-type]
    expected = [
        ("dest", columns[0][i], columns[1][i], 5, None, None, columns[2][i], *([columns[3][i]] if with_headers else []))
        for i in range(start, start + n)
    ]
    assert producer.rows == expected


class _TakesNothing:
    """A direct path that refuses every row (as for a column entry it does not take)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def produce_rows(self, *args: Any) -> int:
        self.calls.append((args[-2], args[-1]))
        return 0


class _TakesSome:
    """A direct path that takes up to ``take`` rows per call, recording them."""

    def __init__(self, take: int) -> None:
        self.take = take
        self.rows: list[int] = []

    def produce_rows(self, producer: Any, topic: str, partition: int, *args: Any) -> int:
        start: int = args[-2]
        n: int = args[-1]
        done = min(self.take, n)
        self.rows += range(start, start + done)
        return done


def test_a_row_the_direct_path_refuses_goes_through_produce_and_the_rest_resume_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct = _TakesSome(3)
    monkeypatch.setattr(rowproduce, "rdproduce", direct)
    producer = _Producer(set())
    rowproduce.produce_run(producer, "dest", 0, _columns(False), start=1, n=9, direct=True)  # type: ignore[arg-type]
    # direct 1-3, produce() 4, direct 5-7, produce() 8, direct 9
    assert direct.rows == [1, 2, 3, 5, 6, 7, 9]
    assert [r[1] for r in producer.rows] == [b"v4", b"v8"]


def test_columns_that_are_not_lists_skip_the_direct_path(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _TakesSome(100)
    monkeypatch.setattr(rowproduce, "rdproduce", direct)
    producer = _Producer(set())
    values, keys, stamps = _columns(False)
    rowproduce.produce_run(producer, "d", 0, [values, keys, tuple(stamps)], start=0, n=10, direct=True)  # type: ignore[arg-type]
    assert direct.rows == []
    assert [r[6] for r in producer.rows] == list(range(100, 110))


def test_not_adopted_never_calls_the_direct_path(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _TakesSome(100)
    monkeypatch.setattr(rowproduce, "rdproduce", direct)
    producer = _Producer(set())
    rowproduce.produce_run(producer, "d", 0, _columns(True), start=0, n=10, direct=False)  # type: ignore[arg-type]
    assert direct.rows == []
    assert len(producer.rows) == 10


def test_produce_row_waits_while_the_queue_is_full() -> None:
    producer = _Producer({0, 1, 2})
    callback = object()
    rowproduce.produce_row(producer, "d", 3, (b"v", None, 7, [("h", None)]), callback)  # type: ignore[arg-type]
    assert producer.rows == [("d", b"v", None, 3, callback, None, 7, [("h", None)])]
    assert producer.polls == 3


def test_describe_names_the_path() -> None:
    assert rowproduce.describe(True) == "direct to librdkafka"
    assert rowproduce.describe(False).startswith("produce() per record (")
