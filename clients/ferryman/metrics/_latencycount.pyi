"""Types of the compiled latency count (_latencycount.pyx)."""

from collections.abc import Sequence

def count_latencies(
    runs: list[tuple[Sequence[int], int]], now_ms: int, bounds_ms: tuple[int, ...], counts: list[int]
) -> int: ...
