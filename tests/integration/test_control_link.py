"""GitHub issue #4, the control link, proven on real clusters with both services as real processes.

Each service gets its own configuration file. What travels over the link is
checked from both ends (each service's status RPC and log) and against the
data: a separate read_committed reader of the destination. The protocol
handshake is checked against the deduper's real servicer in process.
"""

from __future__ import annotations

import functools
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType
from ferryman import protocol
from ferryman.config import RpcConfig, SecretStr, TlsConfig
from ferryman.rpc import rpc_error_from
from ferryman.status import deduper_status, wrapper_status
from ferryman.v1 import control_pb2
from ferryman_deduper._control import ControlHub
from ferryman_deduper._deduper import _SPEC_SYNC_INTERVAL_S

from tests.helpers import kafka as kafka_helpers
from tests.helpers.certs import make_pki
from tests.helpers.grpc_clients import (
    CONTROL_SERVICE,
    DEDUPER_SERVICE,
    FLOW_SERVICE,
    HEALTH_SERVICE,
    SERVING,
    WRAPPER_SERVICE,
    ControlStream,
    LinkedPair,
    control_server,
    health,
    hello,
    local,
    log_time,
    reflected_services,
    start_linked_pair,
    when_listening,
)
from tests.helpers.kafka import (
    KafkaCluster,
    assert_exact_copy,
    create_topic,
    produce_sequences,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

#: A source address nothing listens on: the deduper's file names it to show the deduper never needs the source.
BOGUS_SOURCE = "127.0.0.1:9"
#: Process start (Python, Kafka clients, init_transactions) on a 2-core runner takes a few seconds.
START_TIMEOUT_S = 60.0
#: Replicating a few hundred records, start-up included.
REPLICATION_TIMEOUT_S = 90.0

SOURCE_CONFIGS = {
    # Replicated: dynamic topic configs the destination must get.
    "retention.ms": "123456789",
    "max.message.bytes": "2000000",
    # Not replicated (MirrorMaker 2's exclusion list): a property of the cluster, not of the data.
    "min.insync.replicas": "1",
}


def _count(records: dict[int, list[kafka_helpers.ConsumedRecord]]) -> int:
    return sum(len(r) for r in records.values())


def _has_records(bootstrap: str, topic: str, count: int) -> bool:
    return _count(read_all(bootstrap, topic)) == count


def _topic_partitions(bootstrap: str, topic: str) -> int | None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return len(meta.partitions)


# -- one linked pair for specs, watermarks, health, reflection and drain ----------------------------------------


@dataclass
class SpecsSetup:
    pair: LinkedPair
    topic: str
    destination: str


@pytest.fixture(scope="module")
def linked(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SpecsSetup]:
    """A wrapper and a deduper of one flow over a 5-partition source topic that is empty at first.

    The wrapper starts first and publishes the topic's spec, so the spec
    reaches the deduper in the specs the link sends on connect; then the
    deduper starts, its own file pointing at a source cluster that does not
    exist.

    The tests using it run in file order; the last one drains both processes.
    """
    topic = kafka_helpers.unique_name("control-link", "specs")
    create_topic(source_cluster.bootstrap_servers, topic, 5, SOURCE_CONFIGS)
    pair = start_linked_pair(
        tmp_path_factory.mktemp("linked"),
        source_cluster,
        destination_cluster,
        flow=kafka_helpers.unique_name("control-link", "flow"),
        topics=[topic],
        deduper_source_bootstrap=BOGUS_SOURCE,
        start=("wrapper",),
    )
    try:
        pair.wrapper.wait_for_log(f"published spec of source topic {topic}", START_TIMEOUT_S)
        pair.deduper.start()
        yield SpecsSetup(pair, topic, f"src.{topic}")
    finally:
        pair.stop()


def test_topic_specs_reach_the_deduper_over_the_link_without_source_access(
    linked: SpecsSetup, destination_cluster: KafkaCluster
) -> None:
    pair, dest = linked.pair, linked.destination
    wait_until(
        lambda: _topic_partitions(destination_cluster.bootstrap_servers, dest) == 5,
        START_TIMEOUT_S,
        message=f"destination topic {dest} with 5 partitions",
    )
    # Only two paths create a destination topic: a spec over the link (at once), or the periodic
    # re-read of the spec topic, first due _SPEC_SYNC_INTERVAL_S after the deduper's loop starts
    # (an envelope would be a third, but the source topic is empty). Created sooner than that
    # after "starting", the spec came over the link.
    # The topic can be seen before the deduper has logged creating it.
    pair.deduper.wait_for_log(f"created topic {dest} with 5 partitions", START_TIMEOUT_S)
    started = log_time(pair.deduper, "deduper d1 starting")
    connected = log_time(pair.deduper, f"wrapper {pair.flow}-w1 connected over the control link")
    created = log_time(pair.deduper, f"created topic {dest} with 5 partitions")
    assert (created - started).total_seconds() < _SPEC_SYNC_INTERVAL_S, (started, created)
    assert connected <= created
    assert _count(read_all(destination_cluster.bootstrap_servers, dest)) == 0

    admin = AdminClient({"bootstrap.servers": destination_cluster.bootstrap_servers})
    resource = ConfigResource(ResourceType.TOPIC, dest)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "123456789"
    assert configs["max.message.bytes"].value == "2000000"
    assert configs["min.insync.replicas"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    # The deduper never tried its (bogus) source cluster.
    assert BOGUS_SOURCE not in pair.deduper.output()
    assert pair.deduper.alive and pair.wrapper.alive


def test_committed_watermarks_flow_back_to_the_wrapper(
    linked: SpecsSetup, source_cluster: KafkaCluster, destination_cluster: KafkaCluster
) -> None:
    pair, topic = linked.pair, linked.topic
    produce_sequences(source_cluster.bootstrap_servers, topic, 5, 40)
    src = read_all(source_cluster.bootstrap_servers, topic)
    last = {p: recs[-1].offset for p, recs in src.items()}
    assert len(last) == 5

    def caught_up() -> tuple[control_pb2.GetDeduperStatusResponse, control_pb2.GetWrapperStatusResponse] | None:
        d, w = pair.deduper_status(), pair.wrapper_status()
        if d is None or w is None:
            return None
        dw = {(x.topic, x.partition): (x.watermark, x.lag) for x in d.partitions}
        ww = {(x.topic, x.partition): (x.watermark, x.lag) for x in w.watermarks}
        want = {(topic, p): (o, 0) for p, o in last.items()}
        # The wrapper's own progress agrees: everything wrapped, log end just past the last offset.
        progress = {(p.topic, p.partition): (p.last_wrapped_offset, p.log_end_offset) for p in w.partitions}
        wrapped = {(topic, p): (o, o + 1) for p, o in last.items()}
        return (d, w) if dw == want and ww == want and progress == wrapped else None

    statuses = wait_until(
        caught_up, REPLICATION_TIMEOUT_S, message="watermark == last source offset, lag 0, both sides"
    )
    assert statuses is not None
    d, w = statuses
    assert w.control_connected
    assert d.connected_wrappers == [f"{pair.flow}-w1"]
    # Every commit is timed; the offset map is on, so each flushes the destination records first.
    assert d.transactions_committed >= 1
    assert 0 < d.commit_p50_ms <= d.commit_max_ms
    assert 0 < d.commit_flush_p50_ms <= d.commit_max_ms
    assert 0 < d.commit_flush_seconds_total < d.commit_seconds_total
    assert d.commit_seconds_total >= d.commit_max_ms / 1000

    # A separate read_committed reader sees exactly the records up to those watermarks.
    dst = read_all(destination_cluster.bootstrap_servers, linked.destination)
    watermarks = {x.partition: x.watermark for x in d.partitions}
    assert {p: len(r) for p, r in dst.items()} == {p: watermarks[p] + 1 for p in range(5)}
    assert {p: len(r) for p, r in dst.items()} == {p: len(r) for p, r in src.items()}
    assert_exact_copy(src, dst)


def test_both_services_serve_health_and_reflection_and_drain_on_sigterm(linked: SpecsSetup) -> None:
    pair = linked.pair
    wait_until(pair.link_up, START_TIMEOUT_S, message="link up")
    # The link comes up as soon as the deduper's gRPC server does, before its Kafka side: serving
    # follows (run alone, this test is the first to use the pair).
    wait_until(lambda: health(pair.deduper_address, "") == SERVING, START_TIMEOUT_S, message="deduper serving")
    for service in ("", CONTROL_SERVICE, DEDUPER_SERVICE, FLOW_SERVICE):
        assert health(pair.deduper_address, service) == SERVING, service
    for service in ("", WRAPPER_SERVICE):
        assert health(pair.wrapper_address, service) == SERVING, service

    reflection = "grpc.reflection.v1alpha.ServerReflection"
    deduper_services = {CONTROL_SERVICE, DEDUPER_SERVICE, FLOW_SERVICE, HEALTH_SERVICE, reflection}
    assert reflected_services(pair.deduper_address) == deduper_services
    assert reflected_services(pair.wrapper_address) == {WRAPPER_SERVICE, HEALTH_SERVICE, reflection}

    assert pair.wrapper.terminate() == 0
    # The deduper notices the wrapper's stream end.
    wait_until(
        lambda: (d := pair.deduper_status()) is not None and not d.connected_wrappers,
        10,
        message="deduper saw the wrapper leave",
    )
    assert pair.deduper.terminate() == 0
    for process in (pair.wrapper, pair.deduper):
        out = process.output()
        assert "received SIGTERM: draining" in out
        assert "Traceback" not in out
    assert f"wrapper {pair.flow}-w1 stopped" in pair.wrapper.output()
    assert "deduper d1 stopped" in pair.deduper.output()
    assert when_listening(lambda: deduper_status(pair.deduper_address)) is None  # the port is closed


# -- backpressure ------------------------------------------------------------------------------------------------


#: Records per partition of the backpressure burst: 2 per envelope, so staging ends 300 envelopes,
#: far more than the limit (50), ahead of a deduper that was away. The deduper commits a transaction
#: per envelope (a slow destination), so working through them takes seconds: longer than the
#: wrapper's reconnect (at most 1 s), whatever the speed of the rest of the deduper.
BURST_PER_PARTITION = 150


def test_backpressure_pauses_and_resumes_the_wrapper(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("bp")
    create_topic(source_cluster.bootstrap_servers, topic, 4)
    total = 4 * BURST_PER_PARTITION
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=unique_name("flow"),
        topics=[topic],
        wrapper={"envelope_max_records": 2},
        # A small batch and frequent checks: the deduper is fast, so its lag must be
        # measured while it is still working through the backlog.
        deduper={
            "backpressure_max_staging_lag": 50,
            "consume_batch_size": 20,
            "watermark_interval_s": 0.05,
            "transaction_max_records": 2,
        },
    )
    paused_seen: list[control_pb2.GetWrapperStatusResponse] = []
    try:
        wait_until(pair.link_up, START_TIMEOUT_S, message="link up")
        # The deduper is away while a burst arrives, so staging runs far ahead of it.
        assert pair.deduper.terminate() == 0
        produce_sequences(source_cluster.bootstrap_servers, topic, 4, BURST_PER_PARTITION, value_size=32)
        wait_until(
            lambda: (w := pair.wrapper_status()) is not None and w.records_sent == total,
            REPLICATION_TIMEOUT_S,
            message="burst wrapped into staging",
        )
        pair.deduper.start()

        def paused_once() -> bool:
            w = pair.wrapper_status()
            if w is not None and w.paused:
                paused_seen.append(w)
            return bool(paused_seen) or "pausing source reads" in pair.wrapper.output()

        wait_until(paused_once, REPLICATION_TIMEOUT_S, interval_s=0.05, message="wrapper paused")
        pair.wrapper.wait_for_log("resuming source reads", REPLICATION_TIMEOUT_S)
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(
            destination_cluster.bootstrap_servers, f"src.{topic}", expected=total, timeout_s=REPLICATION_TIMEOUT_S
        )
        assert_exact_copy(src, dst)

        out = pair.wrapper.output()
        paused_at = out.index("pausing source reads: staging is")
        assert "(limit 50)" in out[paused_at:]  # the deduper's reason travels with the pause
        # Lifted by the deduper once it caught up, not by the link failing open.
        assert "resuming source reads (caught up)" in out[paused_at:]
        assert "backpressure: pausing wrappers" in pair.deduper.output()
        wait_until(
            lambda: (w := pair.wrapper_status()) is not None and not w.paused and w.control_connected,
            30,
            message="resumed and linked at the end",
        )
        for w in paused_seen:
            assert w.pause_reason.startswith("staging is")
    finally:
        pair.stop()


# -- version negotiation (the deduper's servicer in process) -----------------------------------------------------

#: A refusal must come at once, not when the client gives up: far below the call deadline.
PROMPT_S = 2.0


@pytest.fixture
def hub_address() -> Iterator[tuple[ControlHub, str]]:
    hub = ControlHub("d", "flow")
    with control_server(hub) as server:
        yield hub, local(server.port)


def _refusal(address: str, first: control_pb2.ConnectRequest) -> tuple[grpc.RpcError, float]:
    started = time.monotonic()
    with ControlStream(address, timeout_s=10) as stream:
        stream.send(first)  # and the request side stays open
        with pytest.raises(grpc.RpcError) as err:
            stream.receive()
    return err.value, time.monotonic() - started


def test_a_different_major_is_refused_promptly_with_failed_precondition(hub_address: tuple[ControlHub, str]) -> None:
    hub, address = hub_address
    err, took = _refusal(address, hello(major=protocol.PROTOCOL_MAJOR + 1, minor=0, wrapper_id="w-new"))
    assert took < PROMPT_S
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    translated = rpc_error_from(err)
    assert translated.code == grpc.StatusCode.FAILED_PRECONDITION
    assert translated.reason == "INCOMPATIBLE_PEER_ERROR"
    assert translated.metadata["exception"].endswith("IncompatiblePeerError")
    # Names both versions.
    assert f"{protocol.PROTOCOL_MAJOR + 1}.0" in str(translated)
    assert protocol.describe(protocol.current_version()) in str(translated)
    assert hub.connected_wrappers() == []


def test_a_different_minor_is_welcomed(hub_address: tuple[ControlHub, str]) -> None:
    hub, address = hub_address
    with ControlStream(address) as stream:
        stream.send(hello(minor=protocol.PROTOCOL_MINOR + 3, wrapper_id="w-newer-minor"))
        first = stream.receive()
        assert first.WhichOneof("kind") == "welcome"
        assert first.welcome.version == protocol.current_version()
        assert first.welcome.deduper_id == "d"
        assert list(first.welcome.flows) == ["flow"]
        assert hub.connected_wrappers() == ["w-newer-minor"]
    wait_until(lambda: hub.connected_wrappers() == [], 5, message="session closed with the stream")

    with ControlStream(address) as older:
        older.send(hello(minor=0, wrapper_id="w-older-minor"))
        assert older.receive().WhichOneof("kind") == "welcome"


def test_the_drain_ends_every_stream_at_once_and_refuses_new_ones(hub_address: tuple[ControlHub, str]) -> None:
    hub, address = hub_address
    with ControlStream(address) as stream:
        stream.send(hello(wrapper_id="w-drained"))
        assert stream.receive().WhichOneof("kind") == "welcome"
        started = time.monotonic()
        hub.end_streams()
        # Ends cleanly (no error) within a poll of the outbound queue, not at the server's grace.
        with pytest.raises(StopIteration):
            stream.receive()
        assert time.monotonic() - started < PROMPT_S
    wait_until(lambda: hub.connected_wrappers() == [], 5, message="session closed with the stream")

    err, took = _refusal(address, hello(wrapper_id="w-late"))
    assert took < PROMPT_S
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in (err.details() or "")
    assert hub.connected_wrappers() == []


def test_a_wrapper_of_another_flow_is_refused(hub_address: tuple[ControlHub, str]) -> None:
    hub, address = hub_address
    err, took = _refusal(address, hello(flow="other-flow"))
    assert took < PROMPT_S
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    translated = rpc_error_from(err)
    assert translated.reason == "INCOMPATIBLE_PEER_ERROR"
    assert "'other-flow'" in str(translated) and "'flow'" in str(translated)
    assert hub.connected_wrappers() == []


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(control_pb2.ConnectRequest(progress=control_pb2.Progress()), id="progress"),
        pytest.param(control_pb2.ConnectRequest(topic_specs=control_pb2.TopicSpecs()), id="topic_specs"),
        pytest.param(control_pb2.ConnectRequest(), id="empty"),
    ],
)
def test_a_stream_not_opened_with_a_hello_is_invalid(
    hub_address: tuple[ControlHub, str], first: control_pb2.ConnectRequest
) -> None:
    hub, address = hub_address
    err, took = _refusal(address, first)
    assert took < PROMPT_S
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Hello" in (err.details() or "")
    assert hub.connected_wrappers() == []


