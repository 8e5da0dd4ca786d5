"""CI runs the sizes made for it; FERRYMAN_NIGHTLY=1 adds the long variants (deselected otherwise, not skipped)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_LONG = "test_kill_9_wrapper_and_deduper_mid_stream[12-kills-each-some-while-recovering]"
_CI = "test_kill_9_wrapper_and_deduper_mid_stream[3-kills-each]"
_LONG_FROZEN = "test_a_service_frozen_past_its_timeouts_wakes_and_carries_on[wrapper]"


def _collect(nightly: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "FERRYMAN_NIGHTLY"}
    if nightly is not None:
        env["FERRYMAN_NIGHTLY"] = nightly
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/e2e/test_crash_recovery.py"],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_the_long_variants_are_deselected_unless_nightly() -> None:
    ci = _collect(None)
    assert _LONG not in ci and _LONG_FROZEN not in ci
    assert _CI in ci
    assert "2 deselected" in ci
    assert _LONG not in _collect("0")


def test_nightly_collects_them_with_everything_else() -> None:
    nightly = _collect("1")
    assert _LONG in nightly and _LONG_FROZEN in nightly
    assert _CI in nightly
    assert "deselected" not in nightly
