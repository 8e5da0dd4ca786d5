"""Holds one Kafka call of a Ferryman service at a chosen moment until a test lets it go.

A test puts this directory first on ``PYTHONPATH`` of one service process, with
``FERRYMAN_TEST_HOLD_CALL`` naming the call and ``FERRYMAN_TEST_HOLD_MARKER`` a
marker file:

* ``commit_transaction``, ``send_offsets_to_transaction``, ``init_transactions``:
  the deduper's transactional call of that name (``Transaction.call``);
* ``source-commit``: the wrapper's periodic source offset commit;
* ``revoke-commit-wedged``: the wrapper's first hand-over commit of revoked
  partitions (in the rebalance callback); once released it is not made and the
  wrapper gives its consumer up, as after a commit that never returned: a
  consumer given up halfway through a cooperative rebalance.
* ``flow-store-commit``: the commit of a flow-store write (``FlowStore``), its record
  produced in the open transaction;
* ``consumer-left-out``: once the wrapper has sent ``FERRYMAN_TEST_HOLD_AFTER`` records,
  its source consumer's session-timeout hook fires (as librdkafka's ``SESSTMOUT`` line
  makes it) and the consumer reads nothing more and is assigned nothing (its partitions
  paused, no rebalance): how librdkafka can leave a consumer for ~60 s after a broker
  freeze. Nothing waits for SIGUSR1; the marker says when it happened.

The ``FERRYMAN_TEST_HOLD_AFTER``-th such call (default 10: replication is in
full swing by then) creates the marker and waits, before it is made, until the
process gets SIGUSR1. So a test can kill a broker exactly while that call is
due, release it to run against the dead broker, and restart the broker while it
is in progress. Everything else in the process is the real service.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ferryman.signals import on_signals

_CALL = os.environ["FERRYMAN_TEST_HOLD_CALL"]
_MARKER = Path(os.environ["FERRYMAN_TEST_HOLD_MARKER"])
_AFTER = int(os.environ.get("FERRYMAN_TEST_HOLD_AFTER", "10"))
_HOLD_LIMIT_S = 300.0  # never hang a forgotten process for ever
#: Set on SIGUSR1 by `ferryman.signals`' relay thread, never in a signal handler: there an Event.set() met
#: the lock the main thread's own Event.wait() held, and a CI run's wrapper never let go.
_release = threading.Event()
_calls = itertools.count(1)


def _hold() -> None:
    _MARKER.touch()
    _release.wait(_HOLD_LIMIT_S)  # whichever thread holds: the relay sets it
    _MARKER.with_suffix(".released").touch()


def _due() -> bool:
    return next(_calls) == _AFTER


if _CALL == "consumer-left-out":
    from ferryman.kafka_errors import FenceWindow
    from ferryman_wrapper import _wrapper

    _real_built = FenceWindow.consumer_built
    _hooks: list[Callable[[], None]] = []

    def _built(self: FenceWindow) -> Callable[[], None]:
        hook = _real_built(self)
        _hooks.append(hook)
        return hook

    _real_step = _wrapper.Wrapper._step

    def _step(self: _wrapper.Wrapper) -> None:
        if not _MARKER.exists() and self.records_sent >= _AFTER:
            _MARKER.touch()
            _hooks[-1]()
            consumer = self._clients.consumer
            consumer.pause(consumer.assignment())
        _real_step(self)

    FenceWindow.consumer_built = _built  # type: ignore[method-assign]
    _wrapper.Wrapper._step = _step  # type: ignore[method-assign]
elif _CALL == "flow-store-commit":
    from confluent_kafka import Producer
    from ferryman.flows import _store

    class _HeldProducer(Producer):
        def commit_transaction(self, *args: Any) -> None:
            if _due():
                self.flush(10)  # the write is on the broker, inside the open transaction
                _hold()
            super().commit_transaction(*args)

    _store.Producer = _HeldProducer  # type: ignore[attr-defined]
elif _CALL in ("source-commit", "revoke-commit-wedged"):
    from ferryman_wrapper import _commits

    _real_commit = _commits.SourceCommits.commit
    _real_hand_over = _commits.SourceCommits.hand_over
    _revokes = itertools.count(1)

    def _held_commit(self: _commits.SourceCommits, keys: Any = None, *, synchronous: bool = True) -> None:
        if _CALL == "source-commit" and not synchronous and _due():
            _hold()
        _real_commit(self, keys, synchronous=synchronous)

    def _held_hand_over(self: _commits.SourceCommits, keys: Any) -> None:
        if _CALL == "revoke-commit-wedged" and next(_revokes) == 1:
            _hold()
            self.wedged = True
            return
        _real_hand_over(self, keys)

    _commits.SourceCommits.hand_over = _held_hand_over  # type: ignore[method-assign]
    _commits.SourceCommits.commit = _held_commit  # type: ignore[method-assign]
else:
    from ferryman_deduper import _transaction

    _real_call = _transaction.Transaction.call

    def _held_call(self: _transaction.Transaction, fn: Callable[[], Any], what: str) -> Any:
        if what == _CALL and _due():
            _hold()
        return _real_call(self, fn, what)

    _transaction.Transaction.call = _held_call  # type: ignore[method-assign]

on_signals(lambda _signum: _release.set(), [signal.SIGUSR1])  # at start-up, on the main thread
