"""kill -9 of the wrapper and the deduper mid-stream, fencing of a second deduper with the same identity."""

from __future__ import annotations

import functools
import os
import random
import re
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict

import pytest
from confluent_kafka import Producer
from ferryman.status import deduper_status

from tests.helpers.grpc_clients import local
from tests.helpers.kafka import KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.services import ServiceProcess, flow_config, running_flow, write_config, write_flow_config
from tests.helpers.streams import SequenceProducer

pytestmark = pytest.mark.e2e

PARTITIONS = 4


class _FlowConfigBase(TypedDict):
    """The ``flow_config`` arguments two dedupers of one flow share."""

    source_bootstrap: str
    destination_bootstrap: str
    flow: str
    topics: Sequence[str]


@pytest.mark.parametrize(
    ("kills_each", "gap_s", "per_partition", "seed"),
    [
        # ~19 s of stream at 2500 records/s (48 000 records), a kill every 1-2.5 s.
        pytest.param(3, (1.0, 2.5), 6000, 20261122, id="3-kills-each"),
        # The long variant (FERRYMAN_NIGHTLY=1): ~80 s of stream (200 000 records), gaps from
        # 0.2 s, so some kills land while the restarted service is still recovering.
        pytest.param(
            12, (0.2, 2.5), 25_000, 20261123, id="12-kills-each-some-while-recovering", marks=pytest.mark.nightly
        ),
    ],
)
def test_kill_9_wrapper_and_deduper_mid_stream(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    kills_each: int,
    gap_s: tuple[float, float],
    per_partition: int,
    seed: int,
) -> None:
    """kill -9 each service ``kills_each`` times at random moments of a paced stream, restarting it at once.

    A gap drawn from ``gap_s`` separates two kills; a short one lands while the
    restarted process is still recovering (init_transactions, restoring its
    watermarks, rejoining the group). The copy must then be exact.
    """
    rng = random.Random(seed)
    topics = [unique_name(f"crash{i}") for i in range(2)]
    for t in topics:
        create_topic(source_cluster.bootstrap_servers, t, PARTITIONS)
    producer = SequenceProducer(
        source_cluster.bootstrap_servers, topics, PARTITIONS, per_partition=per_partition, rate_per_s=2500
    )
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=topics,
        # Far below what one consume batch brings while catching up after a
        # kill: transactions are committed mid-batch on the size budget too.
        deduper={"transaction_max_records": 700},
    ) as f:
        wrapper, deduper = f.wrapper, f.deduper
        deduper.wait_for_log("assigned staging partitions", 60)
        producer.start()
        kills = ["wrapper", "deduper"] * kills_each
        rng.shuffle(kills)

        def reached(mark: int) -> bool:
            return producer.sent >= mark or not producer.is_alive()

        for victim in kills:
            # A random moment mid-stream, by design: the stream's position a gap's worth of records on.
            mark = producer.sent + int(rng.uniform(*gap_s) * producer.rate_per_s)
            wait_until(functools.partial(reached, mark), 30, 0.02, message=f"record {mark} sent")
            assert producer.is_alive(), "the stream ended before every kill happened: slow the producer"
            proc = wrapper if victim == "wrapper" else deduper
            assert proc.alive, proc.output()[-3000:]
            proc.kill9()
            proc.start()
        producer.join(120)
        assert producer.error is None, producer.error
        for t in topics:
            src = read_all(source_cluster.bootstrap_servers, t)
            expected = sum(len(v) for v in src.values())
            dst = read_all(destination_cluster.bootstrap_servers, f"src.{t}", expected=expected, timeout_s=240)
            assert_exact_copy(src, dst)
        assert wrapper.starts == kills_each + 1
        assert deduper.starts == kills_each + 1
        assert wrapper.terminate() == 0
        assert deduper.terminate() == 0


def test_second_deduper_with_same_identity_is_fenced(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("fence")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    cfg = write_flow_config(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
    )
    producer = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=4000, rate_per_s=2000
    )
    wrapper = ServiceProcess("wrapper", cfg, tmp_path).start()
    first = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "same"]).start()
    second = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "same"])
    try:
        first.wait_for_log("assigned staging partitions", 60)
        producer.start()
        time.sleep(2.0)  # let the first instance commit some transactions mid-stream
        second.start()
        assert first.wait_exit(90) == 3, first.output()[-3000:]
        assert "fenced" in first.output().lower()
        producer.join(120)
        assert producer.error is None
        src = read_all(source_cluster.bootstrap_servers, topic)
        expected = sum(len(v) for v in src.values())
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=expected, timeout_s=180)
        assert_exact_copy(src, dst)
        assert second.alive
    finally:
        wrapper.stop()
        first.stop()
        second.stop()