def test_a_stream_closed_before_any_message_is_invalid(hub_address: tuple[ControlHub, str]) -> None:
    _hub, address = hub_address
    with ControlStream(address, timeout_s=10) as stream:
        stream.half_close()
        with pytest.raises(grpc.RpcError) as err:
            stream.receive()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- TLS, mutual TLS and a token on the link ---------------------------------------------------------------------


def test_link_runs_over_mutual_tls_with_a_token_and_refuses_everyone_else(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    token = "s3cret-link-token"
    rpc = {
        "tls": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "ca_file": str(pki.ca_cert),
            "require_client_cert": True,
        },
        "auth_token": token,
    }
    client_tls = TlsConfig(cert_file=pki.client_cert, key_file=pki.client_key, ca_file=pki.ca_cert)
    client = RpcConfig(tls=client_tls, auth_token=SecretStr(token))
    topic = unique_name("tls")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, 100)
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=unique_name("flow"),
        topics=[topic],
        rpc=rpc,
        client_rpc=client,
    )
    try:
        wait_until(pair.link_up, START_TIMEOUT_S, message="link up over mutual TLS with the token")
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(
            destination_cluster.bootstrap_servers, f"src.{topic}", expected=200, timeout_s=REPLICATION_TIMEOUT_S
        )
        assert_exact_copy(src, dst)
        assert pair.wrapper.output().count("control link to deduper d1") >= 1

        def code_of(call: Callable[[], object]) -> grpc.StatusCode:
            with pytest.raises(grpc.RpcError) as err:
                call()
            return err.value.code()

        address = pair.deduper_address
        plaintext = RpcConfig(auth_token=SecretStr(token))
        no_client_cert = RpcConfig(tls=TlsConfig(ca_file=pki.ca_cert), auth_token=SecretStr(token))
        no_token = RpcConfig(tls=client_tls)
        wrong_token = RpcConfig(tls=client_tls, auth_token=SecretStr("guess"))
        assert code_of(lambda: deduper_status(address, plaintext)) == grpc.StatusCode.UNAVAILABLE
        assert code_of(lambda: deduper_status(address, no_client_cert)) == grpc.StatusCode.UNAVAILABLE
        assert code_of(lambda: deduper_status(address, no_token)) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: deduper_status(address, wrong_token)) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: wrapper_status(pair.wrapper_address, no_token)) == grpc.StatusCode.UNAUTHENTICATED
        # The control stream itself is guarded, not only the status: a tokenless wrapper cannot join.
        with ControlStream(address, no_token) as rogue:
            rogue.send(hello(flow=pair.flow, wrapper_id="rogue"))
            with pytest.raises(grpc.RpcError) as err:
                rogue.receive()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Health stays open without the token (orchestrators probe it), still over mutual TLS.
        assert health(address, DEDUPER_SERVICE, no_token) == SERVING
        assert pair.await_deduper_status().connected_wrappers == [f"{pair.flow}-w1"]
    finally:
        pair.stop()


