"""Deadlines that hold for blocking librdkafka calls.

librdkafka's blocking calls take a timeout and almost always honour it. Where
one does not (``send_offsets_to_transaction`` waiting for a group coordinator
librdkafka dropped from its cache after a broker restart, librdkafka #5511:
measured here, more than four minutes with a 30 s timeout), the thread that
made it is stuck inside C code and no Python can interrupt it. So the calls run
on a worker thread, and the caller waits with a deadline of its own. A call
that overruns it is abandoned together with its client: the worker thread, the
client object and everything it holds are parked for the life of the process
(destroying a client whose call is in flight would block, or crash), and the
caller builds a new client. For a transactional producer that is also the
recovery: the new producer's ``init_transactions`` with the same
``transactional.id`` fences the abandoned one and completes or aborts its open
transaction on the broker.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from ferryman.errors import WedgedCallError

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: Time a call is given beyond its own librdkafka timeout before it counts as
#: wedged: the C library returns a timed-out call within milliseconds of its
#: timeout, but a loaded 2-core machine can hold the returning thread back for
#: a second or so.
GRACE_S = 3.0

#: Abandoned calls (and their clients) a process tolerates: each parks a thread
#: and a client's buffers for good. Past this, the process is better restarted.
MAX_ABANDONED = 8


#: Clients given up without being closed, kept alive for the life of the process:
#: closing a consumer in a fatal state (a static member fenced) never returns
#: (confluent-kafka-go #1588 fixed the same wait in Go), and neither would the
#: close its destructor does.
_PARKED: list[object] = []


def park(client: object) -> None:
    """Give a client up without closing it (it is never used or closed again)."""
    _PARKED.append(client)


def close_or_park(close: Callable[[], object], client: object, *, what: str, deadline_s: float) -> None:
    """Close a client, giving it up if the close does not return within deadline_s."""
    watchdog = Watchdog(what)
    try:
        watchdog.call(close, what=what, deadline_s=deadline_s, client=client)
    except WedgedCallError:
        park(watchdog)
    except Exception as exc:  # a failed close leaves nothing to do
        _log.warning("%s: %s", what, exc)
    finally:
        watchdog.shutdown()


class _Worker:
    """One daemon thread running submitted calls in order.

    Not concurrent.futures' pool: its threads are joined at interpreter exit, so
    a wedged call would keep the process from ever exiting.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((fn, future))
        return future

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who decides
                future.set_exception(exc)

    def stop(self) -> None:
        self._calls.put(None)


class Watchdog:
    """Runs blocking calls of one client on a worker thread, each under a deadline.

    Calls are serialised (one worker). After a call is abandoned, the next call
    gets a fresh worker; the caller must not use the abandoned client again.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._worker = _Worker(f"watchdog-{name}")
        self._lock = threading.Lock()
        #: Workers, clients and futures of abandoned calls, kept alive on purpose (see the module doc).
        self.abandoned: list[tuple[_Worker, object, Future[Any]]] = []

    def call(self, fn: Callable[[], T], *, what: str, deadline_s: float, client: object = None) -> T:
        """Run fn() and return its result, or raise what it raised.

        Args:
            fn: the blocking call (it must honour a timeout of its own, shorter
                than deadline_s; the deadline is only the safety net).
            what: names the call in logs and errors.
            deadline_s: how long to wait before abandoning the call.
            client: the client fn uses, parked with the call if it is abandoned.

        Raises:
            WedgedCallError: fn did not return within deadline_s; do not use
                client again.
        """
        with self._lock:
            future = self._worker.submit(fn)
            try:
                return future.result(timeout=deadline_s)
            except FutureTimeout:
                self._abandon(future, client, what, deadline_s)
                raise WedgedCallError(what, deadline_s) from None

    def _abandon(self, future: Future[T], client: object, what: str, deadline_s: float) -> None:
        self.abandoned.append((self._worker, client, future))
        self._worker.stop()  # it exits if the call ever returns
        self._worker = _Worker(f"watchdog-{self._name}")
        _log.error(
            "%s: %s did not return within %g s (librdkafka overran its own timeout); abandoning the client "
            "(%d abandoned so far)",
            self._name,
            what,
            deadline_s,
            len(self.abandoned),
        )

    @property
    def exhausted(self) -> bool:
        """True once MAX_ABANDONED calls were abandoned: restart the process to reclaim them."""
        return len(self.abandoned) >= MAX_ABANDONED

    def shutdown(self) -> None:
        """Let the worker thread end (after a call in progress, if any)."""
        self._worker.stop()
