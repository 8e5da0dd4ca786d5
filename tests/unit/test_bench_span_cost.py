"""``python -m bench.span_cost`` runs the services' record-span code and reports a figure per service and format."""

from __future__ import annotations

import math

import pytest

from bench import span_cost


def test_every_figure_is_measured() -> None:
    figures = span_cost.measure(200, 1)
    kinds = ("spans", "+ zipkin", "+ otlp", "+ file")
    expected = {"decode"} | {f"{who} {kind}" for who in ("wrapper", "deduper", "both") for kind in kinds}
    assert set(figures) == expected
    assert all(math.isfinite(v) for v in figures.values())
    assert all(figures[f"wrapper {kind}"] > 0 for kind in kinds)  # the wrapper's spans cost something


def test_the_cold_figures_time_the_tracing_steps_alone() -> None:
    figures = span_cost.measure_cold(40)  # 8 MB written per envelope and step
    assert set(figures) == {"wrapper spans (cold)", "deduper spans (cold)", "both spans (cold)"}
    assert figures["wrapper spans (cold)"] > 0  # timed per step: the flushes are not in it, nothing is subtracted
    assert figures["both spans (cold)"] == pytest.approx(
        figures["wrapper spans (cold)"] + figures["deduper spans (cold)"]
    )
