"""The latency phase's generator yields the CPU to what it measures, and only itself."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.latency import GENERATOR_NICE, yield_cpu

_AUTOGROUP = Path("/proc/self/autogroup")


def _yield_and_report() -> tuple[str, int, int, int, str]:
    """In a spawned process, as ``offer`` runs: what yield_cpu says, and what the kernel then says."""
    said = yield_cpu()
    autogroup = _AUTOGROUP.read_text().strip() if _AUTOGROUP.exists() else ""
    return said, os.getpid(), os.getsid(0), os.nice(0), autogroup


def _in_a_spawned_process() -> tuple[str, int, int, int, str]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_yield_and_report).result(timeout=60)


def test_the_generator_runs_in_a_session_of_its_own_at_a_lower_priority() -> None:
    nice_before = os.nice(0)
    said, pid, sid, nice, autogroup = _in_a_spawned_process()
    assert sid == pid  # its own session, so its own autogroup: the bench's reader keeps its priority
    assert nice == nice_before + GENERATOR_NICE
    assert said.startswith("own session, ")
    assert said.endswith(f", nice {nice}")
    if autogroup:  # a kernel with autogroup scheduling: the session's weight is what counts between sessions
        assert autogroup.endswith(f"nice {GENERATOR_NICE}")
        assert f"autogroup nice {GENERATOR_NICE}" in said


def test_the_process_that_starts_the_generator_keeps_its_priority() -> None:
    autogroup_before = _AUTOGROUP.read_text() if _AUTOGROUP.exists() else ""
    sid_before, nice_before = os.getsid(0), os.nice(0)
    _in_a_spawned_process()
    assert (os.getsid(0), os.nice(0)) == (sid_before, nice_before)
    assert (_AUTOGROUP.read_text() if _AUTOGROUP.exists() else "") == autogroup_before
