"""Stop signals reach their handler on the relay's thread, not in a signal handler (real subprocesses).

A Python handler runs on the main thread wherever it is, also inside ``Event.wait``'s locked section; an
``Event.set`` there waits for ever for the lock its own thread holds (a CI run's wrapper hung so).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SIGNALLED_INSIDE_THE_LOCK = textwrap.dedent(
    """
    import os, signal, threading, time
    {install}
    stop = threading.Event()
    install(lambda signum: stop.set())  # what Deduper.shutdown() does (the audit scheduler: a queue's lock)

    with stop._cond:  # held as Event.wait holds it around its timed wait
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # bytecodes: a Python-level handler runs among them, on this thread
            pass
        time.sleep(0.2)
    print("stopped", stop.wait(10))
    """
)

_RELAYED = "from ferryman.signals import on_signals as install"
_IN_THE_HANDLER = "def install(fn):\n    signal.signal(signal.SIGTERM, lambda signum, _frame: fn(signum))"


def _run(install: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    code = _SIGNALLED_INSIDE_THE_LOCK.format(install=install)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=False)


def test_a_stop_signal_arriving_while_the_main_thread_holds_the_stop_events_lock_is_handled() -> None:
    done = _run(_RELAYED, 30)
    assert (done.returncode, done.stdout) == (0, "stopped True\n"), done.stderr[-2000:]


def test_the_same_signal_handled_in_a_python_handler_hangs_the_process() -> None:
    """The control: what the relay avoids."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run(_IN_THE_HANDLER, 5)
