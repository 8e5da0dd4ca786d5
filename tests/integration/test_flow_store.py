"""The flow store on a real cluster: writes from independent writers are linearizable, etags guard updates."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from ferryman.config import ClusterConfig
from ferryman.errors import FlowExistsError, FlowStoreBusyError, StaleEtagError
from ferryman.flows import FlowRegistry
from ferryman.v1 import flows_pb2
from google.protobuf import field_mask_pb2

from tests.helpers.kafka import KafkaCluster

pytestmark = pytest.mark.integration


def _registry(source: KafkaCluster, destination: KafkaCluster, client_id: str) -> FlowRegistry:
    clusters = {
        "src": ClusterConfig(bootstrap_servers=source.bootstrap_servers),
        "dst": ClusterConfig(bootstrap_servers=destination.bootstrap_servers),
    }
    return FlowRegistry(clusters, "dst", client_id=client_id)


def _race(calls: list[Callable[[], object]]) -> list[object]:
    """Run calls at once on threads; each one's result or exception."""
    results: list[object] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # collected for the assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_concurrent_writers_on_one_etag_never_both_win(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    # Independent registries: own producers and locks, as in separate server processes.
    writers = [_registry(source_cluster, destination_cluster, f"writer-{i}") for i in range(3)]
    name = unique_name("race")
    created = writers[0].create(flows_pb2.Flow(name=name, source_alias="src", target_alias="dst", topics=["t0"]))
    try:
        mask = field_mask_pb2.FieldMask(paths=["topics"])
        results = _race(
            [
                lambda w=w, i=i: w.update(flows_pb2.Flow(name=name, topics=[f"t{i + 1}"]), mask, created.etag)  # type: ignore[misc]
                for i, w in enumerate(writers)
            ]
        )
        won = [r for r in results if isinstance(r, flows_pb2.Flow)]
        lost = [r for r in results if not isinstance(r, flows_pb2.Flow)]
        assert len(won) == 1, results
        assert all(isinstance(r, (StaleEtagError, FlowStoreBusyError)) for r in lost), results
        stored = writers[1].get(name)
        assert stored.etag == won[0].etag and list(stored.topics) == list(won[0].topics) and stored.version == 2

        # Racing creations of one new name: exactly one is stored.
        other = unique_name("race")
        flow = flows_pb2.Flow(name=other, source_alias="src", target_alias="dst")
        results = _race([lambda w=w: w.create(flow) for w in writers])  # type: ignore[misc]
        assert sum(isinstance(r, flows_pb2.Flow) for r in results) == 1, results
        assert all(isinstance(r, (flows_pb2.Flow, FlowExistsError, FlowStoreBusyError)) for r in results), results
        writers[2].delete(other)
    finally:
        writers[0].delete(name)
