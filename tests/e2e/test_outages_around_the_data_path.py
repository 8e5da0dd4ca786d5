"""Outages met outside the steady data path: at start-up, by the audit scheduler, by the admin API.

Each case restarts a broker of a cluster pair the module starts for itself (``tests/e2e/conftest.py``), with the
services and the CLI run as processes the way a user runs them.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ferryman_local import LocalCluster, reserve_port

from tests.helpers.audit_cli import POLL_S, RUNS_BUDGET_S, STOP_BUDGET_S, ferryman, scheduler, stored_runs
from tests.helpers.kafka import assert_exact_copy, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.restarts import PARTITIONS, Pair, bounce, check_copy, flow_over, grpc_port, streamed_topic
from tests.helpers.services import hold_env, running_flow

pytestmark = pytest.mark.e2e

_log = logging.getLogger(__name__)

#: How long a bounced broker stays down: a crash and a supervisor's restart.
DOWN_S = 4.0

#: The start-up test's deduper.operation_timeout_s: init_transactions got 4x this, then the deduper exited.
START_OPERATION_TIMEOUT_S = 1.0
#: How long the destination stays down while that deduper's first init_transactions runs: past 4x the above.
START_DOWN_S = 12.0


def test_a_destination_down_while_the_deduper_initialises_transactions_is_waited_out(
    pair: Pair, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The destination's broker dies as a starting deduper calls init_transactions and stays down past that
    call's own budget: the deduper waits within deduper.startup_timeout_s, then copies exactly once.

    It used to exit 1 ("init_transactions did not succeed within 4s"): the call's budget was
    operation_timeout_s x 4 whatever the start-up budget, the last start-up step outside it.
    """
    topic, producer = streamed_topic(pair, unique_name("initdown"), per_partition=1500, rate_per_s=600)
    marker = tmp_path / "held"
    with flow_over(
        pair,
        tmp_path,
        unique_name,
        topic,
        deduper={"operation_timeout_s": START_OPERATION_TIMEOUT_S},
        deduper_env=hold_env("init_transactions", marker, after=1),
    ) as flow:
        producer.start()
        wait_until(marker.exists, 120, message="the deduper's first init_transactions reached and held")
        assert flow.deduper.proc is not None
        pair.destination.kill()
        flow.deduper.proc.send_signal(signal.SIGUSR1)  # the call runs against the dead broker
        time.sleep(START_DOWN_S)  # the outage itself: nothing to wait for
        assert flow.deduper.alive, f"deduper exited:\n{flow.deduper.output()[-4000:]}"
        pair.destination.restart()
        flow.deduper.wait_for_log("ready (now own", 120)
        assert "initialising transactions failed" in flow.deduper.output()  # it waited, and said so
        check_copy(pair, flow, topic, producer)


#: Records per partition before the audit scheduler starts, and while it runs (after the restarts).
AUDITED_FIRST, AUDITED_MORE = 300, 50


