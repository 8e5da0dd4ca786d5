"""ferryman.rpc over real transports: TLS, mutual TLS, and a link cut by a TCP proxy."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import msgspec
import pytest
from ferryman.config import RpcConfig, SecretStr, TlsConfig
from ferryman.rpc import open_channel, rpc_error_from
from ferryman.v1 import control_pb2_grpc

from tests.helpers.certs import TestPki, make_pki
from tests.helpers.grpc_clients import CALL_TIMEOUT_S
from tests.helpers.tcp_proxy import TcpProxy
from tests.integration.test_rpc_server import (
    Requests,
    hello,
    progress,
    running_server,
    status_call,
)

pytestmark = pytest.mark.integration

#: Reconnect fast in tests: gRPC's first reconnect backoff is 1 s (+-20 %).
FAST_RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    """A second PKI the servers do not trust."""
    return make_pki(tmp_path_factory.mktemp("other-pki"), ca_name="Untrusted test CA")


def _server_tls(pki: TestPki, *, mutual: bool) -> RpcConfig:
    return RpcConfig(
        tls=TlsConfig(
            cert_file=pki.server_cert, key_file=pki.server_key, ca_file=pki.ca_cert, require_client_cert=mutual
        )
    )


def _client_tls(
    ca: Path, cert: Path | None = None, key: Path | None = None, server_name_override: str | None = None
) -> RpcConfig:
    return RpcConfig(tls=TlsConfig(cert_file=cert, key_file=key, ca_file=ca, server_name_override=server_name_override))


def _fails_unavailable(address: str, rpc: RpcConfig) -> None:
    with open_channel(address, rpc) as channel, pytest.raises(grpc.RpcError) as info:
        status_call(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


# -- TLS ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_tls_unary_and_stream(pki: TestPki, other_pki: TestPki, host: str) -> None:
    with running_server(_server_tls(pki, mutual=False)) as (server, _):
        with open_channel(f"{host}:{server.port}", _client_tls(pki.ca_cert)) as channel:
            assert status_call(channel).flow == "test-flow"
            requests = Requests(hello(), progress(9))
            requests.close()
            kinds = [
                r.WhichOneof("kind")
                for r in control_pb2_grpc.ControlServiceStub(channel).Connect(iter(requests), timeout=CALL_TIMEOUT_S)
            ]
            assert kinds == ["welcome", "watermarks"]
        _fails_unavailable(f"{host}:{server.port}", RpcConfig())  # plaintext client
        _fails_unavailable(f"{host}:{server.port}", _client_tls(other_pki.ca_cert))  # server not trusted


def test_tls_server_name_override(tmp_path: Path) -> None:
    """The certificate names only 'ferryman.test'; the client dials 127.0.0.1 and checks that name."""
    named = make_pki(tmp_path, hosts=("ferryman.test",))
    with running_server(_server_tls(named, mutual=False)) as (server, _):
        address = f"127.0.0.1:{server.port}"
        with open_channel(address, _client_tls(named.ca_cert, server_name_override="ferryman.test")) as channel:
            assert status_call(channel).flow == "test-flow"
        _fails_unavailable(address, _client_tls(named.ca_cert))  # 127.0.0.1 is not in the certificate


def test_mutual_tls_accepts_a_client_certificate(pki: TestPki) -> None:
    with running_server(_server_tls(pki, mutual=True)) as (server, _):
        address = f"localhost:{server.port}"
        with open_channel(address, _client_tls(pki.ca_cert, pki.client_cert, pki.client_key)) as channel:
            assert status_call(channel).flow == "test-flow"
        # One process, one certificate: the server's own certificate works as a client's too.
        with open_channel(address, _client_tls(pki.ca_cert, pki.server_cert, pki.server_key)) as channel:
            assert status_call(channel).flow == "test-flow"


def test_mutual_tls_rejects_clients_without_a_trusted_certificate(pki: TestPki, other_pki: TestPki) -> None:
    with running_server(_server_tls(pki, mutual=True)) as (server, _):
        address = f"localhost:{server.port}"
        _fails_unavailable(address, _client_tls(pki.ca_cert))  # no certificate
        _fails_unavailable(address, _client_tls(pki.ca_cert, other_pki.client_cert, other_pki.client_key))


def test_tls_with_token_auth(pki: TestPki) -> None:
    server_rpc = msgspec.structs.replace(_server_tls(pki, mutual=True), auth_token=SecretStr("tok"))
    client_tls = _client_tls(pki.ca_cert, pki.client_cert, pki.client_key).tls
    with running_server(server_rpc) as (server, _):
        address = f"localhost:{server.port}"
        with open_channel(address, RpcConfig(tls=client_tls, auth_token=SecretStr("tok"))) as channel:
            assert status_call(channel).flow == "test-flow"
        with open_channel(address, RpcConfig(tls=client_tls)) as channel, pytest.raises(grpc.RpcError) as info:
            status_call(channel)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


# -- TCP proxy: network faults -----------------------------------------------------------------------------------


def test_proxy_cut_fails_an_open_stream_unavailable_and_calls_succeed_after_restore() -> None:
    with (
        running_server() as (server, servicer),
        TcpProxy("127.0.0.1", server.port) as proxy,
        open_channel(proxy.address, RpcConfig(), options=FAST_RECONNECT) as channel,
    ):
        requests = Requests(hello())
        responses = control_pb2_grpc.ControlServiceStub(channel).Connect(iter(requests), timeout=CALL_TIMEOUT_S)
        assert next(responses).HasField("welcome")

        proxy.cut()
        with pytest.raises(grpc.RpcError) as info:
            next(responses)
        requests.close()
        assert rpc_error_from(info.value).code == grpc.StatusCode.UNAVAILABLE
        assert servicer.stream_ended.wait(CALL_TIMEOUT_S)  # the server saw the link go too

        with pytest.raises(grpc.RpcError) as during:  # while cut, new calls fail fast
            status_call(channel)
        assert during.value.code() == grpc.StatusCode.UNAVAILABLE

        proxy.restore()
        assert status_call(channel, wait_for_ready=True).flow == "test-flow"
        again = Requests(hello(), progress(3))
        again.close()
        kinds = [
            r.WhichOneof("kind")
            for r in control_pb2_grpc.ControlServiceStub(channel).Connect(iter(again), timeout=CALL_TIMEOUT_S)
        ]
        assert kinds == ["welcome", "watermarks"]


@pytest.fixture
def echo_upstream() -> Iterator[int]:
    """A one-connection-at-a-time echo server (enough for the proxy's own tests)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(ConnectionError):  # the proxy resets links on cut()
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(CALL_TIMEOUT_S)


def test_proxy_forwards_resets_on_cut_refuses_while_cut_and_stops_idempotently(echo_upstream: int) -> None:
    proxy = TcpProxy("127.0.0.1", echo_upstream).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=CALL_TIMEOUT_S) as conn:
            payload = b"x" * 300_000  # more than one chunk
            conn.sendall(payload)
            received = b""
            while len(received) < len(payload):
                received += conn.recv(65536)
            assert received == payload

            proxy.cut()  # returns once the reset is sent
            with pytest.raises(ConnectionResetError):
                conn.recv(16)

        with (  # reset while cut: seen by connect() or by the first recv(), depending on timing
            pytest.raises(ConnectionResetError),
            socket.create_connection(("127.0.0.1", proxy.port), timeout=CALL_TIMEOUT_S) as conn,
        ):
            conn.recv(16)
        proxy.restore()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=CALL_TIMEOUT_S) as conn:
            conn.sendall(b"ping")
            assert conn.recv(16) == b"ping"
    finally:
        proxy.stop()
        proxy.stop()
    assert proxy.accepted == 3
