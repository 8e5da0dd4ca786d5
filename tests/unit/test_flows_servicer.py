"""FlowService's one rule of its own: the deduper's own flow, not stored yet at start-up, is UNAVAILABLE.

The registry is a stand-in here (pure logic of the servicer); the real store is
`tests/integration/test_flows_api.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from ferryman.errors import FlowNotFoundError, FlowNotStoredYetError
from ferryman.flows import FlowRegistry
from ferryman.rpc import status_code_for
from ferryman.v1 import flows_pb2
from ferryman_deduper._flows import FlowServicer
from google.protobuf import field_mask_pb2


class _Empty:
    """A store without flows: every call naming one is NOT_FOUND, as FlowRegistry says."""

    def _missing(self, name: str, *args: Any) -> flows_pb2.Flow:
        raise FlowNotFoundError(f"no flow named {name!r} in cluster 'dst'")

    def get(self, name: str, *args: Any) -> flows_pb2.Flow:
        return self._missing(name)

    def delete(self, name: str, *args: Any) -> None:
        self._missing(name)

    def set_paused(self, name: str, *args: Any) -> flows_pb2.Flow:
        return self._missing(name)

    def update(self, patch: flows_pb2.Flow, *args: Any) -> flows_pb2.Flow:
        return self._missing(patch.name)


class _Context:
    def time_remaining(self) -> None:
        return None


CALLS: list[tuple[str, Callable[[FlowServicer, str], Any]]] = [
    ("get", lambda s, n: s.GetFlow(flows_pb2.GetFlowRequest(name=n), _Context())),  # type: ignore[arg-type]
    ("delete", lambda s, n: s.DeleteFlow(flows_pb2.DeleteFlowRequest(name=n), _Context())),  # type: ignore[arg-type]
    ("pause", lambda s, n: s.PauseFlow(flows_pb2.PauseFlowRequest(name=n), _Context())),  # type: ignore[arg-type]
    ("resume", lambda s, n: s.ResumeFlow(flows_pb2.ResumeFlowRequest(name=n), _Context())),  # type: ignore[arg-type]
    (
        "update",
        lambda s, n: s.UpdateFlow(
            flows_pb2.UpdateFlowRequest(flow=flows_pb2.Flow(name=n), update_mask=field_mask_pb2.FieldMask()),
            _Context(),  # type: ignore[arg-type]
        ),
    ),
]


def _servicer(storing: str | None) -> FlowServicer:
    registry: FlowRegistry = _Empty()  # type: ignore[assignment]
    return FlowServicer(registry, storing=lambda: storing)


@pytest.mark.parametrize(("call", "invoke"), CALLS, ids=[c for c, _ in CALLS])
def test_the_own_flow_before_start_up_stored_it_is_unavailable_with_ask_again(
    call: str, invoke: Callable[[FlowServicer, str], Any]
) -> None:
    with pytest.raises(FlowNotStoredYetError, match=r"'own' is this deduper's own .* ask again") as raised:
        invoke(_servicer("own"), "own")
    assert status_code_for(raised.value) is grpc.StatusCode.UNAVAILABLE
    assert isinstance(raised.value.__cause__, FlowNotFoundError)


@pytest.mark.parametrize(("call", "invoke"), CALLS, ids=[c for c, _ in CALLS])
def test_other_names_and_the_own_flow_once_stored_are_not_found(
    call: str, invoke: Callable[[FlowServicer, str], Any]
) -> None:
    for servicer, name in ((_servicer("own"), "other"), (_servicer(None), "own"), (_servicer("own"), "")):
        with pytest.raises(FlowNotFoundError):
            invoke(servicer, name)
