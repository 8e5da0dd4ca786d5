"""Broker restarts under running services, for the e2e tests that bounce a cluster pair of their own."""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferryman_local import LocalCluster

from tests.helpers.kafka import assert_exact_copy, create_topic, read_all
from tests.helpers.services import RunningFlow, ServiceProcess, running_flow
from tests.helpers.streams import SequenceProducer

_log = logging.getLogger(__name__)

#: Partitions of each source topic the outage tests make.
PARTITIONS = 4


@dataclass
class Pair:
    """A module's own source and destination clusters (``tests/e2e/conftest.py``'s ``pair``)."""

    source: LocalCluster
    destination: LocalCluster


def streamed_topic(pair: Pair, topic: str, *, per_partition: int, rate_per_s: float) -> tuple[str, SequenceProducer]:
    """A new source topic of PARTITIONS partitions and a paced producer of it (started by the test)."""
    create_topic(pair.source.bootstrap_servers, topic, PARTITIONS)
    producer = SequenceProducer(
        pair.source.bootstrap_servers, [topic], PARTITIONS, per_partition=per_partition, rate_per_s=rate_per_s
    )
    return topic, producer


def flow_over(
    pair: Pair, tmp_path: Path, unique_name: Callable[[str], str], topic: str, **config: Any
) -> AbstractContextManager[RunningFlow]:
    """A wrapper and a deduper replicating topic from the pair's source to its destination (``running_flow``)."""
    return running_flow(pair.source, pair.destination, tmp_path, flow=unique_name("flow"), topics=[topic], **config)


def bounce(cluster: LocalCluster, how: signal.Signals, down_s: float) -> float:
    """Crash (SIGKILL) or stop (SIGTERM) the broker, restart it after down_s; return when it was ready."""
    if how is signal.SIGKILL:
        cluster.kill()
    else:
        cluster.stop()
    _log.info("%s broker down (%s) for %.1f s", cluster.name, how.name, down_s)
    time.sleep(down_s)  # the outage itself: nothing to wait for
    cluster.restart()
    return time.monotonic()


def grpc_port(proc: ServiceProcess) -> int:
    """The gRPC port a service bound (it logs it at start; the latest start's, after a restart)."""
    ports = re.findall(r"gRPC server listening on port (\d+)", proc.output())
    assert ports, proc.output()[-2000:]
    return int(ports[-1])


def check_copy(pair: Pair, flow: RunningFlow, topic: str, producer: SequenceProducer) -> None:
    """Once producer is done: the destination holds an exact copy, both services ran once and stop with 0."""
    producer.join(180)
    assert producer.error is None, producer.error
    src = read_all(pair.source.bootstrap_servers, topic)
    expected = sum(len(v) for v in src.values())
    assert expected == producer.sent
    dst = read_all(pair.destination.bootstrap_servers, f"src.{topic}", expected=expected, timeout_s=180)
    assert_exact_copy(src, dst)
    for proc in (flow.wrapper, flow.deduper):
        assert proc.alive, f"{proc.kind} exited:\n{proc.output()[-4000:]}"
        assert proc.starts == 1
    assert flow.wrapper.terminate() == 0
    assert flow.deduper.terminate() == 0