# -- gaps healed over gRPC ---------------------------------------------------------------------------------------

#: Source records of each gap scenario, one envelope each; the first GAP_SIZE envelopes are deleted from staging.
GAP_RECORDS = 50
GAP_SIZE = 20
#: How long a resend may take on loopback: a consumer start and one fetch of a few records take about a second.
RESEND_ANSWER_S = 10.0
#: resend_retry_s of the ``tail`` scenario: far beyond the test's patience, so no retry timer can be
#: what heals it; only asking for the rest as soon as the first answer is in can.
TAIL_RETRY_S = 600.0


@dataclass
class GapScenario:
    pair: LinkedPair
    topic: str


@pytest.fixture(scope="module")
def gaps(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, GapScenario]]:
    """Two flows with a gap planted in staging before their deduper ever read it, run side by side.

    Each: GAP_RECORDS source records in one partition, one envelope each in one
    staging partition, the first GAP_SIZE envelopes deleted (DeleteRecords)
    while only the wrapper ran; then the deduper starts. ``plain`` reads
    staging in batches; ``tail`` one envelope per loop, so the gap keeps growing
    after the deduper's first resend request.
    """
    scenarios: dict[str, GapScenario] = {}
    try:
        for name, deduper in (("plain", {}), ("tail", {"consume_batch_size": 1, "resend_retry_s": TAIL_RETRY_S})):
            topic = kafka_helpers.unique_name("control-link", f"gap-{name}")
            flow = kafka_helpers.unique_name("control-link", f"gap-{name}")
            create_topic(source_cluster.bootstrap_servers, topic, 1)
            produce_sequences(source_cluster.bootstrap_servers, topic, 1, GAP_RECORDS)
            pair = start_linked_pair(
                tmp_path_factory.mktemp(f"gap-{name}"),
                source_cluster,
                destination_cluster,
                flow=flow,
                topics=[topic],
                staging_partitions=1,
                wrapper={"envelope_max_records": 1},
                deduper=deduper,
                # The wrapper redials every 50 ms at most: its link is up long before the new
                # deduper has initialised transactions and joined its group (hundreds of ms), so
                # the first resend request goes out while the rest of the gap is still unread.
                rpc={"connect_backoff_max_s": 0.05},
                start=("wrapper",),
            )
            scenarios[name] = GapScenario(pair, topic)
        admin = AdminClient({"bootstrap.servers": destination_cluster.bootstrap_servers})
        for scenario in scenarios.values():
            staging = f"ferryman.{scenario.pair.flow}.staging.internal"
            wait_until(
                functools.partial(_has_records, destination_cluster.bootstrap_servers, staging, GAP_RECORDS),
                REPLICATION_TIMEOUT_S,
                message=f"{GAP_RECORDS} envelopes in {staging}",
            )
            prefix = TopicPartition(staging, 0, GAP_SIZE)
            admin.delete_records([prefix])[prefix].result(30)
        for scenario in scenarios.values():
            scenario.pair.deduper.start()
        yield scenarios
    finally:
        # SIGTERM to all four first: their drains then overlap instead of adding up.
        for scenario in scenarios.values():
            for process in (scenario.pair.wrapper, scenario.pair.deduper):
                if process.proc is not None and process.alive:
                    process.proc.send_signal(signal.SIGTERM)
        for scenario in scenarios.values():
            scenario.pair.stop()


