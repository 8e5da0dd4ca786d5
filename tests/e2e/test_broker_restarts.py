"""Broker restarts under a running flow: no service exits, the copy stays exact, work resumes quickly.

Each case bounces one broker of a pair of clusters this module starts for
itself (so the session's shared clusters are never disturbed), with both
services running as processes the way a user runs them. Where the moment
matters, a hook (``tests/helpers/hold_call``) holds the service right before
the call in question; the test kills the broker, lets the call run against the
dead broker, and restarts the broker while it is in progress:

* destination broker: with a transaction open (any moment mid-stream), during
  ``send_offsets_to_transaction`` (librdkafka #5511 made it wait for ever
  here), during ``commit_transaction``;
* source broker: while records are consumed, during a source offset commit.

Each with SIGKILL, and a controlled shutdown (SIGTERM) too. The recovery time
measured is from the broker being ready again to the first transaction
committed at the destination after it (its last stable offsets move on).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from ferryman.kafka_errors import FenceWindow
from ferryman.status import deduper_status

from tests.helpers.grpc_clients import NOT_SERVING, SERVING, health, local
from tests.helpers.kafka import assert_exact_copy, read_all, wait_until
from tests.helpers.restarts import PARTITIONS, Pair, bounce, check_copy, flow_over, grpc_port, streamed_topic
from tests.helpers.services import RunningFlow, ServiceProcess, hold_env
from tests.helpers.streams import SequenceProducer

pytestmark = pytest.mark.e2e

_log = logging.getLogger(__name__)

#: The goal of issue 24: work resumes within 30 s of the broker being reachable again.
RECOVERY_GOAL_S = 30.0
#: How long a bounced broker stays down: a crash and a supervisor's restart.
DOWN_S = (1.5, 4.0)


def destination_position(bootstrap: str, topic: str) -> int:
    """Sum of the topic's last stable offsets: it moves on with every committed transaction."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_committed"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(PARTITIONS))
    except KafkaException:
        return -1  # the destination is down, or the topic not there yet
    finally:
        consumer.close()


def await_recovery(bootstrap: str, topic: str, since: float, producer: SequenceProducer, flow: RunningFlow) -> float:
    """Seconds from since until work resumed at the destination.

    While the stream still runs, work resumed when the destination's committed
    position moves on. A stream already over (a broker restart can outlast it) may
    have been replicated in full before the broker counted as ready: then the time
    until the destination holds every record sent.
    """
    before = destination_position(bootstrap, topic)
    # Asked after the position: a stream that ends between the two looks is read in full, not awaited to move on.
    if not producer.is_alive():
        read_all(bootstrap, topic, expected=producer.sent, timeout_s=RECOVERY_GOAL_S * 2)
        return time.monotonic() - since
    try:
        wait_until(
            lambda: destination_position(bootstrap, topic) > before,
            RECOVERY_GOAL_S * 2,
            0.1,
            message="a transaction committed at the destination after the broker came back",
        )
    except AssertionError as exc:  # what the services did meanwhile, or the failure cannot be told apart later
        logs = "\n".join(
            f"--- {p.kind} (alive: {p.alive}):\n{p.output()[-6000:]}" for p in (flow.wrapper, flow.deduper)
        )
        raise AssertionError(f"{exc} (position {before} before, sent {producer.sent})\n{logs}") from exc
    return time.monotonic() - since


def deduper_availability(proc: ServiceProcess) -> tuple[int, str]:
    """The deduper's gRPC health and the reason its status gives for being unavailable."""
    address = local(grpc_port(proc))
    return health(address), deduper_status(address).unavailable_reason


CASES = [
    # (victim cluster, moment, broker shutdown). CI runs SIGKILL at the moments a hook pins (and the open
    # transaction, for what status says meanwhile); the rest nightly: the chaos suite's CI schedule kills
    # brokers of both clusters at random moments under load.
    pytest.param("destination", "open-transaction", signal.SIGKILL, id="destination-kill-transaction-open"),
    pytest.param("destination", "send_offsets_to_transaction", signal.SIGKILL, id="destination-kill-send-offsets"),
    pytest.param("destination", "commit_transaction", signal.SIGKILL, id="destination-kill-commit"),
    pytest.param("source", "consume", signal.SIGKILL, id="source-kill-consume", marks=pytest.mark.nightly),
    pytest.param("source", "source-commit", signal.SIGKILL, id="source-kill-offset-commit"),
    pytest.param(
        "destination", "commit_transaction", signal.SIGTERM, id="destination-stop-commit", marks=pytest.mark.nightly
    ),
    pytest.param("source", "source-commit", signal.SIGTERM, id="source-stop-offset-commit", marks=pytest.mark.nightly),
    pytest.param(
        "destination",
        "open-transaction",
        signal.SIGTERM,
        id="destination-stop-transaction-open",
        marks=pytest.mark.nightly,
    ),
    pytest.param(
        "destination",
        "send_offsets_to_transaction",
        signal.SIGTERM,
        id="destination-stop-send-offsets",
        marks=pytest.mark.nightly,
    ),
    pytest.param("source", "consume", signal.SIGTERM, id="source-stop-consume", marks=pytest.mark.nightly),
]


