"""The end-to-end latency histogram: per-record counts (compiled and pure-Python alike), what a commit counts."""

from __future__ import annotations

import pytest
from ferryman.metrics import LatencyHistogram
from ferryman.metrics import _latency as latency
from ferryman.metrics.collectors import DeduperCollector
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.metrics import deduper_status
from tests.unit.test_transaction_recovery import Producers, abortable, txn

NOW_MS = 1_800_000_000_000
BOUNDS_MS = tuple(round(b * 1000) for b in latency.DEFAULT_BOUNDS_S)
COUNTS = [
    f
    for f in (latency.compiled_count, latency.count_latencies_py)  # the compiled count where built
    if f is not None
]


@pytest.mark.parametrize("count", COUNTS)
def test_each_record_lands_in_the_first_bucket_at_or_above_its_age(count: latency.CountLatencies) -> None:
    stamps = [NOW_MS - 10, NOW_MS - 11, NOW_MS - 250, NOW_MS - 251, NOW_MS - 3_600_000, NOW_MS + 5_000]
    counts = [0] * (len(BOUNDS_MS) + 1)
    total = count([(stamps, 0)], NOW_MS, BOUNDS_MS, counts)
    # le=0.01 holds 10 ms and the clock-skewed record (counted as 0); 11 ms is in le=0.025; 1 h in +Inf.
    assert counts[0] == 2
    assert counts[1] == 1
    assert counts[BOUNDS_MS.index(250)] == 1
    assert counts[BOUNDS_MS.index(500)] == 1
    assert counts[-1] == 1
    assert sum(counts) == len(stamps)
    assert total == 10 + 11 + 250 + 251 + 3_600_000


@given(
    st.lists(
        st.tuples(st.lists(st.integers(NOW_MS - 4_000_000, NOW_MS + 1000), max_size=30), st.integers(0, 35)),
        max_size=8,
    )
)
def test_the_compiled_count_is_the_pure_python_count(runs: list[tuple[list[int], int]]) -> None:
    compiled, reference = [0] * (len(BOUNDS_MS) + 1), [0] * (len(BOUNDS_MS) + 1)
    assert latency.compiled_count is not None, "the build did not compile ferryman.metrics._latencycount"
    total = latency.compiled_count(list(runs), NOW_MS, BOUNDS_MS, compiled)
    assert total == latency.count_latencies_py(list(runs), NOW_MS, BOUNDS_MS, reference)
    assert compiled == reference


@pytest.mark.parametrize("stamp", [2**63, "late"])
def test_a_timestamp_that_is_not_a_64_bit_int_is_refused(stamp: object) -> None:
    assert latency.compiled_count is not None, "the build did not compile ferryman.metrics._latencycount"
    with pytest.raises((OverflowError, TypeError)):
        latency.compiled_count([([NOW_MS, stamp], 0)], NOW_MS, BOUNDS_MS, [0] * (len(BOUNDS_MS) + 1))  # type: ignore[list-item]


def test_a_run_counts_only_from_its_start_and_any_sequence_of_timestamps() -> None:
    h = LatencyHistogram()
    h.observe([([NOW_MS - 5000, NOW_MS - 20], 1), (range(NOW_MS - 2, NOW_MS), 0)], NOW_MS)
    snap = h.snapshot()
    assert snap.count == 3
    assert snap.sum_s == pytest.approx(0.023)
    assert snap.cumulative[0] == 2  # 1 and 2 ms
    assert snap.cumulative[1] == 3  # and 20 ms


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        LatencyHistogram((0.1, 0.05))


def test_a_commit_counts_its_records_and_an_abort_counts_none() -> None:
    t = txn(Producers())
    t.timestamps.append(([1, 2, 3], 1))
    t.recover(abortable(), "commit")
    assert t.latency.snapshot().count == 0 and not t.timestamps

    t.begin()
    t.timestamps.append(([1, 2, 3], 1))
    t.timestamps.append(([4], 0))
    t.commit(
        staging_topic="s",
        group_metadata=lambda: None,
        write_state=lambda: None,
        commit_consumer_offsets=lambda _o: None,
    )
    snap = t.latency.snapshot()
    assert snap.count == 3
    assert snap.cumulative[-2] == 0  # timestamps of 1970: all older than the last bound
    assert not t.timestamps


def test_the_collector_exports_the_histogram_cumulatively() -> None:
    h = LatencyHistogram((0.1, 1.0))
    h.observe([([NOW_MS - 50, NOW_MS - 500, NOW_MS - 5000], 0)], NOW_MS)
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in DeduperCollector(deduper_status, latency=h.snapshot).collect()
        for s in family.samples
        if s.name.startswith("ferryman_deduper_end_to_end_latency_seconds")
    }
    name = "ferryman_deduper_end_to_end_latency_seconds"
    assert samples == {
        (f"{name}_bucket", "0.1"): 1,
        (f"{name}_bucket", "1.0"): 2,
        (f"{name}_bucket", "+Inf"): 3,
        (f"{name}_count", None): 3,
        (f"{name}_sum", None): pytest.approx(5.55),
    }


def test_without_a_histogram_the_collector_exports_an_empty_one() -> None:
    samples = [
        s
        for family in DeduperCollector(deduper_status).collect()
        for s in family.samples
        if s.name == "ferryman_deduper_end_to_end_latency_seconds_count"
    ]
    assert [s.value for s in samples] == [0]
