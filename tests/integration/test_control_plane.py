"""The gRPC pair on real clusters: specs, watermarks, backpressure, link loss, resend, TLS, versions."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from ferryman import protocol
from ferryman.config import RpcConfig, TlsConfig
from ferryman.rpc import build_server, default_server_interceptors, open_channel, rpc_error_from
from ferryman.v1 import control_pb2, control_pb2_grpc
from ferryman_deduper._control import ControlHub, ControlServicer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.certs import make_pki
from tests.helpers.kafka import assert_exact_copy, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import ServiceProcess, flow_config, write_config
from tests.helpers.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pair(
    tmp_path: Path,
    source_cluster: Any,
    destination_cluster: Any,
    flow: str,
    topics: list[str],
    *,
    link_port: int | None = None,
    deduper_port: int | None = None,
    wrapper_port: int | None = None,
    rpc: dict[str, Any] | None = None,
    wrapper: dict[str, Any] | None = None,
    deduper: dict[str, Any] | None = None,
    extra_flow: dict[str, Any] | None = None,
    deduper_source_bootstrap: str | None = None,
    staging_partitions: int = 6,
) -> tuple[ServiceProcess, ServiceProcess, int, int]:
    """A wrapper and a deduper joined by the control link (optionally through a proxy port)."""
    dport = deduper_port or _port()
    wport = wrapper_port or _port()
    common: dict[str, Any] = {
        "source_bootstrap": source_cluster.bootstrap_servers,
        "destination_bootstrap": destination_cluster.bootstrap_servers,
        "flow": flow,
        "topics": topics,
        "staging_partitions": staging_partitions,
        "extra_flow": extra_flow,
        "wrapper": {
            "listen_address": f"127.0.0.1:{wport}",
            "deduper_addresses": [f"127.0.0.1:{link_port or dport}"],
            "progress_interval_s": 0.5,
            **(wrapper or {}),
        },
        "deduper": {"listen_address": f"127.0.0.1:{dport}", "watermark_interval_s": 0.5, **(deduper or {})},
    }
    wcfg = flow_config(**common)
    dcfg = flow_config(**{**common, "source_bootstrap": deduper_source_bootstrap or source_cluster.bootstrap_servers})
    if rpc:
        wcfg["rpc"] = rpc
        dcfg["rpc"] = rpc
    wpath = write_config(tmp_path / "wrapper.yaml", wcfg)
    dpath = write_config(tmp_path / "deduper.yaml", dcfg)
    d = ServiceProcess("deduper", dpath, tmp_path, args=["--instance-id", "d1"]).start()
    w = ServiceProcess("wrapper", wpath, tmp_path).start()
    return w, d, wport, dport


def _wrapper_status(port: int, rpc: RpcConfig | None = None) -> control_pb2.GetWrapperStatusResponse:
    with open_channel(f"127.0.0.1:{port}", rpc or RpcConfig()) as ch:
        return control_pb2_grpc.WrapperServiceStub(ch).GetWrapperStatus(
            control_pb2.GetWrapperStatusRequest(), timeout=5
        )


def _deduper_status(port: int, rpc: RpcConfig | None = None) -> control_pb2.GetDeduperStatusResponse:
    with open_channel(f"127.0.0.1:{port}", rpc or RpcConfig()) as ch:
        return control_pb2_grpc.DeduperServiceStub(ch).GetDeduperStatus(
            control_pb2.GetDeduperStatusRequest(), timeout=5
        )


def _try(fn: Any) -> Any:
    try:
        return fn()
    except grpc.RpcError:
        return None


def test_specs_watermarks_health_without_source_credentials(
    source_cluster, destination_cluster, unique_name, tmp_path: Path
) -> None:
    topic = unique_name("specs")
    create_topic(source_cluster.bootstrap_servers, topic, 5, {"retention.ms": "123456789"})
    produce_sequences(source_cluster.bootstrap_servers, topic, 5, 200)
    w, d, wport, dport = _pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        unique_name("flow"),
        [topic],
        deduper_source_bootstrap="127.0.0.1:9",  # the deduper never needs the source cluster
    )
    try:
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=1000, timeout_s=90)
        assert_exact_copy(src, dst)
        admin = AdminClient({"bootstrap.servers": destination_cluster.bootstrap_servers})
        res = ConfigResource(ResourceType.TOPIC, f"src.{topic}")
        assert admin.describe_configs([res])[res].result(30)["retention.ms"].value == "123456789"
        assert len(admin.list_topics(f"src.{topic}", timeout=10).topics[f"src.{topic}"].partitions) == 5

        # Watermarks flow back: each partition at its last source offset, lag 0, on both sides.
        last = {p: recs[-1].offset for p, recs in src.items()}

        def caught_up() -> bool:
            ds = _try(lambda: _deduper_status(dport))
            ws = _try(lambda: _wrapper_status(wport))
            if ds is None or ws is None:
                return False
            dw = {(x.topic, x.partition): (x.watermark, x.lag) for x in ds.partitions}
            ww = {(x.topic, x.partition): x.watermark for x in ws.watermarks}
            return all(dw.get((topic, p)) == (o, 0) and ww.get((topic, p)) == o for p, o in last.items())

        wait_until(caught_up, 30, message="watermarks and lag at the source end, on both sides")
        assert _wrapper_status(wport).control_connected
        assert _deduper_status(dport).connected_wrappers

        # Both services are gRPC servers with standard health and reflection.
        for port, service in ((dport, "ferryman.v1.ControlService"), (wport, "ferryman.v1.WrapperService")):
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
        assert w.terminate() == 0
        assert d.terminate() == 0
    finally:
        w.stop()
        d.stop()


def test_backpressure_pauses_and_resumes_the_wrapper(
    source_cluster, destination_cluster, unique_name, tmp_path: Path
) -> None:
    topic = unique_name("bp")
    create_topic(source_cluster.bootstrap_servers, topic, 4)
    w, d, wport, _dport = _pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        unique_name("flow"),
        [topic],
        # Small envelopes, a small deduper batch and frequent checks: the deduper is fast,
        # so it must be measured while it is still working through the backlog.
        wrapper={"envelope_max_records": 2},
        deduper={"backpressure_max_staging_lag": 50, "consume_batch_size": 20, "watermark_interval_s": 0.05},
    )
    try:
        wait_until(
            lambda: (s := _try(lambda: _wrapper_status(wport))) is not None and s.control_connected,
            60,
            message="control link up",
        )
        # The deduper is away while a burst arrives, so staging runs far ahead of it.
        assert d.terminate() == 0
        produce_sequences(source_cluster.bootstrap_servers, topic, 4, 6000, value_size=32)
        wait_until(lambda: _wrapper_status(wport).records_sent >= 24000, 90, message="burst wrapped")
        d.start()
        w.wait_for_log("pausing source reads", 90)
        w.wait_for_log("resuming source reads", 90)
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=24000, timeout_s=180)
        assert_exact_copy(src, dst)
        assert "staging is" in w.output()  # the reason travels with the pause
    finally:
        w.stop()
        d.stop()


def test_link_cut_and_deduper_restart_do_not_stop_data(
    source_cluster, destination_cluster, unique_name, tmp_path: Path
) -> None:
    topic = unique_name("cut")
    create_topic(source_cluster.bootstrap_servers, topic, 3)
    dport = _port()
    with TcpProxy("127.0.0.1", dport) as proxy:
        w, d, wport, _ = _pair(
            tmp_path,
            source_cluster,
            destination_cluster,
            unique_name("flow"),
            [topic],
            link_port=proxy.port,
            deduper_port=dport,
        )
        try:
            wait_until(
                lambda: (s := _try(lambda: _wrapper_status(wport))) is not None and s.control_connected,
                60,
                message="control link up",
            )
            proxy.cut()
            wait_until(lambda: not _wrapper_status(wport).control_connected, 30, message="link loss noticed")
            # Data flows while the link is down.
            produce_sequences(source_cluster.bootstrap_servers, topic, 3, 300)
            read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=900, timeout_s=90)
            proxy.restore()
            wait_until(lambda: _wrapper_status(wport).control_connected, 60, message="link back after restore")
            # The deduper dies and comes back: the link recovers by itself.
            d.kill9()
            d.start()
            produce_sequences(source_cluster.bootstrap_servers, topic, 3, 300, start=300)
            wait_until(lambda: _wrapper_status(wport).control_connected, 90, message="link back after restart")
            src = read_all(source_cluster.bootstrap_servers, topic)
            dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=1800, timeout_s=90)
            assert_exact_copy(src, dst)
            assert "control link to" in w.output() and "lost" in w.output()
        finally:
            w.stop()
            d.stop()


def test_gap_in_staging_is_healed_by_a_resend_over_grpc(
    source_cluster, destination_cluster, unique_name, tmp_path: Path
) -> None:
    topic = unique_name("heal")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    produce_sequences(source_cluster.bootstrap_servers, topic, 1, 50)
    flow = unique_name("flow")
    staging = f"ferryman.{flow}.staging.internal"
    dport = _port()
    wport = _port()
    # First only the wrapper (the deduper's address answers nothing yet): staging fills up.
    w, d, _, _ = _pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow,
        [topic],
        deduper_port=dport,
        wrapper_port=wport,
        staging_partitions=1,
        wrapper={"envelope_max_records": 1},
        deduper={"resend_retry_s": 2.0},
    )
    d.stop()
    dadmin = AdminClient({"bootstrap.servers": destination_cluster.bootstrap_servers})
    try:
        wait_until(
            lambda: sum(len(v) for v in read_all(destination_cluster.bootstrap_servers, staging).values()) >= 50,
            60,
            message="staging filled",
        )
        dadmin.delete_records([TopicPartition(staging, 0, 20)])[TopicPartition(staging, 0, 20)].result(30)
        d.start()
        d.wait_for_log("GAP in source partition", 60)
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=50, timeout_s=90)
        assert_exact_copy(src, dst)
        d.wait_for_log("over the control link (resend)", 30)
        assert _deduper_status(dport).gaps_healed >= 1
        assert _wrapper_status(wport).resends_served >= 1
    finally:
        w.stop()
        d.stop()


def test_tls_mutual_tls_and_token_on_the_link(source_cluster, destination_cluster, unique_name, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    rpc = {
        "tls": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "ca_file": str(pki.ca_cert),
            "require_client_cert": True,
        },
        "auth_token": "s3cret",
    }
    topic = unique_name("tls")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, 100)
    w, d, wport, dport = _pair(tmp_path, source_cluster, destination_cluster, unique_name("flow"), [topic], rpc=rpc)
    client_rpc = RpcConfig(
        tls=TlsConfig(cert_file=pki.client_cert, key_file=pki.client_key, ca_file=pki.ca_cert),
        auth_token="s3cret",  # type: ignore[arg-type]
    )
    try:
        read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=200, timeout_s=90)
        wait_until(
            lambda: (s := _try(lambda: _wrapper_status(wport, client_rpc))) is not None and s.control_connected,
            60,
            message="link up over mutual TLS",
        )
        # Without the token: UNAUTHENTICATED. Without a client certificate: the handshake fails.
        no_token = RpcConfig(tls=client_rpc.tls)
        with pytest.raises(grpc.RpcError) as err:
            _deduper_status(dport, no_token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        no_cert = RpcConfig(tls=TlsConfig(ca_file=pki.ca_cert), auth_token="s3cret")  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as err:
            _deduper_status(dport, no_cert)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            _deduper_status(dport)  # plaintext against a TLS server
    finally:
        w.stop()
        d.stop()


@pytest.fixture
def control_server() -> Iterator[int]:
    hub = ControlHub("d-test", "flow-a")
    server = build_server(
        listen_address="127.0.0.1:0",
        rpc=RpcConfig(),
        register=[lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(ControlServicer(hub), s)],
        service_names=["ferryman.v1.ControlService"],
        interceptors=default_server_interceptors(RpcConfig()),
    )
    server.start()
    try:
        yield server.port
    finally:
        server.stop(1)


def _connect(port: int, first: control_pb2.ConnectRequest) -> control_pb2.ConnectResponse:
    with open_channel(f"127.0.0.1:{port}", RpcConfig()) as ch:
        call = control_pb2_grpc.ControlServiceStub(ch).Connect(iter([first]), timeout=10)
        response = next(iter(call))
        call.cancel()
        return response


def _hello(major: int, minor: int, flow: str = "flow-a") -> control_pb2.ConnectRequest:
    return control_pb2.ConnectRequest(
        hello=control_pb2.Hello(
            version=control_pb2.ProtocolVersion(major=major, minor=minor), wrapper_id="w", flow=flow
        )
    )


def test_version_negotiation(control_server: int) -> None:
    newer_minor = _connect(control_server, _hello(protocol.PROTOCOL_MAJOR, protocol.PROTOCOL_MINOR + 7))
    assert newer_minor.WhichOneof("kind") == "welcome"
    assert list(newer_minor.welcome.flows) == ["flow-a"]
    for bad, code in (
        (_hello(protocol.PROTOCOL_MAJOR + 1, 0), grpc.StatusCode.FAILED_PRECONDITION),
        (_hello(protocol.PROTOCOL_MAJOR, 0, flow="other"), grpc.StatusCode.FAILED_PRECONDITION),
        (control_pb2.ConnectRequest(progress=control_pb2.Progress()), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.RpcError) as err:
            _connect(control_server, bad)
        assert err.value.code() == code
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            assert rpc_error_from(err.value).reason == "INCOMPATIBLE_PEER_ERROR"
