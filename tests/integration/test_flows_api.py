"""Replication flows through the admin API, on real clusters, driven by the ``ferryman`` CLI as a user runs it.

A deduper (the "anchor", running a flow of its own) serves FlowService for the destination
cluster. A flow created there through ``ferryman flows create`` is run by a wrapper and a
deduper started with ``--flow NAME`` only (the file does not declare it), and then changed live:
a wider topic pattern, pause, resume, delete.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from ferryman.admin import FerrymanAdmin, InvalidArgumentError, PreconditionError
from ferryman.naming import FLOWS_TOPIC
from ferryman.v1 import flows_pb2
from ferryman_local import reserve_port

from tests.helpers.kafka import KafkaCluster, assert_exact_copy, create_topic, read_all, wait_until
from tests.helpers.services import ServiceProcess, flow_config, hold_env, write_config

pytestmark = pytest.mark.integration

FERRYMAN = Path(sys.executable).parent / "ferryman"

#: The wrappers' topic refresh interval in these tests (flow_config's default): a new topic must be
#: picked up within it after a change, plus the time to copy a few records (generous on a busy CI host).
REFRESH_S = 2.0
#: Slack on top of it: the watch (~0.5 s), a source listing, topic creation and one transaction; a few
#: seconds here, ~15 s measured (update issued to records read) with the machine's load average above 60.
PICKUP_SLACK_S = 18.0


def ferryman(*args: str, server: str) -> subprocess.CompletedProcess[str]:
    """``ferryman flows <args> --server <server> -o json`` as a subprocess."""
    return subprocess.run(
        [str(FERRYMAN), "flows", *args, "--server", server, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def refused(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The one-line error of a refused command, checked: its exit code, its words, no traceback."""
    assert result.returncode == code, f"exit {result.returncode} (wanted {code}): {result.stderr}"
    line = result.stderr.strip()
    assert line.startswith("ferryman: ") and "\n" not in line and "Traceback" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