def test_the_audit_scheduler_rides_through_broker_restarts(
    pair: Pair, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A broker of each cluster killed and restarted under a scheduler that audits every second.

    A run that meets the outage cannot run (logged, retried at the next interval) or waits it out; the
    scheduler stays up, later runs check every record exactly once, and SIGTERM still ends it with 0. While
    the destination is down its audit API answers ``audit list`` UNAVAILABLE, naming the audit topic, within
    the call's deadline (exit 4, one line); once it is back it lists every stored run again.
    """
    topic = unique_name("audited")
    create_topic(pair.source.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(pair.source.bootstrap_servers, topic, PARTITIONS, AUDITED_FIRST)
    total = PARTITIONS * (AUDITED_FIRST + AUDITED_MORE)
    log = tmp_path / "schedule.log"
    with flow_over(pair, tmp_path, unique_name, topic) as flow:
        dest = f"src.{topic}"
        read_all(pair.destination.bootstrap_servers, dest, expected=PARTITIONS * AUDITED_FIRST, timeout_s=120)
        api = f"127.0.0.1:{reserve_port()}"
        with scheduler(flow.config, log, "--interval-s", "1", "--listen-address", api) as proc:
            wait_until(lambda: stored_runs(flow.config), RUNS_BUDGET_S, POLL_S, "the first run")
            # The destination down: its API cannot read the audit topic, and says so within the call's deadline.
            refused, took_s = while_down(
                pair.destination,
                lambda: ferryman("audit", "list", "--server", api, "--timeout", str(API_TIMEOUT_S), "-o", "json"),
                DOWN_S,
            )
            assert_refused_as_unavailable(refused, took_s, "reading the audit topic", API_TIMEOUT_S)
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            bounce(pair.source, signal.SIGKILL, DOWN_S)
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            produce_sequences(pair.source.bootstrap_servers, topic, PARTITIONS, AUDITED_MORE, start=AUDITED_FIRST)
            wait_until(
                lambda: sum(r["expected"] for r in stored_runs(flow.config)) >= total,
                RUNS_BUDGET_S,
                POLL_S,
                "runs that checked the records written after the restarts",
            )
            stored_before = {r["run_id"] for r in stored_runs(flow.config)}
            through_api = ferryman("audit", "list", "--server", api, "--limit", "0", "-o", "json")
            assert through_api.returncode == 0, through_api.stderr  # the API serves again: the stored runs, and more
            assert stored_before <= {r["run_id"] for r in json.loads(through_api.stdout)}
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(STOP_BUDGET_S)
        stored = stored_runs(flow.config)
        src = read_all(pair.source.bootstrap_servers, topic)
        assert_exact_copy(src, read_all(pair.destination.bootstrap_servers, dest, expected=total, timeout_s=180))
        for service in (flow.wrapper, flow.deduper):
            assert service.alive, f"{service.kind} exited:\n{service.output()[-4000:]}"
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]
    assert all(r["verdict"] == "EXACTLY_ONCE" for r in stored), stored
    assert sum(r["expected"] for r in stored) == total  # no record checked twice, none skipped
    assert all(r["found"] == r["expected"] for r in stored)
    assert "Traceback" not in output
    _log.info(
        "audit scheduler across two broker restarts: %d runs stored, %d could not run",
        len(stored),
        output.count("could not run (retried at the next interval)"),
    )


#: librdkafka's message.timeout.ms for every destination client in the long-outage test (300 s by default).
MESSAGE_TIMEOUT_MS = 5000
#: How long that test keeps the destination down: three message timeouts.
LONG_DOWN_S = 15.0


def test_a_destination_down_longer_than_the_producers_message_timeout_is_waited_out(
    pair: Pair, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The destination down past ``message.timeout.ms``: the wrapper's staging writes and the deduper's
    transactions fail for good in librdkafka (delivery reports with _MSG_TIMED_OUT), not just wait.

    The wrapper rewinds the failed partitions and sends them again, the deduper aborts and writes again: both
    stay up, and the copy is exact.
    """
    topic, producer = streamed_topic(pair, unique_name("longdown"), per_partition=3000, rate_per_s=600)
    with flow_over(
        pair, tmp_path, unique_name, topic, destination_client_config={"message.timeout.ms": MESSAGE_TIMEOUT_MS}
    ) as flow:
        flow.deduper.wait_for_log("ready (now own", 60)
        producer.start()
        wait_until(lambda: producer.sent >= producer.per_partition * PARTITIONS // 3, 60, message="a third sent")
        bounce(pair.destination, signal.SIGKILL, LONG_DOWN_S)
        check_copy(pair, flow, topic, producer)
    output = flow.wrapper.output()
    timed_out = output.count("_MSG_TIMED_OUT")
    assert timed_out > 0, output[-4000:]  # the path under test: librdkafka gave up on staging writes
    _log.info("destination down %.0f s: staging writes of %d partitions timed out, sent again", LONG_DOWN_S, timed_out)


#: How long the source stays down in the long source outage: past the wrapper's group session (10 s), its
#: source calls' budgets (30 s) and a flow-store watch interval, short of the load producer's message timeout.
SOURCE_DOWN_S = 40.0


def test_a_source_down_past_the_wrappers_session_and_call_budgets_is_waited_out(
    pair: Pair, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The source cluster down for 40 s mid-stream: the wrapper's consumer loses its group session and its
    offset commits fail for longer than any one call's budget; it stays up, rejoins when the source is back
    and the copy is exact (a replay it sends again is dropped by the deduper).
    """
    topic, producer = streamed_topic(pair, unique_name("srcdown"), per_partition=3000, rate_per_s=600)
    with flow_over(pair, tmp_path, unique_name, topic) as flow:
        flow.deduper.wait_for_log("ready (now own", 60)
        producer.start()
        wait_until(lambda: producer.sent >= producer.per_partition * PARTITIONS // 3, 60, message="a third sent")
        bounce(pair.source, signal.SIGKILL, SOURCE_DOWN_S)
        check_copy(pair, flow, topic, producer)
    output = flow.wrapper.output()
    assert "SESSTMOUT" in output, output[-4000:]  # the path under test: the group session ran out meanwhile
    # One outage, reported back once the source was: with its partitions lost to the session timeout, the
    # wrapper had nothing left to commit and took that for an answer, "back" (and SERVING) every commit interval.
    back = [float(s) for s in re.findall(r"cluster 'src' \(.*?\) is back after ([0-9.]+) s", output)]
    assert len(back) == 1 and back[0] >= SOURCE_DOWN_S - 5, back


#: The deadline of ``audit list --server`` while the destination is down (the CLI's default is 5 s).
API_TIMEOUT_S = 3.0

#: The CLI's deadline in the admin API test: a call that cannot be served must say so within it.
CLI_TIMEOUT_S = 10.0


def flows_cli(*args: str, address: str) -> subprocess.CompletedProcess[str]:
    """``ferryman flows <args>`` against address, as a user runs it."""
    return ferryman("flows", *args, "--server", address, "--timeout", str(CLI_TIMEOUT_S), "-o", "json")


def test_a_flow_change_while_the_destination_is_down_is_refused_as_unavailable_and_lands_only_when_asked_again(
    pair: Pair, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """``flows pause`` with the flow store's cluster down: one line naming the store, exit 4, within the deadline;
    nothing of it lands once the broker is back (the server gave up), and asked again it pauses the flow."""
    topic, name = unique_name("admin"), unique_name("flow")
    create_topic(pair.source.bootstrap_servers, topic, PARTITIONS)
    with running_flow(pair.source, pair.destination, tmp_path, flow=name, topics=[topic]) as flow:
        flow.deduper.wait_for_log("ready (now own", 60)
        address = f"127.0.0.1:{grpc_port(flow.deduper)}"
        assert not json.loads(flows_cli("get", name, address=address).stdout)["paused"]
        refused, took_s = while_down(pair.destination, lambda: flows_cli("pause", name, address=address))
        assert_refused_as_unavailable(refused, took_s, "flow store of cluster 'dst'", CLI_TIMEOUT_S)
        time.sleep(10)  # a write the server went on with would land now
        assert not json.loads(flows_cli("get", name, address=address).stdout)["paused"]
        wait_until(
            lambda: flows_cli("pause", name, address=address).returncode == 0,
            60,
            1.0,
            "flows pause once the destination is back",
        )
        assert json.loads(flows_cli("get", name, address=address).stdout)["paused"]


def while_down(
    cluster: LocalCluster, call: Callable[[], subprocess.CompletedProcess[str]], down_s: float = 0.0
) -> tuple[subprocess.CompletedProcess[str], float]:
    """call made with cluster's broker killed (down down_s at least), then restarted: its result, its seconds."""
    cluster.kill()
    try:
        started = time.monotonic()
        result = call()
        took_s = time.monotonic() - started
        time.sleep(max(0.0, down_s - took_s))  # the rest of the outage: nothing to wait for
    finally:
        cluster.restart()
    return result, took_s


def assert_refused_as_unavailable(
    refused: subprocess.CompletedProcess[str], took_s: float, what: str, timeout_s: float
) -> None:
    """One line saying the server cannot serve the call now, naming what it could not do; exit 4, within the
    call's --timeout (and a CLI process's start)."""
    line = refused.stderr.strip()
    _log.info("refused with a cluster down: exit %d after %.1f s: %s", refused.returncode, took_s, line)
    assert refused.returncode == 4, refused.stderr
    assert "cannot serve the call now" in line and what in line, line
    assert "Traceback" not in line and "\n" not in line, line
    assert took_s < timeout_s + 5
