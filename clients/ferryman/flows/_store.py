"""The flow store: a cluster's replication flows in its compacted topic ``ferryman.flows.internal``.

Key: the flow name; value: a serialized ``ferryman.v1.Flow``; a tombstone deletes it. One
partition, so every write has one order.

**Linearizable writes across processes.** Every writer of a cluster's store uses the same
``transactional.id`` (`FLOWS_STORE_TRANSACTIONAL_ID`). A write builds a transactional producer
and calls ``init_transactions``, which fences every earlier producer of that id: a concurrent
write still open is aborted, one committing is completed first. It then reads the store to its
end (``read_committed``: exactly what was committed before the fence), checks the change
against it (existence, etag), writes it in a transaction and commits. A writer fenced between
its read and its commit wrote nothing; it starts again from a fresh read, a few times, and
then gives up with `FlowStoreBusyError` (ABORTED). Admin writes are rare and a person waits
for them, so a producer per write (~0.1-0.5 s) is an affordable price for that simplicity.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from ferryman import topics
from ferryman.client_config import base_config
from ferryman.config import ClusterConfig
from ferryman.deadline import NO_DEADLINE, Deadline
from ferryman.errors import FlowStoreBusyError, KafkaOperationError
from ferryman.kafka_errors import authorization_error
from ferryman.naming import FLOWS_STORE_TRANSACTIONAL_ID, FLOWS_TOPIC
from ferryman.state import COMPACTED_TOPIC_CONFIGS, read_compacted
from ferryman.topics import InternalTopic
from ferryman.v1 import flows_pb2

_log = logging.getLogger(__name__)

#: Writes tried before a fenced writer gives up (each fence means another write just won).
_WRITE_ATTEMPTS = 5

#: Why a write ended when the cluster kept failing it (not other writers).
_NO_SUCCESS = f"no success in {_WRITE_ATTEMPTS} attempts"

#: Pause before trying again after a fence: long enough for the winner's commit to land.
_FENCED_BACKOFF_S = 0.2

#: The change a write makes: (flow name, new value or None to delete), or None to write nothing.
Change = tuple[str, flows_pb2.Flow | None] | None


def decode(records: dict[bytes, bytes | None]) -> dict[str, flows_pb2.Flow]:
    """The flows of store records (tombstones dropped)."""
    out: dict[str, flows_pb2.Flow] = {}
    for key, value in records.items():
        if value is None:
            continue
        flow = flows_pb2.Flow()
        flow.ParseFromString(value)
        out[key.decode()] = flow
    return out


def _fenced(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError):
        return False
    return err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH) or bool(
        err.fatal()
    )


class FlowStore:
    """The flow store of one cluster; `write` is safe from any number of threads and processes."""

    def __init__(self, alias: str, cluster: ClusterConfig, *, client_id: str, timeout_s: float = 30.0) -> None:
        """A store in cluster (alias); nothing is read or created until the first call.

        Args:
            alias: the cluster's alias (in errors and logs).
            cluster: how to reach it.
            client_id: librdkafka client.id prefix of the store's clients.
            timeout_s: budget of one read or one write attempt.
        """
        self.alias = alias
        self._cluster = cluster
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # one write of this process at a time: no self-fencing

    def ensure_topic(self) -> None:
        """Create the store topic if it is missing (one partition, compacted).

        Raises:
            TopicShapeError: it exists with another shape.
        """
        admin = AdminClient(base_config(self._cluster, f"{self._client_id}-flows-admin"))
        topics.ensure_internal_topics(
            admin, [InternalTopic(FLOWS_TOPIC, 1, COMPACTED_TOPIC_CONFIGS, "flow store")], self._timeout_s
        )

    def exists(self, deadline: Deadline = NO_DEADLINE) -> bool:
        """True when the cluster has a store topic (no store: no flows)."""
        what = f"listing the topics of cluster {self.alias!r}"
        admin = AdminClient(base_config(self._cluster, f"{self._client_id}-flows-admin"))
        try:
            # Described, not looked up in a metadata request: that could auto-create the topic.
            return FLOWS_TOPIC in topics.describe_topics(admin, [FLOWS_TOPIC], deadline.budget(self._timeout_s, what))
        except KafkaException as exc:
            raise KafkaOperationError(what, exc) from exc

    def read(self, deadline: Deadline = NO_DEADLINE) -> dict[str, flows_pb2.Flow]:
        """Every flow committed to the store, by name.

        Raises:
            KafkaOperationError: the end of the store was not reached in time.
        """
        what = f"reading the flow store of cluster {self.alias!r}"
        conf = base_config(self._cluster, f"{self._client_id}-flows-read")
        conf["group.id"] = "ferryman-flows-read"  # never commits: only satisfies librdkafka
        try:
            return decode(read_compacted(conf, FLOWS_TOPIC, [0], deadline.budget(self._timeout_s, what))[0])
        except KafkaException as exc:
            raise KafkaOperationError(what, exc) from exc

    def write(
        self, change: Callable[[dict[str, flows_pb2.Flow]], Change], deadline: Deadline = NO_DEADLINE
    ) -> dict[str, flows_pb2.Flow]:
        """Apply change to the store, atomically with respect to every other writer.

        change gets the flows as committed at the moment this writer fenced the others and
        returns what to write (or raises to refuse; nothing is written then). It may be called
        again with newer flows when another writer won.

        Returns:
            The flows after the write.

        Raises:
            FlowStoreBusyError: other writers won every attempt.
            KafkaOperationError: the cluster did not answer within the budget or the deadline. Nothing
                was written, unless the commit itself was cut short (said in the message): a write is
                never retried past its deadline.
            Whatever change raised.
        """
        what = f"writing the flow store of cluster {self.alias!r}"
        with self._lock:
            for attempt in range(_WRITE_ATTEMPTS):
                try:
                    return self._attempt(change, deadline)
                except KafkaException as exc:
                    # Before the fencing check: librdkafka files a missing transactional-id ACL as fatal.
                    denied = authorization_error(
                        exc, operation="write the flow store", resource=FLOWS_STORE_TRANSACTIONAL_ID
                    )
                    if denied is not None:
                        raise denied from exc
                    fenced = _fenced(exc)
                    if not (fenced or exc.args[0].retriable() or exc.args[0].txn_requires_abort()):
                        raise KafkaOperationError(what, exc) from exc
                    expired = deadline.cap(1.0) <= 0
                    if not fenced and (expired or attempt == _WRITE_ATTEMPTS - 1):
                        # The cluster did not answer (a broker down): not other writers, whatever the count.
                        why = "no answer within the call's deadline" if expired else _NO_SUCCESS
                        raise KafkaOperationError(f"{what}: {why}", exc) from exc
                    _log.info("flow store write %d fenced or interrupted (%s); reading again", attempt + 1, exc)
                time.sleep(deadline.cap(_FENCED_BACKOFF_S * (attempt + 1)))  # let the winning write commit
        raise FlowStoreBusyError(
            f"the flow store of cluster {self.alias!r} was written by others {_WRITE_ATTEMPTS} times during this "
            "write; try again"
        )

    def _attempt(
        self, change: Callable[[dict[str, flows_pb2.Flow]], Change], deadline: Deadline
    ) -> dict[str, flows_pb2.Flow]:
        what = f"writing the flow store of cluster {self.alias!r}"
        conf: dict[str, Any] = base_config(self._cluster, f"{self._client_id}-flows-write")
        conf.update(
            {
                "transactional.id": FLOWS_STORE_TRANSACTIONAL_ID,
                "enable.idempotence": True,
                "acks": "all",
                # A writer that dies mid-write holds the next one up at most this long.
                "transaction.timeout.ms": 10_000,
                "linger.ms": 0,
            }
        )
        producer = Producer(conf)
        try:
            producer.init_transactions(deadline.budget(self._timeout_s, what))
            flows = self.read(deadline)
            wanted = change(flows)
            if wanted is None:
                return flows
            name, flow = wanted
            producer.begin_transaction()
            producer.produce(FLOWS_TOPIC, key=name.encode(), value=None if flow is None else flow.SerializeToString())
            try:
                producer.commit_transaction(deadline.budget(self._timeout_s, what))
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._TIMED_OUT:
                    raise
                # Cut short while committing: the coordinator may still complete it. Not retried.
                raise KafkaOperationError(
                    f"{what}: no answer to the commit in time; it may still be applied (read the flow again)", exc
                ) from exc
        finally:
            producer.flush(0)
        if flow is None:
            flows.pop(name, None)
        else:
            flows[name] = flow
        return flows