def test_gap_in_staging_is_closed_by_envelopes_resent_over_grpc(
    gaps: dict[str, GapScenario], source_cluster: KafkaCluster, destination_cluster: KafkaCluster
) -> None:
    pair, topic = gaps["plain"].pair, gaps["plain"].topic
    pair.deduper.wait_for_log(f"GAP in source partition {topic}-0", START_TIMEOUT_S)
    src = read_all(source_cluster.bootstrap_servers, topic)
    dst = read_all(
        destination_cluster.bootstrap_servers, f"src.{topic}", expected=GAP_RECORDS, timeout_s=3 * RESEND_ANSWER_S
    )
    assert_exact_copy(src, dst)
    pair.deduper.wait_for_log(f"gap in {topic}-0 closed: records 0..", 10)
    pair.deduper.wait_for_log("arrived over the control link (resend)", 10)
    pair.wrapper.wait_for_log(f"deduper asked for {topic}-0 offsets 0..", 10)
    d = pair.await_deduper_status()
    assert d.gaps_detected >= 1
    assert d.gaps_healed >= 1
    assert [(x.topic, x.partition, x.watermark) for x in d.partitions] == [(topic, 0, GAP_RECORDS - 1)]
    w = pair.await_wrapper_status()
    assert w.resends_served >= 1
    assert w.records_sent == GAP_RECORDS  # the resend re-read the source; it did not re-wrap into staging


