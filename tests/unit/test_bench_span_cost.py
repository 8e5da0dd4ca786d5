"""``python -m bench.span_cost`` runs the services' record-span code and reports a figure per service and format."""

from __future__ import annotations

import math

import pytest

from bench import span_cost


@pytest.mark.parametrize("cold", [False, True])
def test_every_figure_is_measured(cold: bool) -> None:
    figures = span_cost.measure(30 if cold else 200, 1, cold=cold)  # cold writes 8 MB per envelope
    kinds = ("spans", "+ zipkin", "+ otlp", "+ file")
    expected = {"decode"} | {f"{who} {kind}" for who in ("wrapper", "deduper", "both") for kind in kinds}
    assert set(figures) == expected
    assert all(math.isfinite(v) for v in figures.values())
    if not cold:  # (cold figures are differences with the flushes' own CPU: noisy at this size)
        assert all(figures[f"wrapper {kind}"] > 0 for kind in kinds)  # the wrapper's spans cost something
