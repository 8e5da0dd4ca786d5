"""A deliberately broken deduper, to prove the chaos checker bites. Test-only: never on a production path.

A test puts this directory first on ``PYTHONPATH`` of the deduper processes with
``FERRYMAN_TEST_BREAK`` naming the breakage:

* ``state-outside-transaction``: the transaction carries no ``WatermarkState`` (nor offset-map)
  records, so a deduper that takes partitions over (a restart, a rebalance, a fenced zombie)
  restores watermarks that are not those of the committed records;
* ``offsets-outside-transaction``: the staging offsets are committed on the consumer, outside
  (before) the transaction, instead of with ``send_offsets_to_transaction``: a transaction that
  then aborts has moved the staging position on anyway.

Any other process (the wrapper) is left alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

_BREAK = os.environ.get("FERRYMAN_TEST_BREAK", "")

if _BREAK and os.path.basename(sys.argv[0]) == "ferryman-deduper":
    from confluent_kafka import TopicPartition
    from ferryman_deduper import _transaction

    _real_commit = _transaction.Transaction.commit

    def _broken_commit(
        self: _transaction.Transaction,
        *,
        staging_topic: str,
        group_metadata: Callable[[], object],
        write_state: Callable[[], None],
        commit_consumer_offsets: Callable[[list[TopicPartition]], object],
        offsets_metadata: str = "",
        in_callback: bool = False,
    ) -> Any:
        if _BREAK == "state-outside-transaction":
            write_state = lambda: None  # noqa: E731  # the breakage: no state in the transaction
        elif _BREAK == "offsets-outside-transaction" and self.next_offsets:
            offsets = [TopicPartition(staging_topic, sp, nxt) for sp, nxt in self.next_offsets.items()]
            commit_consumer_offsets(offsets)  # the breakage: committed before, outside the transaction
            self.next_offsets.clear()
        return _real_commit(
            self,
            staging_topic=staging_topic,
            group_metadata=group_metadata,
            write_state=write_state,
            commit_consumer_offsets=commit_consumer_offsets,
            offsets_metadata=offsets_metadata,
            in_callback=in_callback,
        )

    _transaction.Transaction.commit = _broken_commit  # type: ignore[method-assign]
