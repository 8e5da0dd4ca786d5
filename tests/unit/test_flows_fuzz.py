"""Arbitrary FlowService inputs through the pure update and validation path: only the errors mapped to precise codes.

What the FlowService handlers do before touching the store (convert, merge by mask, compare,
check aliases and cycles) is pure; here Hypothesis feeds it Flow messages built from the
descriptor and masks of real, nested, unknown and malformed paths. Anything but a
`ferryman.errors` subclass the error mapping turns into a precise code would reach a client
as INTERNAL. The server-level fuzz (tests/integration/test_rpc_fuzz.py) calls a real deduper.
"""

from __future__ import annotations

import grpc
from ferryman.config import FlowConfig
from ferryman.errors import FerrymanError
from ferryman.flows import canonical, check_change, find_cycle, merged, to_config, to_proto
from ferryman.flows._model import check_aliases
from ferryman.rpc import status_code_for
from ferryman.v1 import flows_pb2
from google.protobuf import field_mask_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.proto_strategies import messages

#: Codes the flow errors may map to: each says precisely what was wrong with the request.
_PRECISE = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
_CLUSTERS = ("a", "b", "c")
_CURRENT = to_proto(FlowConfig(name="f1", source="a", target="b"))
_PATHS = [f.name for f in flows_pb2.Flow.DESCRIPTOR.fields] + [
    f"naming.{f.name}" for f in flows_pb2.Naming.DESCRIPTOR.fields
]
_mask_paths = st.lists(
    st.one_of(
        st.sampled_from(_PATHS), st.text(max_size=12), st.sampled_from(["naming.", ".topics", "topics.x", "Name"])
    ),
    max_size=4,
)
_aliases = st.one_of(st.sampled_from(_CLUSTERS), st.text(max_size=4))


def _precise(exc: BaseException) -> None:
    assert isinstance(exc, FerrymanError) and status_code_for(exc) in _PRECISE, repr(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patch=messages(flows_pb2.Flow.DESCRIPTOR), paths=_mask_paths, source=_aliases, target=_aliases)
def test_updates_by_any_mask_fail_only_with_precise_errors(
    patch: flows_pb2.Flow, paths: list[str], source: str, target: str
) -> None:
    patch.source_alias, patch.target_alias = source, target
    try:
        wanted = canonical(merged(_CURRENT, patch, field_mask_pb2.FieldMask(paths=paths)))
        after = to_config(wanted)
        check_change(to_config(_CURRENT), after)
        check_aliases(after, _CLUSTERS, "b")
        find_cycle([to_config(_CURRENT)], after)
    except Exception as exc:  # the property: every failure is a precise one
        _precise(exc)
    else:  # accepted: still the same flow between known clusters
        assert after.name == "f1" and {after.source, after.target} <= set(_CLUSTERS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow=messages(flows_pb2.Flow.DESCRIPTOR), source=_aliases, target=_aliases)
def test_creates_of_any_flow_fail_only_with_precise_errors(flow: flows_pb2.Flow, source: str, target: str) -> None:
    flow.source_alias, flow.target_alias = source, target
    try:
        config = to_config(canonical(flow))
        check_aliases(config, _CLUSTERS, "b")
        find_cycle([to_config(_CURRENT)], config)
    except Exception as exc:  # the property: every failure is a precise one
        _precise(exc)
    else:  # accepted: a named flow between known clusters
        assert config.name and {config.source, config.target} <= set(_CLUSTERS)