def test_deduper_fenced_while_a_revoke_commits_its_transaction_neither_hangs_nor_duplicates(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The commit made inside the revoke callback fails (fenced) and must be recovered from the loop.

    Deduper "a" holds an open transaction (a long transaction interval, no new
    data). The test takes over a's transactional.id, which aborts that
    transaction, then starts deduper "b" in the same group: the rebalance
    revokes partitions from a, whose revoke-time commit now fails. Recovering
    inside the callback would block on committed() there (it times out in a
    rebalance callback) and stall the group; a must exit as fenced instead,
    and b must then deliver every record exactly once.

    Here the failed commit reports the fence itself. The variant seen once in
    CI, where it surfaced as a generic fatal error first, is not forced by this
    test; the fix (recovery deferred to the loop) covers both.
    """
    topic = unique_name("revoke-fence")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    flow = unique_name("flow")
    common: _FlowConfigBase = {
        "source_bootstrap": source_cluster.bootstrap_servers,
        "destination_bootstrap": destination_cluster.bootstrap_servers,
        "flow": flow,
        "topics": [topic],
    }
    # a's transactions stay open far longer than the test needs to act; b commits as usual.
    cfg_a = write_config(
        tmp_path / "a.yaml",
        flow_config(**common, deduper={"transaction_interval_ms": 120_000, "transaction_timeout_ms": 300_000}),
    )
    cfg_b = write_config(tmp_path / "b.yaml", flow_config(**common))
    wrapper = ServiceProcess("wrapper", cfg_b, tmp_path).start()
    a = ServiceProcess("deduper", cfg_a, tmp_path, args=["--instance-id", "a"]).start()
    b = ServiceProcess("deduper", cfg_b, tmp_path, args=["--instance-id", "b"])
    try:
        a.wait_for_log("ready (now own", 60)
        producer = SequenceProducer(
            source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=200, rate_per_s=10_000
        )
        producer.run()
        assert producer.error is None
        # a has written every record into its open transaction (written, not committed).
        port = re.search(r"deduper gRPC server listening on port (\d+)", a.output())
        assert port is not None
        wait_until(
            lambda: deduper_status(local(int(port.group(1)))).records_written == 4 * 200,
            60,
            message="a writes every record into its open transaction",
        )
        # Take over a's transactional.id: the coordinator aborts a's open transaction.
        usurper = Producer(
            {
                "bootstrap.servers": destination_cluster.bootstrap_servers,
                "transactional.id": f"ferryman-deduper.{flow}.a",
            }
        )
        usurper.init_transactions(30)
        b.start()
        # Fenced as soon as the rebalance makes it commit: a prompt exit 3, never a stall in the callback.
        assert a.wait_exit(60) == 3, a.output()[-3000:]
        # With a 120 s interval the only commit a attempts is the one the revoke makes,
        # and sending the staging offsets is what met the fence.
        assert "Failed to add offsets to transaction" in a.output()
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=4 * 200, timeout_s=180)
        assert_exact_copy(src, dst)
        assert b.alive
    finally:
        wrapper.stop()
        a.stop()
        b.stop()


@pytest.mark.parametrize(
    ("frozen", "lost_log"),
    [
        pytest.param("deduper", "lost staging partitions", id="deduper"),
        # Passed from its first run (the chaos schedules pause wrappers too): nightly, for CI time.
        pytest.param("wrapper", "source partitions (session expired)", id="wrapper", marks=pytest.mark.nightly),
    ],
)
def test_a_service_frozen_past_its_timeouts_wakes_and_carries_on(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    frozen: str,
    lost_log: str,
) -> None:
    """A zombie pause: SIGSTOP a service mid-stream for longer than its session and transaction timeouts.

    While the deduper is frozen the coordinator expires its open transaction and
    bumps its epoch (transaction.version 2), and the group drops its member.
    Waking, it meets a fence that is its own, not a twin's: it must recover in
    place (exit code 3 is for a live twin) and the copy must stay exact. The CI
    chaos schedule's 14 s pause against a 10 s timeout made two dedupers exit
    here; this test then found a third way out (poll() raising the fence during
    the recovery). What the deduper meets on waking varies from run to run: a
    fence at the commit, an abort that librdkafka's own epoch bump lets through,
    a commit the watchdog abandons, or no open transaction at all. A frozen
    wrapper loses its source partitions and its staging writes may time out:
    it takes them back and re-sends, and the deduper drops what is doubled.
    """
    topic = unique_name("frozen")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    producer = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=5000, rate_per_s=1000
    )
    timeout_ms = 5000
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
        wrapper={"session_timeout_ms": 6000},
        deduper={"transaction_timeout_ms": timeout_ms, "session_timeout_ms": 6000},
    ) as f:
        f.deduper.wait_for_log("assigned staging partitions", 60)
        producer.start()
        wait_until(lambda: producer.sent >= 3000, 30, 0.05, message="3000 records sent")
        service = f.deduper if frozen == "deduper" else f.wrapper
        assert service.proc is not None
        # Past the timeouts plus the coordinator's expiry scan (every 10 s by default): expired before it wakes.
        os.killpg(service.proc.pid, signal.SIGSTOP)
        time.sleep(timeout_ms / 1000 + 12)
        os.killpg(service.proc.pid, signal.SIGCONT)
        producer.join(120)
        assert producer.error is None, producer.error
        src = read_all(source_cluster.bootstrap_servers, topic)
        expected = sum(len(v) for v in src.values())
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=expected, timeout_s=180)
        assert_exact_copy(src, dst)
        for proc in (f.wrapper, f.deduper):
            assert proc.alive and proc.starts == 1, proc.output()[-4000:]
        # The pause outlasted the session (and the transaction timeout): the group took the partitions away.
        assert lost_log in service.output(), service.output()[-4000:]
        assert f.wrapper.terminate() == 0
        assert f.deduper.terminate() == 0
