"""Rows run together (``--together``): they launch in step, and a row that fails never holds the others."""

from __future__ import annotations

import threading
import time

import pytest

from bench.config import parse_args
from bench.together import Gate, run_together


def test_rows_pass_each_step_together() -> None:
    arrived: dict[str, list[float]] = {"a": [], "b": []}
    passed: dict[str, list[float]] = {"a": [], "b": []}
    a_arrived = [threading.Event(), threading.Event()]

    def step(name: str, gate: Gate, i: int) -> None:
        if name == "b":
            assert a_arrived[i].wait(5)  # b comes later to each step (a slower preparation, a slower copy)
        arrived[name].append(time.monotonic())
        if name == "a":
            a_arrived[i].set()
        gate.wait()
        passed[name].append(time.monotonic())

    def run(name: str, gate: Gate) -> str:
        step(name, gate, 0)  # launch
        step(name, gate, 1)  # audit
        return name.upper()

    assert run_together(["a", "b"], run, timeout_s=5) == ["A", "B"]
    for i in (0, 1):  # neither row passes a step before the other has reached it
        assert passed["a"][i] >= arrived["b"][i]
        assert passed["b"][i] >= arrived["a"][i]


def test_a_row_that_fails_or_is_unavailable_lets_the_others_go_on() -> None:
    waited: list[float] = []

    def run(name: str, gate: Gate) -> str:
        if name == "broken":
            raise RuntimeError("prepare failed")
        if name == "unavailable":
            return "unavailable"  # returns before its first step, as run_row does
        t = time.monotonic()
        gate.wait()
        gate.wait()
        waited.append(time.monotonic() - t)
        return name

    with pytest.raises(RuntimeError, match="prepare failed"):
        run_together(["ok", "broken"], run, timeout_s=30)
    assert run_together(["ok", "unavailable"], run, timeout_s=30) == ["ok", "unavailable"]
    assert max(waited) < 5  # released by the row that left, not by the 30 s timeout


def test_a_gate_wait_times_out_instead_of_hanging() -> None:
    gate = Gate(2, timeout_s=0.2)
    t = time.monotonic()
    gate.wait()  # the other row never comes
    assert 0.15 < time.monotonic() - t < 5
    done = threading.Event()

    def wait_again() -> None:
        gate.wait()
        done.set()

    threading.Thread(target=wait_again).start()
    assert done.wait(1)  # broken for good: later waits return at once


def test_together_needs_two_rows_and_no_dropped_copies_and_runs_no_latency_phase() -> None:
    cfg = parse_args(["--together", "--rows", "ferryman-bare,ferryman-trace1"])
    assert cfg.together and cfg.latency_duration_s == 0
    assert not parse_args(["--rows", "ferryman-bare,ferryman-trace1"]).together
    with pytest.raises(SystemExit):
        parse_args(["--together", "--rows", "ferryman-bare"])
    with pytest.raises(SystemExit):
        parse_args(["--together", "--rows", "ferryman-bare,ferryman-trace1", "--drop-copies"])
