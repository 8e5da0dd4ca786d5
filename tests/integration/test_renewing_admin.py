"""An admin client that alone gets no answer is replaced by a new one (ferryman.renewing_admin, real broker).

The state it mends (a client whose broker handles stay unusable after a broker restart while a new
client on the same bootstrap answers at once) came up in a chaos run and cannot be made on demand. Here
the first client is one bootstrapped to a port nothing listens on: like the stuck one, it gets no answer
for good, while every new client the holder makes reaches the real broker.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from ferryman.renewing_admin import RenewingAdmin

from tests.helpers.kafka import KafkaCluster, wait_until
from tests.helpers.tcp_proxy import closed_port

pytestmark = pytest.mark.integration


def _maker(bootstraps: list[str]) -> tuple[list[str], RenewingAdmin]:
    """A holder whose n-th client is bootstrapped to bootstraps[n] (the last one for every later client)."""
    made: list[str] = []

    def make() -> AdminClient:
        made.append(bootstraps[min(len(made), len(bootstraps) - 1)])
        return AdminClient({"bootstrap.servers": made[-1], "allow.auto.create.topics": False})

    return made, RenewingAdmin(
        make, what="the test's admin client", check_interval_s=0.0, probe_timeout_s=2.0, confirm_timeout_s=2.0
    )


def test_a_client_that_alone_gets_no_answer_is_replaced_and_one_that_answers_is_kept(
    source_cluster: KafkaCluster,
) -> None:
    dead = f"127.0.0.1:{closed_port()}"
    made, admin = _maker([dead, source_cluster.bootstrap_servers])
    stuck = admin.client
    admin.suspect()  # a caller's call failed: checked on a thread of its own
    wait_until(lambda: admin.client is not stuck, 30, message="the client that gets no answer replaced")
    assert admin.renewals == 1
    assert made == [dead, source_cluster.bootstrap_servers]
    assert admin.client.list_topics(timeout=10).brokers  # the new one reaches the cluster
    assert admin.check() is False  # a client that answers is kept
    assert admin.renewals == 1 and len(made) == 2


def test_while_no_client_gets_an_answer_the_client_is_kept_and_one_candidate_is_made() -> None:
    made, admin = _maker([f"127.0.0.1:{closed_port()}"])  # the cluster away: no new client answers either
    first = admin.client
    assert admin.check() is False
    assert admin.check() is False
    assert admin.client is first and admin.renewals == 0
    assert len(made) == 2  # the first client and one candidate, kept across checks (no client per check)