def produce(bootstrap: str, topic: str, partitions: int, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(start, start + count):
        for part in range(partitions):
            p.produce(topic, value=f"{topic}:{part}:{i}".encode(), partition=part)
    assert p.flush(30) == 0


def config_for(source: KafkaCluster, destination: KafkaCluster, flow: str, **kw: Any) -> dict[str, Any]:
    """flow_config with a reserved deduper port (the CLI's --server)."""
    return flow_config(
        source_bootstrap=source.bootstrap_servers,
        destination_bootstrap=destination.bootstrap_servers,
        flow=flow,
        topics=[f"{flow}-none"],
        deduper={"listen_address": f"127.0.0.1:{reserve_port()}"},
        **kw,
    )


def serve(
    data: dict[str, Any], log_dir: Path, name: str, *args: str, env: dict[str, str] | None = None
) -> tuple[ServiceProcess, str]:
    """Start a deduper for data; return it and its gRPC address once FlowService answers."""
    path = write_config(log_dir / f"{name}.yaml", data)
    deduper = ServiceProcess("deduper", path, log_dir, args=["--instance-id", name, *args], env=env).start()
    address = data["deduper"]["listen_address"]
    wait_until(lambda: ferryman("list", server=address).returncode == 0, timeout_s=90, message="FlowService")
    return deduper, address


@pytest.fixture
def anchor(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> Iterator[str]:
    """A deduper into the destination cluster (its own flow idle): the FlowService address."""
    name = unique_name("anchor")
    deduper, address = serve(config_for(source_cluster, destination_cluster, name), tmp_path, "anchor")
    try:
        yield address
    finally:
        ferryman("delete", name, server=address)  # the deduper stored its own flow: leave the shared cluster clean
        deduper.stop()


def test_a_flow_created_through_the_cli_replicates_and_follows_live_changes(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    anchor: str,
) -> None:
    src, dst = source_cluster.bootstrap_servers, destination_cluster.bootstrap_servers
    flow, prefix = unique_name("flow"), unique_name("live")
    first, second = f"{prefix}-a", f"{prefix}-b"
    create_topic(src, first, 2)
    produce(src, first, 2, 0, 100)

    created = ok(
        ferryman("create", "--name", flow, "--source", "src", "--target", "dst", "--topic", first, server=anchor)
    )
    assert created["version"] == "1" and created["etag"] and not created["paused"]
    refused(
        ferryman("create", "--name", flow, "--source", "src", "--target", "dst", server=anchor), 10, "ALREADY_EXISTS"
    )

    # A pair started with --flow only: the file declares another flow, the definition comes from the store.
    data = config_for(source_cluster, destination_cluster, unique_name("other"))
    data["wrapper"]["instance_id"] = f"{flow}-w1"
    path = write_config(tmp_path / "pair.yaml", data)
    wrapper = ServiceProcess("wrapper", path, tmp_path, args=["--flow", flow]).start()
    deduper = ServiceProcess("deduper", path, tmp_path, args=["--flow", flow, "--instance-id", "d1"]).start()
    try:
        assert_exact_copy(read_all(src, first), read_all(dst, f"src.{first}", expected=200, timeout_s=120))

        # A wider pattern, live: the second topic (already there) is picked up without a restart.
        create_topic(src, second, 3)
        produce(src, second, 3, 0, 20)
        updated = ok(ferryman("update", flow, "--topic", f"{prefix}-.*", "--etag", created["etag"], server=anchor))
        changed_at = time.monotonic()  # the change is committed to the store once the command returns
        assert updated["topics"] == [f"{prefix}-.*"] and updated["version"] == "2"
        read_all(dst, f"src.{second}", expected=60, timeout_s=60)
        picked_up_s = time.monotonic() - changed_at
        print(f"new topic replicated {picked_up_s:.1f} s after the update (refresh interval {REFRESH_S} s)")
        # The change starts a discovery at once (it does not wait for the interval); the slack is for a busy host.
        assert picked_up_s < REFRESH_S + PICKUP_SLACK_S, picked_up_s

        # The first etag is stale now.
        refused(ferryman("update", flow, "--topic", "x", "--etag", created["etag"], server=anchor), 11, "ABORTED")

        # Paused: nothing more reaches the destination; resumed: all of it, exactly once.
        assert ok(ferryman("pause", flow, server=anchor))["paused"]
        wrapper.wait_for_log(f"pausing source reads: flow {flow} paused", 30)
        before = sum(len(r) for r in read_all(dst, f"src.{first}").values())
        produce(src, first, 2, 100, 50)
        # An observation window, not a synchronisation: the wrapper would copy these in < 1 s if it read.
        time.sleep(3)
        assert sum(len(r) for r in read_all(dst, f"src.{first}").values()) == before == 200
        assert not ok(ferryman("resume", flow, server=anchor))["paused"]
        assert_exact_copy(read_all(src, first), read_all(dst, f"src.{first}", expected=300, timeout_s=60))
        assert_exact_copy(read_all(src, second), read_all(dst, f"src.{second}", expected=60, timeout_s=30))

        # Deleted: both go idle and say why; NOT_FOUND from then on.
        ok(ferryman("delete", flow, server=anchor))
        wrapper.wait_for_log(f"flow {flow} is gone from the flow store", 30)
        deduper.wait_for_log(f"flow {flow} is gone from the flow store", 30)
        refused(ferryman("get", flow, server=anchor), 7, "NOT_FOUND")
        assert wrapper.alive and deduper.alive
    finally:
        wrapper.stop()
        deduper.stop()


def open_transaction_on_the_store(bootstrap: str) -> bool:
    """True while a transaction holds the flow store's last stable offset below its end."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(FLOWS_TOPIC, 0)
    stable, end = (
        admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)[tp].result(30).offset  # type: ignore[no-untyped-call]
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)
    )
    return bool(stable < end)


def test_a_deduper_killed_while_committing_a_flow_change_leaves_the_store_whole(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    anchor: str,
) -> None:
    """kill -9 of the deduper serving a flow change, its record written in the open transaction and the commit
    due: the change does not land, the store stays readable meanwhile (reads stop at the last stable offset),
    and the next write, through another deduper, fences the dead writer's transaction and lands once.
    """
    dst = destination_cluster.bootstrap_servers
    flow, victim_flow = unique_name("killedwrite"), unique_name("victim")
    ok(ferryman("create", "--name", flow, "--source", "src", "--target", "dst", "--topic", f"{flow}-.*", server=anchor))
    marker = tmp_path / "held"
    # The victim's first flow-store commit stores its own flow at start-up; the second is the pause below.
    victim, address = serve(
        config_for(source_cluster, destination_cluster, victim_flow),
        tmp_path,
        "victim",
        env=hold_env("flow-store-commit", marker, after=2),
    )
    try:
        # FlowService answers from start-up; the deduper stores its own flow a moment later (after the
        # destination first answers and its internal topics are made), so wait for that first commit.
        wait_until(
            lambda: ferryman("get", victim_flow, server=address).returncode == 0,
            timeout_s=90,
            message="the victim's own flow stored at start-up",
        )
        assert not marker.exists()
        pause = subprocess.Popen(
            [str(FERRYMAN), "flows", "pause", flow, "--server", address, "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(marker.exists, 60, message="the pause's flow-store commit reached and held")
        assert open_transaction_on_the_store(dst)  # the record is in, uncommitted
        victim.kill9()
        _, err = pause.communicate(timeout=120)
        refused(subprocess.CompletedProcess(pause.args, pause.returncode, "", err), 4)

        stored = ok(ferryman("get", flow, server=anchor))
        assert (stored["paused"], stored["version"]) == (False, "1")
        started = time.monotonic()
        paused = ok(ferryman("pause", flow, server=anchor))
        print(f"the next write landed {time.monotonic() - started:.1f} s after a dead writer's open transaction")
        assert (paused["paused"], paused["version"]) == (True, "2")
        assert not open_transaction_on_the_store(dst)
    finally:
        victim.stop()
        for name in (flow, victim_flow):
            ferryman("delete", name, server=anchor)


def test_the_own_flow_asked_for_before_start_up_stored_it_is_unavailable_not_missing(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """FlowService answers from start-up; the deduper stores the flow its file declares once the destination
    answers. Meanwhile a call naming that flow is UNAVAILABLE, "ask again" (exit 4), never NOT_FOUND (exit 7):
    an operator who just started a deduper must not be told its flow does not exist.
    """
    own = unique_name("own")
    marker = tmp_path / "held"
    deduper, address = serve(
        config_for(source_cluster, destination_cluster, own),
        tmp_path,
        "own",
        env=hold_env("flow-store-commit", marker, after=1),  # the start-up's store of its own flow
    )
    try:
        wait_until(marker.exists, 60, message="the start-up's flow-store commit reached and held")
        # (A write meanwhile waits for the store's one writer, the held start-up: tests/unit/test_flows_servicer.py.)
        refused(ferryman("get", own, server=address), 4, "cannot serve the call now", own, "ask again")
        refused(ferryman("get", unique_name("other"), server=address), 7, "NOT_FOUND")  # other names as ever
        assert deduper.proc is not None
        deduper.proc.send_signal(signal.SIGUSR1)  # the commit goes on
        wait_until(lambda: ferryman("get", own, server=address).returncode == 0, 60, message="the own flow stored")
        assert ok(ferryman("get", own, server=address))["name"] == own
        ok(ferryman("delete", own, server=address))
        refused(ferryman("get", own, server=address), 7, "NOT_FOUND")  # stored once, deleted: missing now
    finally:
        deduper.stop()


def test_refusals_name_the_field_and_the_cycle(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    anchor: str,
) -> None:
    refused(ferryman("get", unique_name("nope"), server=anchor), 7, "NOT_FOUND")
    refused(ferryman("delete", unique_name("nope"), server=anchor), 7, "NOT_FOUND")
    refused(
        ferryman("create", "--name", unique_name("f"), "--source", "elsewhere", "--target", "dst", server=anchor),
        2,
        "INVALID_ARGUMENT",
        "source_alias",
    )
    refused(
        ferryman(
            "create", "--name", unique_name("f"), "--source", "src", "--target", "dst", "--topic", "a[(", server=anchor
        ),
        2,
        "topics",
    )
    one_way = unique_name("oneway")
    ok(
        ferryman(
            "create",
            "--name",
            one_way,
            "--source",
            "src",
            "--target",
            "dst",
            "--naming",
            "identity",
            "--topic",
            f"{one_way}-.*",
            server=anchor,
        )
    )
    try:
        # Cannot change live: FAILED_PRECONDITION naming the field (through the client: the CLI offers no flag).
        with FerrymanAdmin(anchor) as admin:
            with pytest.raises(PreconditionError) as live:
                admin.update_flow(flows_pb2.Flow(name=one_way, exactly_once=False), ["exactly_once"])
            assert live.value.metadata["field"] == "exactly_once"
            with pytest.raises(InvalidArgumentError) as fixed:
                admin.update_flow(flows_pb2.Flow(name=one_way, staging_partitions=3), ["staging_partitions"])
            assert fixed.value.metadata["field"] == "staging_partitions"

        # The flows into the source cluster are served by a deduper whose destination is the source.
        rev_name = unique_name("rev")
        reverse = config_for(source_cluster, destination_cluster, rev_name)
        reverse["flows"][0].update(source="dst", target="src")
        rev_deduper, rev = serve(reverse, tmp_path, "rev")
        # It stored its own (prefix) flow dst -> src: gone again, so that only this test's flows can close a cycle.
        wait_until(lambda: ferryman("get", rev_name, server=rev).returncode == 0, timeout_s=60, message="rev stored")
        ok(ferryman("delete", rev_name, server=rev))
        try:
            back = unique_name("back")
            line = refused(
                ferryman(
                    "create", "--name", back, "--source", "dst", "--target", "src", "--naming", "identity", server=rev
                ),
                9,
                "FAILED_PRECONDITION",
                f"dst -> src (flow {back}, identity) -> dst (flow ",
            )
            assert "cycle" in line
            refused(ferryman("get", back, server=rev), 7, "NOT_FOUND")
        finally:
            rev_deduper.stop()
    finally:
        ok(ferryman("delete", one_way, server=anchor))


def test_apply_is_declarative_and_idempotent(unique_name: Callable[[str], str], tmp_path: Path, anchor: str) -> None:
    names = [unique_name("applied"), unique_name("applied")]
    flows = [{"name": n, "source": "src", "target": "dst", "topics": [f"{n}-.*"]} for n in names]
    file = tmp_path / "flows.yaml"
    file.write_text(yaml.safe_dump({"flows": flows}))
    try:
        first = ok(ferryman("apply", "-f", str(file), server=anchor))
        assert [r["action"] for r in first] == ["created", "created"]
        second = ok(ferryman("apply", "-f", str(file), server=anchor))
        assert [r["action"] for r in second] == ["unchanged", "unchanged"]
        assert [r["etag"] for r in second] == [r["etag"] for r in first]
        # A pause made through the API survives an apply of a file that does not mention it.
        ok(ferryman("pause", names[0], server=anchor))
        flows[1]["topics"] = ["changed"]
        file.write_text(yaml.safe_dump({"flows": flows}))
        third = ok(ferryman("apply", "-f", str(file), server=anchor))
        assert [r["action"] for r in third] == ["unchanged", "updated"]
        assert ok(ferryman("get", names[0], server=anchor))["paused"]
        assert ok(ferryman("get", names[1], server=anchor))["topics"] == ["changed"]
        listed = {f["name"] for f in ok(ferryman("list", server=anchor))}
        assert set(names) <= listed
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"flows": [{"name": "x", "source": "src"}]}))
        refused(ferryman("apply", "-f", str(bad), server=anchor), 2, "flows.0.target")

        # A call failing part way: the rows so far print, the failed flow and the ones after it say so.
        later = [unique_name("applied"), unique_name("applied")]
        names += later
        partial = [
            {"name": later[0], "source": "src", "target": "dst", "topics": [f"{later[0]}-.*"]},
            {**flows[0], "exactly_once": False},  # cannot change live: FAILED_PRECONDITION
            {"name": later[1], "source": "src", "target": "dst", "topics": [f"{later[1]}-.*"]},
        ]
        file.write_text(yaml.safe_dump({"flows": partial}))
        result = ferryman("apply", "-f", str(file), server=anchor)
        refused(result, 9, "FAILED_PRECONDITION", "exactly_once")
        assert [(r["flow"], r["action"]) for r in json.loads(result.stdout)] == [
            (later[0], "created"),
            (names[0], "failed"),
            (later[1], "not applied"),
        ]
        assert ok(ferryman("get", later[0], server=anchor))["name"] == later[0]
        assert ok(ferryman("get", names[0], server=anchor))["exactly_once"]
        refused(ferryman("get", later[1], server=anchor), 7, "NOT_FOUND")
    finally:
        for name in names:
            ferryman("delete", name, server=anchor)
