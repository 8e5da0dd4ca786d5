"""The deduper's data clients keep the properties exactly-once rests on, whatever a cluster's client_config says."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message
from ferryman.config import ClusterConfig, DeduperConfig
from ferryman_deduper._clients import producer_config, staging_consumer_config

#: A cluster whose client_config tries to loosen what the deduper depends on.
_LOOSE = ClusterConfig(
    bootstrap_servers="localhost:1",
    client_config={
        "security.protocol": "plaintext",
        "isolation.level": "read_uncommitted",
        "enable.auto.commit": True,
        "acks": 1,
        "enable.idempotence": False,
        "group.instance.id": "someone-else",
    },
)
_DC = DeduperConfig(transaction_timeout_ms=45_000, session_timeout_ms=12_000, max_message_bytes=2_000_000)


def _error_cb(_err: KafkaError) -> None:
    pass


def _on_delivery(_err: KafkaError | None, _msg: Message) -> None:
    pass


def _on_produce_failed(_topic: str, _partition: int, _reason: str) -> None:
    pass


def test_the_exactly_once_producer_is_transactional_idempotent_and_has_no_report_per_record() -> None:
    conf = producer_config(
        _LOOSE,
        "p",
        _DC,
        transactional_id="ferryman-f-d1",
        error_cb=_error_cb,
        on_delivery=_on_delivery,
        on_produce_failed=_on_produce_failed,
    )
    assert conf["transactional.id"] == "ferryman-f-d1"
    assert conf["transaction.timeout.ms"] == 45_000
    assert (conf["enable.idempotence"], conf["acks"]) == (True, "all")
    assert conf["message.max.bytes"] == 2_000_000
    assert "on_delivery" not in conf
    assert conf["security.protocol"] == "plaintext"  # the cluster's own settings stay


def test_the_at_least_once_producer_reports_every_record_and_has_no_transactions() -> None:
    conf = producer_config(
        _LOOSE,
        "p",
        _DC,
        transactional_id=None,
        error_cb=_error_cb,
        on_delivery=_on_delivery,
        on_produce_failed=_on_produce_failed,
    )
    assert conf["on_delivery"] is _on_delivery
    assert "transactional.id" not in conf
    assert "transaction.timeout.ms" not in conf
    assert (conf["enable.idempotence"], conf["acks"]) == (True, "all")


def test_the_staging_consumer_reads_committed_and_commits_only_in_transactions() -> None:
    conf = staging_consumer_config(
        _LOOSE,
        "c",
        _DC,
        group_id="ferryman-f-deduper",
        instance_id="d1",
        on_session_timeout=lambda: None,
        error_cb=_error_cb,
    )
    assert conf["isolation.level"] == "read_committed"
    assert (conf["enable.auto.commit"], conf["enable.auto.offset.store"]) == (False, False)
    assert (conf["group.id"], conf["group.instance.id"]) == ("ferryman-f-deduper", "d1")
    assert conf["session.timeout.ms"] == 12_000
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["auto.offset.reset"] == "earliest"  # a gap is then seen by the envelope chain, never skipped
