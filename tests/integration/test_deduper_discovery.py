"""Discovery without configuration on real clusters: wrappers find the dedupers advertised in the destination.

A pair started from kafka-reo's variables alone (no ``deduper_addresses``) has its control link up; a second
deduper that starts gets a link too, and one that stops (cleanly, or killed) loses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from ferryman.status import deduper_status, wrapper_status
from ferryman.v1 import control_pb2
from ferryman_local import reserve_port

from tests.helpers.grpc_clients import local, when_listening
from tests.helpers.kafka import KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.services import ServiceProcess

pytestmark = pytest.mark.integration

FERRYMAN = Path(sys.executable).parent / "ferryman"
#: Long enough for a cold start of both services and the first advertisement on a busy shared machine.
_LINK_TIMEOUT_S = 90.0


def _wrapper(address: str) -> control_pb2.GetWrapperStatusResponse | None:
    return when_listening(lambda: wrapper_status(address))


def _linked_wrappers(address: str) -> list[str]:
    status = when_listening(lambda: deduper_status(address))
    return list(status.connected_wrappers) if status is not None else []


def test_a_pair_from_the_seed_variables_alone_links_and_follows_scale_out(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    src_topic = unique_name("disc-src")
    dst_topic = unique_name("disc-dst")
    create_topic(source_cluster.bootstrap_servers, src_topic, 2)
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "enable.idempotence": True})
    for i in range(100):
        for part in range(2):
            producer.produce(src_topic, value=f"{part}:{i}".encode(), partition=part)
    assert producer.flush(30) == 0
    wrapper_address, d1_address, d2_address = (local(reserve_port()) for _ in range(3))
    seed = {
        "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS": source_cluster.bootstrap_servers,
        "KAFKA_CLUSTERS_SOURCE_TOPIC": src_topic,
        "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS": destination_cluster.bootstrap_servers,
        "KAFKA_CLUSTERS_DESTINATION_TOPIC": dst_topic,
        "APPLICATION_NAME": unique_name("disc"),
        # Loopback ports of our own: the documented defaults may be taken on a shared machine. No deduper
        # address anywhere: the dedupers advertise their listen address and the wrapper finds it.
        "FERRYMAN_WRAPPER__LISTEN_ADDRESS": wrapper_address,
        "FERRYMAN_WRAPPER__METRICS_ADDRESS": "127.0.0.1:0",
        "FERRYMAN_DEDUPER__METRICS_ADDRESS": "127.0.0.1:0",
        # Heartbeats every second, so a deduper that stops is seen gone within the test's patience.
        "FERRYMAN_DEDUPER__ADVERTISE_INTERVAL_S": "1",
    }
    deduper1 = ServiceProcess(
        "deduper",
        None,
        tmp_path,
        env=seed | {"FERRYMAN_DEDUPER__INSTANCE_ID": "disc1", "FERRYMAN_DEDUPER__LISTEN_ADDRESS": d1_address},
    )
    deduper2 = ServiceProcess(
        "deduper",
        None,
        tmp_path,
        env=seed | {"FERRYMAN_DEDUPER__INSTANCE_ID": "disc2", "FERRYMAN_DEDUPER__LISTEN_ADDRESS": d2_address},
    )
    wrapper = ServiceProcess("wrapper", None, tmp_path, env=seed)
    services = [deduper1, wrapper, deduper2]

    def logs() -> str:
        return "\n".join(f"--- {s.kind} (alive={s.alive}):\n{s.output()[-3000:]}" for s in services)

    try:
        wrapper.start()  # first: it finds no deduper yet, and must pick one up when it appears
        deduper1.start()
        try:
            wait_until(
                lambda: (s := _wrapper(wrapper_address)) is not None and s.control_connected,
                _LINK_TIMEOUT_S,
                message="wrapper's control link up",
            )
            status = _wrapper(wrapper_address)
            assert status is not None
            assert wait_until(lambda: status.wrapper_id in _linked_wrappers(d1_address), 30, message="deduper 1 link")
            dst = read_all(destination_cluster.bootstrap_servers, dst_topic, expected=200, timeout_s=90)
            assert_exact_copy(read_all(source_cluster.bootstrap_servers, src_topic), dst)
            # What an operator sees: the CLI, as a subprocess, reports the link up.
            cli = subprocess.run(
                [str(FERRYMAN), "status", "--server", wrapper_address, "--output", "json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert cli.returncode == 0, cli.stderr
            assert json.loads(cli.stdout)["control_connected"] is True

            deduper2.start()  # scale-out: no address list to change
            wait_until(lambda: status.wrapper_id in _linked_wrappers(d2_address), _LINK_TIMEOUT_S, message="d2 link")
            assert status.wrapper_id in _linked_wrappers(d1_address)

            gone = f"deduper at {d2_address} is gone"
            assert deduper2.terminate() == 0  # a clean stop's tombstone: the wrapper stops dialling it
            wrapper.wait_for_log(gone, timeout_s=30)
            assert (s := _wrapper(wrapper_address)) is not None and s.control_connected

            deduper2.start()  # back, then crashed: no tombstone, its heartbeat expires (3 intervals)
            wait_until(lambda: status.wrapper_id in _linked_wrappers(d2_address), _LINK_TIMEOUT_S, message="d2 back")
            deduper2.kill9()
            wait_until(lambda: wrapper.output().count(gone) == 2, 30, message="crashed deduper's link dropped")
            assert status.wrapper_id in _linked_wrappers(d1_address)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs()}") from None
    finally:
        for service in services:
            service.stop()