def test_a_resend_is_answered_as_soon_as_its_range_is_read(gaps: dict[str, GapScenario]) -> None:
    """The wrapper answers a resend request once it has read the range, not after a fixed wait."""
    pair, topic = gaps["plain"].pair, gaps["plain"].topic
    pair.deduper.wait_for_log(f"gap in {topic}-0 closed", START_TIMEOUT_S)
    asked = log_time(pair.deduper, f"asked for source records {topic}-0 0..")
    closed = log_time(pair.deduper, f"gap in {topic}-0 closed")
    took = (closed - asked).total_seconds()
    assert took < RESEND_ANSWER_S, (
        f"the first resend request took {took:.1f}s to be answered; "
        f"the deduper asked {pair.deduper.output().count(f'asked for source records {topic}-0')} times meanwhile"
    )


def test_gap_is_closed_even_when_more_of_it_is_read_before_the_resend_answer(
    gaps: dict[str, GapScenario], source_cluster: KafkaCluster, destination_cluster: KafkaCluster
) -> None:
    """The first resend request covers the start of the gap; the envelopes after it are read before the answer.

    They are held as part of the same gap, so the answer fills only its start.
    The source is quiet: no later envelope will reveal what is still missing,
    and no retry timer fires within the test (TAIL_RETRY_S). The deduper must
    ask for the rest as soon as the first answer is in.
    """
    pair, topic = gaps["tail"].pair, gaps["tail"].topic
    pair.deduper.wait_for_log("again (request 1)", START_TIMEOUT_S)
    first = re.search(
        rf"asked for source records {re.escape(topic)}-0 0\.\.(\d+) again \(request 1\)", pair.deduper.output()
    )
    assert first is not None
    first_to = int(first.group(1))
    assert first_to < GAP_RECORDS - 1, "precondition: the first request covers only part of the gap"
    src = read_all(source_cluster.bootstrap_servers, topic)
    # Two resend round trips, far less than TAIL_RETRY_S.
    dst = read_all(
        destination_cluster.bootstrap_servers, f"src.{topic}", expected=GAP_RECORDS, timeout_s=2 * RESEND_ANSWER_S
    )
    assert_exact_copy(src, dst)
    out = pair.deduper.output()
    assert f"gap in {topic}-0 partly filled: records 0..{first_to} arrived over the control link (resend)" in out
    # The rest was asked for at once, starting right after the first answer (nothing asked twice).
    assert re.search(rf"asked for source records {re.escape(topic)}-0 {first_to + 1}\.\.\d+ again \(request 2\)", out)
    pair.deduper.wait_for_log(f"gap in {topic}-0 closed: records 0..{GAP_RECORDS - 1} arrived over the control", 10)
    d = pair.await_deduper_status()
    assert d.gaps_healed == 1  # one gap, healed once, in two answers
    assert [(x.topic, x.partition, x.watermark) for x in d.partitions] == [(topic, 0, GAP_RECORDS - 1)]
