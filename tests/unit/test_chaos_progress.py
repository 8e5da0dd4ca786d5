"""Which destination partitions an open transaction held during a fault (``tests.chaos.progress``)."""

from __future__ import annotations

from tests.chaos.progress import HELD_S, Sample, held_stretches

_A, _B = ("src.t", 0), ("src.t", 1)


def _samples(rows: list[tuple[float, dict[tuple[str, int], tuple[int, int]]]]) -> list[Sample]:
    """Samples from (time, {partition: (committed end, high watermark)})."""
    return [
        Sample(at, {k: lso for k, (lso, _) in ends.items()}, {k: high for k, (_, high) in ends.items()})
        for at, ends in rows
    ]


def test_a_committed_end_that_stays_put_below_the_high_watermark_is_held() -> None:
    samples = _samples(
        [
            (0.0, {_A: (10, 10), _B: (5, 7)}),
            (1.0, {_A: (10, 12), _B: (8, 9)}),  # A: a transaction opens; B commits as usual
            (4.0, {_A: (10, 40), _B: (9, 9)}),
            (5.0, {_B: (9, 11)}),  # A's leader away: skipped
            (8.0, {_A: (10, 90), _B: (11, 12)}),
            (9.0, {_A: (90, 95), _B: (12, 12)}),  # A's transaction ends
        ]
    )
    assert held_stretches(samples, 0.0, 10.0) == [(7.0, 80, _A)]


def test_a_committed_end_that_moves_or_has_nothing_above_it_is_not_held() -> None:
    samples = _samples(
        [
            (0.0, {_A: (10, 10), _B: (0, 3)}),
            (3.0, {_A: (10, 10), _B: (3, 6)}),  # A idle: nothing above its end
            (6.0, {_A: (10, 10), _B: (6, 9)}),  # B commits every 3 s
            (9.0, {_A: (10, 10), _B: (9, 12)}),
        ]
    )
    assert held_stretches(samples, 0.0, 10.0) == []


def test_only_the_window_counts() -> None:
    samples = _samples([(t, {_A: (10, 20)}) for t in (0.0, 2.0, 4.0, 6.0, 8.0)])
    assert held_stretches(samples, 0.0, 8.0) == [(8.0, 10, _A)]
    assert held_stretches(samples, 4.0, 8.0) == []  # 4 s inside the window: under HELD_S
    assert HELD_S > 4.0
