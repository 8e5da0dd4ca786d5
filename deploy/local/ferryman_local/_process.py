"""Child JVMs that never outlive the Python process that started them.

Three layers, because each covers a different way of dying:

* every child runs in its own session (process group), so a terminal's Ctrl-C
  reaches Python only and the harness stops the brokers in order, and a
  signal to the group reaches every thread of the JVM;
* an ``atexit`` hook SIGKILLs whatever is still registered when Python exits
  normally (or through an unhandled exception);
* on Linux the child asks the kernel for SIGKILL when its parent dies
  (``PR_SET_PDEATHSIG``, set by ``setpriv --pdeathsig`` before it execs the
  child), which covers SIGKILL of the Python process itself. The kernel ties
  that signal to the *thread* that forked, so all children are forked from one
  long-lived daemon thread, never from short-lived workers such as
  ``start_clusters``'s pool.

Not a ``preexec_fn``: with one, CPython runs Python code in the forked child
before exec (its after-fork hooks clear other threads' thread-locals, whose
``__del__`` may take a lock another thread held at the fork). A CI run hung
20 minutes that way: py4j's connection ``__del__`` logged from the child of a
broker launch in the process that also ran Spark, and waited for ever on a
logging lock.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import IO


def die_with_parent_prefix() -> list[str]:
    """The command prefix that has Linux kill the child when this thread's process dies ([] where unavailable)."""
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")  # util-linux
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


_Request = tuple[list[str], Path, IO[bytes], "dict[str, str] | None", "Future[subprocess.Popen[bytes]]"]


class _Launcher:
    """Forks children from one daemon thread that lives as long as the process."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._prefix = die_with_parent_prefix()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def launch(
        self, cmd: Sequence[str], cwd: Path, output: IO[bytes], env: dict[str, str] | None
    ) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ferryman-local-launcher", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((list(cmd), cwd, output, env, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            cmd, cwd, output, env, done = self._requests.get()
            try:
                proc = subprocess.Popen(
                    [*self._prefix, *cmd],
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except BaseException as exc:
                done.set_exception(exc)
            else:
                with _children_lock:
                    _children.add(proc)
                done.set_result(proc)


_launcher = _Launcher()
_children: set[subprocess.Popen[bytes]] = set()
_children_lock = threading.Lock()


def spawn(
    cmd: Sequence[str], *, cwd: Path, output: IO[bytes], env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a long-running child in its own process group, tied to this process's life.

    Args:
        cmd: program and arguments.
        cwd: working directory of the child.
        output: file receiving the child's stdout and stderr.
        env: variables added to this process's environment for the child.

    Returns:
        The child; end it with ``signal_group``, reap it with ``wait``, then ``forget`` it.
    """
    return _launcher.launch(cmd, cwd, output, {**os.environ, **env} if env else None)


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send sig to the child's process group, if the child is still running."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def forget(proc: subprocess.Popen[bytes]) -> None:
    """Stop tracking a child that has exited."""
    with _children_lock:
        _children.discard(proc)


@atexit.register
def _kill_children() -> None:
    with _children_lock:
        children = list(_children)
        _children.clear()
    for proc in children:
        signal_group(proc, signal.SIGKILL)
    for proc in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)  # SIGKILL takes effect at once; this only reaps the zombie
