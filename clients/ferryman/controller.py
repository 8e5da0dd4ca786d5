"""Admin requests that follow a lost controller.

librdkafka sends most admin requests (CreateTopics, CreatePartitions, DescribeTopics, DescribeConfigs,
DescribeCluster) to the node its last metadata named as the controller, and waits for that node to be
up. A KRaft broker names any live broker there, but nothing refreshes an admin client's metadata when
that node dies: the request waits until the node is back or its own timeout ends ("Timed out waiting for
controller"; a deduper's restore waited 29 s with one destination node of three killed, 2026-12-05). A
request unanswered after CONTROLLER_WAIT_S has the client's metadata refreshed, in the background, and
again every CONTROLLER_WAIT_S while it waits (until the cluster has fenced the dead node, a few seconds,
a refresh may name it again): the live controller a refresh names takes the waiting request at once.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ferryman.renewing_admin import suspect_client

_log = logging.getLogger(__name__)

#: How long an admin request may wait before its client's metadata is refreshed (a healthy one takes ms).
CONTROLLER_WAIT_S = 2.0
#: Budget of that refresh (one metadata request to any live broker).
REFRESH_TIMEOUT_S = 10.0

_lock = threading.Lock()
_refreshing: set[int] = set()


def refresh(admin: AdminClient, timeout_s: float = REFRESH_TIMEOUT_S) -> bool:
    """Refresh admin's metadata in a thread of its own; at most one refresh per client at a time.

    Never blocks: the caller goes on waiting for its request, which the refreshed controller takes.

    Returns:
        Whether a refresh was started (False: one is under way).
    """
    key = id(admin)
    with _lock:
        if key in _refreshing:
            return False
        _refreshing.add(key)

    def run() -> None:
        try:
            controller = admin.list_topics(timeout=timeout_s).controller_id
            _log.debug("admin metadata refreshed: the controller is node %d", controller)
        except KafkaException as exc:
            _log.debug("admin metadata not refreshed: %s", exc)
            suspect_client(admin)  # the cluster away, or this client stuck: a client that renews checks itself
        finally:
            with _lock:
                _refreshing.discard(key)

    threading.Thread(target=run, name="ferryman-controller-refresh", daemon=True).start()
    return True
