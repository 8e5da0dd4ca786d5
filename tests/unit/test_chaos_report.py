"""The chaos report's recovery figures (an overlapped fault is not the flow's recovery) and its rate steps."""

from __future__ import annotations

from tests.chaos.report import FaultRecord, Report


def _fault(index: int, recovery_s: float, *, overlaps_next: bool) -> FaultRecord:
    fault = {"index": index, "kind": "cut", "target": "destination", "duration_s": 2.0, "overlaps_next": overlaps_next}
    return FaultRecord(fault, started_s=10.0 * index, recovery_s=recovery_s, recovered_at_s=10.0 * index + recovery_s)


def test_the_summary_measures_recovery_from_the_last_heal_of_each_overlapping_group() -> None:
    faults = [
        _fault(0, 2.0, overlaps_next=False),
        # Measured from its own heal, through fault 2 (a broker restart of ~50 s): not the flow's recovery.
        _fault(1, 57.0, overlaps_next=True),
        _fault(2, 1.0, overlaps_next=False),
        _fault(3, 6.0, overlaps_next=False),
    ]
    report = Report.build(
        seed=1,
        profile="ci",
        source_nodes=1,
        duration_s=60.0,
        records_sent=10,
        records_aborted=0,
        faults=faults,
        topics=[],
        rates=[(0.0, 5.04, 300.0), (5.04, 10.1, 0.0)],
        offered_rate=100.0,
        service_starts={},
        services_down_at_end=[],
        harness_errors=[],
    )
    line = next(x for x in report.summary().splitlines() if x.startswith("recovery:"))
    assert line.startswith("recovery: median 2.0 s, max 6.0 s over 3 faults or overlapping groups, from the last heal")
    assert "(the 1 overlapped faults, from their own heal: max 57.0 s)" in line
    # The rate steps are kept, so a stall hidden from the recovery times still shows in the report.
    assert report.to_json()["rates"] == [(0.0, 5.0, 300.0), (5.0, 10.1, 0.0)]
