"""The chaos run as a test: the CI-sized schedule must end with a clean verdict (the long one nightly).

Each run writes its report (``chaos-report.json`` and ``chaos-report.txt``) to the test's tmp dir and
prints the summary; on failure the summary is the assertion message.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.runner import ChaosRun
from tests.chaos.schedule import CI, LONG, Profile

# The CI-sized schedule runs in every CI run (~5 min on a 2-core machine: its own four brokers, 14 faults);
# the long one (>= 1 M records, 120 faults) nightly (FERRYMAN_NIGHTLY=1) or with `python -m tests.chaos --long`.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

#: CI's seed; FERRYMAN_CHAOS_SEED replays another one (a failing nightly's, say).
CI_SEED = 20261125
LONG_SEED = 20261126


@pytest.mark.parametrize(
    ("profile", "seed"),
    [
        pytest.param(CI, CI_SEED, id="ci"),
        pytest.param(LONG, LONG_SEED, id="long", marks=pytest.mark.nightly),
    ],
)
def test_exactly_once_survives_the_chaos_schedule(tmp_path: Path, profile: Profile, seed: int) -> None:
    seed = int(os.environ.get("FERRYMAN_CHAOS_SEED", seed))
    report = ChaosRun(seed, profile, tmp_path).run()
    report.write(tmp_path)
    print(report.summary())
    assert report.clean, report.summary()
    # The run did what it says: records flowed, every scheduled fault was applied and recovered from.
    assert report.records_sent > 0
    assert all(f.recovery_s is not None for f in report.faults)
    assert report.total.missing == report.total.duplicated == report.total.reordered == report.total.altered == 0
