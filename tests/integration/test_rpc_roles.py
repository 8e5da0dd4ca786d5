"""Token roles on a real gRPC server on loopback, over mutual TLS: who may call what, and how refusals read.

The server carries the services' real status servicers, the control link, and a probe service
with one admin RPC (``ferryman.test.Probe/PauseAll``: the role rule goes by name, so any service
the project adds later is covered the same way). The deduper's real FlowService, on a flow
store in the destination cluster, is checked method by method from its descriptor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from ferryman.config import ApiToken, ClusterConfig, RpcConfig, SecretStr, TlsConfig
from ferryman.flows import FlowRegistry
from ferryman.rpc import RpcServer, build_server, default_server_interceptors, rpc_error_from
from ferryman.rpc import open_channel as _open
from ferryman.v1 import control_pb2, control_pb2_grpc, flows_pb2, flows_pb2_grpc
from ferryman_deduper._control import DeduperStatusServicer
from ferryman_deduper._flows import FlowServicer

from tests.helpers.certs import TestPki, make_pki
from tests.helpers.grpc_clients import CALL_TIMEOUT_S, DEDUPER_SERVICE, local
from tests.helpers.kafka import KafkaCluster
from tests.helpers.proto_strategies import message_class

pytestmark = pytest.mark.integration

SERVICE_TOKEN = "service-own-token"
TOKENS = {
    "viewer": ApiToken(secret=SecretStr("viewer-secret"), role="read-only"),
    "operator": ApiToken(secret=SecretStr("operator-secret"), role="admin"),
    "link": ApiToken(secret=SecretStr("link-secret"), role="peer"),
}
PAUSE_ALL = "/ferryman.test.Probe/PauseAll"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def _server(pki: TestPki, flows: FlowRegistry | None = None) -> Iterator[RpcServer]:
    rpc = RpcConfig(
        tls=TlsConfig(
            cert_file=pki.server_cert, key_file=pki.server_key, ca_file=pki.ca_cert, require_client_cert=True
        ),
        auth_token=SecretStr(SERVICE_TOKEN),
        tokens=TOKENS,
    )
    status = DeduperStatusServicer(lambda: control_pb2.GetDeduperStatusResponse(deduper_id="d-1", flow="f"))
    probe = grpc.method_handlers_generic_handler(
        "ferryman.test.Probe",
        {"PauseAll": grpc.unary_unary_rpc_method_handler(lambda request, context: b"paused")},
    )
    server = build_server(
        listen_address="127.0.0.1:0",
        rpc=rpc,
        register=[
            lambda s: control_pb2_grpc.add_DeduperServiceServicer_to_server(status, s),
            lambda s: s.add_generic_rpc_handlers((probe,)),
            *([lambda s: flows_pb2_grpc.add_FlowServiceServicer_to_server(FlowServicer(flows), s)] if flows else []),
        ],
        service_names=[DEDUPER_SERVICE],
        interceptors=default_server_interceptors(rpc),
    )
    server.start()
    server.set_serving(DEDUPER_SERVICE, True)
    try:
        yield server
    finally:
        server.stop(0)


def _client(pki: TestPki, token: str | None) -> RpcConfig:
    tls = TlsConfig(cert_file=pki.client_cert, key_file=pki.client_key, ca_file=pki.ca_cert)
    return RpcConfig(tls=tls, auth_token=SecretStr(token) if token else None)


def _status(channel: grpc.Channel) -> Any:
    stub = control_pb2_grpc.DeduperServiceStub(channel)
    return stub.GetDeduperStatus(control_pb2.GetDeduperStatusRequest(), timeout=CALL_TIMEOUT_S)


def _pause(channel: grpc.Channel) -> Any:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(PAUSE_ALL)
    return call(b"", timeout=CALL_TIMEOUT_S)


def _connect(channel: grpc.Channel) -> Any:
    hello = control_pb2.ConnectRequest(
        hello=control_pb2.Hello(wrapper_id="w", flow="f", version=control_pb2.ProtocolVersion(major=1))
    )
    return next(control_pb2_grpc.ControlServiceStub(channel).Connect(iter([hello]), timeout=CALL_TIMEOUT_S))


def _outcome(pki: TestPki, address: str, token: str | None, call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with _open(address, _client(pki, token)) as channel:
        try:
            call(channel)
        except grpc.RpcError as exc:
            error = rpc_error_from(exc)
            return error.code, error.reason, dict(error.metadata)
    return grpc.StatusCode.OK, "", {}


@pytest.mark.parametrize(
    ("token", "status", "pause"),
    [
        ("viewer-secret", grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED),
        ("operator-secret", grpc.StatusCode.OK, grpc.StatusCode.OK),
        (SERVICE_TOKEN, grpc.StatusCode.OK, grpc.StatusCode.OK),
        ("link-secret", grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED),
        ("guess", grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED),
        (None, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED),
    ],
    ids=["read-only", "admin", "service-token", "peer", "wrong", "none"],
)
def test_roles_on_a_read_and_an_admin_rpc(
    pki: TestPki, token: str | None, status: grpc.StatusCode, pause: grpc.StatusCode
) -> None:
    with _server(pki) as server:
        address = local(server.port)
        assert _outcome(pki, address, token, _status)[0] == status
        assert _outcome(pki, address, token, _pause)[0] == pause


def test_only_peers_may_open_the_control_link(pki: TestPki) -> None:
    """An operator's token, even an admin's, cannot pose as a wrapper; the ControlService has no servicer
    here, so a peer passes auth and meets UNIMPLEMENTED, which proves it was let through."""
    with _server(pki) as server:
        address = local(server.port)
        for token in ("viewer-secret", "operator-secret"):
            assert _outcome(pki, address, token, _connect)[0] == grpc.StatusCode.PERMISSION_DENIED
        for token in ("link-secret", SERVICE_TOKEN):
            assert _outcome(pki, address, token, _connect)[0] == grpc.StatusCode.UNIMPLEMENTED


def test_refusals_carry_details_and_never_the_secret(pki: TestPki) -> None:
    with _server(pki) as server:
        address = local(server.port)
        code, reason, metadata = _outcome(pki, address, "viewer-secret", _pause)
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
        assert metadata == {"method": PAUSE_ALL, "required_role": "admin", "token_role": "read-only", "token": "viewer"}
        assert _outcome(pki, address, "guess", _status)[:2] == (grpc.StatusCode.UNAUTHENTICATED, "INVALID_TOKEN")
        assert _outcome(pki, address, None, _status)[:2] == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")
        with _open(address, _client(pki, "viewer-secret")) as channel, pytest.raises(grpc.RpcError) as info:
            _pause(channel)
        assert "viewer-secret" not in str(info.value.details()) + str(info.value.trailing_metadata())


def test_a_secret_never_reaches_the_log(pki: TestPki, caplog: pytest.LogCaptureFixture) -> None:
    with _server(pki) as server:
        address = local(server.port)
        for token in ("viewer-secret", "guess-secret-xyz", None):
            _outcome(pki, address, token, _pause)
    assert "refused" in caplog.text
    assert "viewer-secret" not in caplog.text and "guess-secret-xyz" not in caplog.text


#: FlowService RPCs a read-only token may call; every other one changes the store.
_FLOW_READS = frozenset({"GetFlow", "ListFlows"})
#: Deadline of a FlowService call: each reads the flow store to its end (seconds on a loaded machine).
_FLOW_CALL_TIMEOUT_S = 30.0


def test_flow_service_mutations_need_admin_and_reads_read_only(
    pki: TestPki, destination_cluster: KafkaCluster, unique_name: Any
) -> None:
    """Each FlowService method (from the descriptor) with a request naming a flow that does not exist.

    A read-only token reads (NOT_FOUND or the list) and is refused every change; an admin's change
    passes auth and reaches the handler, whose answer (NOT_FOUND, or INVALID_ARGUMENT for a request
    naming no flow) proves it was let through without changing anything.
    """
    registry = FlowRegistry(
        {"dst": ClusterConfig(bootstrap_servers=destination_cluster.bootstrap_servers)},
        "dst",
        client_id=unique_name("roles"),
    )
    missing = unique_name("nosuchflow")
    service = flows_pb2.DESCRIPTOR.services_by_name["FlowService"]

    def call(method: Any) -> Any:
        request: Any = message_class(method.input_type)()
        if "name" in method.input_type.fields_by_name:
            request.name = missing
        path = f"/{service.full_name}/{method.name}"
        serialize = type(request).SerializeToString
        return lambda channel: channel.unary_unary(path, request_serializer=serialize)(
            request, timeout=_FLOW_CALL_TIMEOUT_S
        )

    with _server(pki, registry) as server:
        address = local(server.port)
        for method in service.methods:
            viewer = _outcome(pki, address, "viewer-secret", call(method))
            admin = _outcome(pki, address, "operator-secret", call(method))
            assert admin[0] in {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}, (
                method.name,
                admin,
            )
            if method.name in _FLOW_READS:
                assert viewer[0] == admin[0], (method.name, viewer, admin)
            else:
                assert viewer[:2] == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED"), (method.name, viewer)
                assert viewer[2]["required_role"] == "admin"
