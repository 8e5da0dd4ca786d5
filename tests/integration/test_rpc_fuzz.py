"""Arbitrary requests to every RPC of a real pair: only well-defined status codes, never UNKNOWN or INTERNAL.

The RPCs are found at run time, not listed here: each process's server reflection names its
services, the generated descriptors describe their methods and message types, and Hypothesis
builds requests from those (``tests.helpers.proto_strategies``). A service added to the
wrapper or the deduper later is fuzzed without touching this test. The calls carry the pair's
token, so they reach the handlers; the refusals of auth itself are tested in test_rpc_roles.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ferryman.v1
import grpc
import pytest
from ferryman.config import RpcConfig, SecretStr
from ferryman.rpc import open_channel
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings

from tests.helpers.grpc_clients import reflected_services, start_linked_pair
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, wait_until
from tests.helpers.proto_strategies import load_package, requests, service

pytestmark = pytest.mark.integration

TOKEN = "fuzz-token"
#: Per call: long enough for an offset-map lookup on a busy machine, short enough for a stream the fuzz leaves open.
CALL_DEADLINE_S = 10.0
#: Examples per RPC: CI-sized (each example is a real call, some read the destination cluster).
EXAMPLES = 15

#: Codes a handler may answer to a client's request: each says precisely what was wrong.
WELL_DEFINED = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
#: A stream the server keeps open (the control link waits for more) ends at the client's deadline.
STREAM_ALSO = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED})
_SKIP = ("grpc.health.", "grpc.reflection.")


def _code_of(channel: grpc.Channel, method: MethodDescriptor, request: Any) -> tuple[grpc.StatusCode, str]:
    """The status (code, details) of one call of method with request (a list for client-streaming methods)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    serialize: Callable[[Message], bytes] = lambda m: m.SerializeToString()  # noqa: E731
    try:
        if method.client_streaming and method.server_streaming:
            for _ in channel.stream_stream(path, request_serializer=serialize)(iter(request), timeout=CALL_DEADLINE_S):
                pass
        elif method.client_streaming:
            channel.stream_unary(path, request_serializer=serialize)(iter(request), timeout=CALL_DEADLINE_S)
        elif method.server_streaming:
            for _ in channel.unary_stream(path, request_serializer=serialize)(request, timeout=CALL_DEADLINE_S):
                pass
        else:
            channel.unary_unary(path, request_serializer=serialize)(request, timeout=CALL_DEADLINE_S)
    except grpc.RpcError as exc:
        if isinstance(exc, grpc.Call):
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.UNKNOWN, str(exc)
    return grpc.StatusCode.OK, ""


def _fuzz_method(channel: grpc.Channel, method: MethodDescriptor, codes: set[str]) -> None:
    allowed = WELL_DEFINED | (STREAM_ALSO if method.server_streaming else frozenset())

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(request=requests(method))
    def one(request: Any) -> None:
        code, details = _code_of(channel, method, request)
        codes.add(code.name)
        assert code in allowed, f"{method.full_name} answered {code.name}: {details} to {request!r}"

    one()


def _fuzz(address: str, rpc: RpcConfig) -> dict[str, set[str]]:
    """Fuzz every method of every application service at address; the codes seen, by method."""
    seen: dict[str, set[str]] = {}
    names = sorted(n for n in reflected_services(address, rpc) if not n.startswith(_SKIP))
    assert names, f"{address} lists no application service"
    with open_channel(address, rpc) as channel:
        for name in names:
            for method in service(name).methods:
                _fuzz_method(channel, method, seen.setdefault(f"{name}/{method.name}", set()))
    return seen


def test_arbitrary_requests_get_well_defined_codes_from_every_rpc(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    load_package(ferryman.v1)
    topic = unique_name("fuzz")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, 20)
    rpc = RpcConfig(auth_token=SecretStr(TOKEN))
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=unique_name("flow"),
        topics=[topic],
        rpc={"auth_token": TOKEN},
        client_rpc=rpc,
    )
    try:
        wait_until(pair.link_up, 90.0, message="pair linked")
        deduper = _fuzz(pair.deduper_address, rpc)
        wrapper = _fuzz(pair.wrapper_address, rpc)
        assert set(deduper) >= {
            "ferryman.v1.ControlService/Connect",
            "ferryman.v1.DeduperService/GetDeduperStatus",
            "ferryman.v1.DeduperService/TranslateOffsets",
            *(f"ferryman.v1.FlowService/{m.name}" for m in service("ferryman.v1.FlowService").methods),
        }
        assert set(wrapper) >= {"ferryman.v1.WrapperService/GetWrapperStatus"}
        # The fuzz reached the handlers' checks, not only their happy paths.
        assert "INVALID_ARGUMENT" in deduper["ferryman.v1.DeduperService/TranslateOffsets"]
        assert "INVALID_ARGUMENT" in deduper["ferryman.v1.FlowService/CreateFlow"]
        assert "NOT_FOUND" in deduper["ferryman.v1.FlowService/GetFlow"]
        assert pair.wrapper.alive and pair.deduper.alive
    finally:
        pair.stop()
