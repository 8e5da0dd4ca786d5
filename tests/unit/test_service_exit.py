"""A service process never outlives its drain by more than ``exit_within``'s deadline (real subprocesses)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

_WEDGED = textwrap.dedent(
    """
    import threading
    from ferryman.service import exit_within

    def wedged_in_a_client_call():
        threading.Event().wait()  # never set: a call that never returns

    threading.Thread(target=wedged_in_a_client_call, name="wedged").start()  # non-daemon: joined at exit
    exit_within({deadline})
    """
)


def _run(code: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return done, time.monotonic() - started


def test_a_thread_holding_the_exit_is_cut_at_the_deadline_with_its_stack_on_stderr() -> None:
    done, took = _run(_WEDGED.format(deadline=1.0))
    assert done.returncode == 1
    assert 1.0 <= took < 20
    assert "wedged_in_a_client_call" in done.stderr  # the stack that held the process
    assert "Timeout (0:00:01)!" in done.stderr


def test_a_clean_exit_is_not_delayed_by_the_deadline() -> None:
    done, took = _run("from ferryman.service import exit_within\nexit_within(30)\nprint('bye')")
    assert (done.returncode, done.stdout, done.stderr) == (0, "bye\n", "")
    assert took < 20


_HOLDING_THE_GIL = textwrap.dedent(
    """
    import ctypes
    from ferryman.service import arm_drain_deadlines

    arm_drain_deadlines(report_s=0.5, kill_s=1.5)
    # A C call that waits holding the GIL, as confluent-kafka's rebalance fallback in librdkafka #4884:
    # through PyDLL the GIL is not released, so no Python code (no handler, no deadline) runs again.
    ctypes.PyDLL(None).sleep(60)
    print("never")
    """
)


def test_a_drain_wedged_holding_the_gil_is_reported_then_ended_by_sigalrm() -> None:
    done, took = _run(_HOLDING_THE_GIL)
    assert done.returncode == -signal.SIGALRM
    assert 1.5 <= took < 20
    assert "Timeout (0:00:00.500000)!" in done.stderr  # the stacks at report_s, written without the GIL
    assert "never" not in done.stdout