@pytest.mark.parametrize(("victim", "moment", "how"), CASES)
def test_a_broker_restart_is_ridden_through(
    pair: Pair,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    victim: str,
    moment: str,
    how: signal.Signals,
) -> None:
    rng = random.Random(f"{victim}-{moment}-{how.name}")
    topic, producer = streamed_topic(pair, unique_name("bounce"), per_partition=4000, rate_per_s=1600)
    marker = tmp_path / "held"
    held = moment not in ("open-transaction", "consume")
    env = hold_env(moment, marker) if held else None
    with flow_over(
        pair,
        tmp_path,
        unique_name,
        topic,
        wrapper_env=env if victim == "source" else None,
        deduper_env=env if victim == "destination" else None,
    ) as flow:
        flow.deduper.wait_for_log("ready (now own", 60)
        producer.start()
        held_proc: ServiceProcess = flow.wrapper if victim == "source" else flow.deduper
        if held:
            wait_until(marker.exists, 60, message=f"{moment} reached and held")
        else:
            wait_until(lambda: producer.sent >= producer.per_partition * PARTITIONS // 3, 60, message="a third sent")
        cluster = pair.source if victim == "source" else pair.destination
        down_s = rng.uniform(*DOWN_S)
        if held:
            # The call runs against the dead broker: released right after the shutdown starts.
            assert held_proc.proc is not None
            if how is signal.SIGKILL:
                cluster.kill()
            else:
                cluster.stop()
            held_proc.proc.send_signal(signal.SIGUSR1)
            time.sleep(down_s)  # the outage itself: nothing to wait for
            cluster.restart()
            back = time.monotonic()
            assert marker.with_suffix(".released").exists()
        elif moment == "open-transaction":
            # What an operator sees meanwhile: NOT_SERVING with the reason, then SERVING again.
            started = time.monotonic()
            if how is signal.SIGKILL:
                cluster.kill()
            else:
                cluster.stop()
            seen: list[str] = []

            def reported_down() -> bool:
                serving, reason = deduper_availability(flow.deduper)
                seen.append(reason)
                return serving == NOT_SERVING and bool(reason)

            wait_until(reported_down, 30, message="the deduper NOT_SERVING with a reason while the destination is down")
            _log.info("deduper while the destination is down: %s", seen[-1])
            time.sleep(max(0.0, down_s - (time.monotonic() - started)))  # the rest of the outage
            cluster.restart()
            back = time.monotonic()
        else:
            back = bounce(cluster, how, down_s)
        recovery_s = await_recovery(pair.destination.bootstrap_servers, f"src.{topic}", back, producer, flow)
        if moment == "open-transaction":
            wait_until(
                lambda: deduper_availability(flow.deduper) == (SERVING, ""),
                RECOVERY_GOAL_S,
                message="the deduper SERVING again, no reason given",
            )
        _log.info(
            "%s broker %s during %s, down %.1f s: first commit %.1f s after it was back",
            victim,
            how.name,
            moment,
            down_s,
            recovery_s,
        )
        check_copy(pair, flow, topic, producer)
        assert recovery_s <= RECOVERY_GOAL_S, f"work resumed {recovery_s:.1f} s after the broker was back"


@pytest.mark.parametrize(
    ("per_partition", "rate_per_s", "bounces_each", "kills_each", "seed"),
    [
        # 100 000 records over ~80 s: three bounces of each cluster and two kill -9s of each service. Nightly
        # since the chaos suite's CI schedule runs in CI: it mixes broker kills on both clusters with
        # service kills, pauses and link faults (tests/chaos), and CI has no room for both.
        pytest.param(25_000, 1250, 3, 2, 20261125, id="6-bounces-4-kills", marks=pytest.mark.nightly),
        # The long variant (FERRYMAN_NIGHTLY=1): 300 000 records, 12 bounces, 12 kill -9s.
        pytest.param(75_000, 1500, 6, 6, 20261126, id="12-bounces-12-kills", marks=pytest.mark.nightly),
    ],
)
def test_broker_bounces_mixed_with_service_kills(
    pair: Pair,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    per_partition: int,
    rate_per_s: float,
    bounces_each: int,
    kills_each: int,
    seed: int,
) -> None:
    """Both brokers bounced (mostly SIGKILL, some SIGTERM) and both services kill -9ed, in a seeded order."""
    rng = random.Random(seed)
    topic, producer = streamed_topic(pair, unique_name("mixed"), per_partition=per_partition, rate_per_s=rate_per_s)
    events = ["source", "destination"] * bounces_each + ["wrapper", "deduper"] * kills_each
    rng.shuffle(events)
    figures: list[str] = []
    with flow_over(pair, tmp_path, unique_name, topic) as flow:
        flow.deduper.wait_for_log("ready (now own", 60)
        producer.start()
        for event in events:
            time.sleep(rng.uniform(1.0, 4.0))  # a random moment mid-stream, by design
            if event in ("wrapper", "deduper"):
                proc = flow.wrapper if event == "wrapper" else flow.deduper
                assert proc.alive, f"{proc.kind} exited:\n{proc.output()[-4000:]}"
                proc.kill9()
                proc.start()
                figures.append(f"kill -9 {event}")
                continue
            cluster = pair.source if event == "source" else pair.destination
            how = signal.SIGKILL if rng.random() < 0.75 else signal.SIGTERM
            down_s = rng.uniform(*DOWN_S)
            started = time.monotonic()
            back = bounce(cluster, how, down_s)
            recovery_s = await_recovery(pair.destination.bootstrap_servers, f"src.{topic}", back, producer, flow)
            figures.append(
                f"{event} {how.name}: down {back - started:.1f} s (restart included), "
                f"first commit {recovery_s:.1f} s later"
            )
            assert recovery_s <= RECOVERY_GOAL_S, figures
        _log.info("mixed run (seed %d, %d records): %s", seed, producer.per_partition * PARTITIONS, "; ".join(figures))
        producer.join(300)
        assert producer.error is None, producer.error
        src = read_all(pair.source.bootstrap_servers, topic)
        expected = sum(len(v) for v in src.values())
        assert expected == per_partition * PARTITIONS
        dst = read_all(pair.destination.bootstrap_servers, f"src.{topic}", expected=expected, timeout_s=300)
        assert_exact_copy(src, dst)
        for proc in (flow.wrapper, flow.deduper):
            assert proc.alive, f"{proc.kind} exited:\n{proc.output()[-4000:]}"
            assert proc.starts == kills_each + 1
        assert flow.wrapper.terminate() == 0
        assert flow.deduper.terminate() == 0


#: The consumer session in the frozen-broker test, and how long each freeze lasts (past the session).
FROZEN_SESSION_MS = 6000
FREEZE_S = 9.0
FREEZES = 2


def own_fences(proc: ServiceProcess) -> int:
    """Fences of the service's consumer by its own rejoin after a session timeout, so far."""
    return proc.output().count(FenceWindow.OWN_REJOIN)


@pytest.mark.parametrize(
    "victim",
    [
        pytest.param("destination", id="deduper"),
        pytest.param("source", id="wrapper", marks=pytest.mark.nightly),
    ],
)
def test_a_broker_frozen_past_the_session_twice_within_the_fence_window_is_ridden_through(
    pair: Pair, unique_name: Callable[[str], str], tmp_path: Path, victim: str
) -> None:
    """A broker frozen (SIGSTOP: a long GC pause, a stalled VM) past the consumer session, twice in a minute.

    The service's consumer times out its own session each time. Its rejoin then often fences the member
    it was (FENCED_INSTANCE_ID) as soon as the broker answers again: 1 in 3 freezes of a lone consumer
    here, 5 of 6 session timeouts in chaos runs. Two such fences within FenceWindow.WINDOW_S once stopped
    a deduper as if a live twin used its instance id (exit 3; a chaos CI run).
    """
    topic, producer = streamed_topic(pair, unique_name("frozen"), per_partition=3000, rate_per_s=400)
    session = {"session_timeout_ms": FROZEN_SESSION_MS}
    with flow_over(pair, tmp_path, unique_name, topic, wrapper=session, deduper=session) as flow:
        flow.deduper.wait_for_log("ready (now own", 60)
        producer.start()
        cluster = pair.source if victim == "source" else pair.destination
        proc = flow.wrapper if victim == "source" else flow.deduper
        started = time.monotonic()
        for _ in range(FREEZES):
            pid = cluster.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(FREEZE_S)  # the freeze itself: nothing to wait for
            finally:
                os.kill(pid, signal.SIGCONT)
            recovery_s = await_recovery(
                pair.destination.bootstrap_servers, f"src.{topic}", time.monotonic(), producer, flow
            )
            assert recovery_s <= RECOVERY_GOAL_S
            assert proc.alive, f"{proc.kind} exited:\n{proc.output()[-4000:]}"
        assert time.monotonic() - started < FenceWindow.WINDOW_S  # every fence fell within one window
        # Whether librdkafka times the session out depends on its join state at the freeze (a busy CI run
        # had none): logged, not asserted.
        _log.info(
            "%s: %d session timeouts and %d fences by its own rejoin over %d freezes",
            proc.kind,
            proc.output().count("session timed out"),
            own_fences(proc),
            FREEZES,
        )
        check_copy(pair, flow, topic, producer)
