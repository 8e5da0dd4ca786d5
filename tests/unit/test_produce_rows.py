"""The deduper's hot produce loop: every row exactly once, in order, also when librdkafka's queue is full."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from ferryman_deduper._deduper import Deduper


class _Producer:
    """produce() records its positional arguments and refuses the calls numbered in ``refuse`` (queue full)."""

    def __init__(self, refuse: set[int]) -> None:
        self.calls = itertools.count()
        self.refuse = refuse
        self.rows: list[tuple[Any, ...]] = []

    def produce(self, *args: Any) -> None:
        if next(self.calls) in self.refuse:
            raise BufferError("Local: Queue full")
        self.rows.append(args)


def _run(columns: list[Sequence[Any]], start: int, n: int, refuse: set[int]) -> list[tuple[Any, ...]]:
    producer = _Producer(refuse)
    # Stands in for the service: the hot loop touches only these two.
    stub = SimpleNamespace(_producer=producer, _produce_when_room=producer.rows.append)
    cursors = [iter(c) for c in columns]
    for cursor in cursors:
        next(itertools.islice(cursor, start, start), None)
    Deduper._produce_rows(stub, "dest", 5, columns, cursors, n)  # type: ignore[arg-type]  # only what it touches
    return producer.rows


@pytest.mark.parametrize("refuse", [set(), {0}, {3}, {9}, {0, 1, 2}, {2, 5, 7}], ids=str)
@pytest.mark.parametrize("with_headers", [False, True], ids=["no-headers", "headers"])
@pytest.mark.parametrize(("start", "n"), [(0, 10), (2, 6), (0, 0)], ids=["all", "middle", "none"])
def test_every_row_is_produced_once_in_order(refuse: set[int], with_headers: bool, start: int, n: int) -> None:
    values = [f"v{i}".encode() for i in range(10)]
    keys = [None if i % 3 == 0 else f"k{i}".encode() for i in range(10)]
    stamps = list(range(100, 110))
    columns: list[Sequence[Any]] = [values, keys, stamps]
    if with_headers:
        columns.append([[("h", str(i).encode())] if i % 2 else None for i in range(10)])
    rows = _run(columns, start, n, refuse)
    expected = [
        ("dest", values[i], keys[i], 5, None, None, stamps[i], *([columns[3][i]] if with_headers else []))
        for i in range(start, start + n)
    ]
    assert rows == expected


def test_the_cursors_stop_right_after_the_rows_produced() -> None:
    """The last row of a run (produced with a callback) is read from the same cursors afterwards."""
    columns: list[Sequence[Any]] = [[b"a", b"b", b"c", b"d"], [b"1", b"2", b"3", b"4"], [1, 2, 3, 4]]
    producer = _Producer({1})
    stub = SimpleNamespace(_producer=producer, _produce_when_room=producer.rows.append)
    cursors = [iter(c) for c in columns]
    next(cursors[0]), next(cursors[1]), next(cursors[2])  # the first row went out with its callback
    Deduper._produce_rows(stub, "dest", 0, columns, cursors, 2)  # type: ignore[arg-type]
    assert [r[1] for r in producer.rows] == [b"b", b"c"]
    assert [next(c) for c in cursors] == [b"d", b"4", 4]
