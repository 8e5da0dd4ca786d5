"""Shared fixtures: two real Kafka clusters (source, destination) and unique names.

The clusters start lazily, once per session, and only if a test asks for one:
a unit-only run starts no JVM. Set both ``FERRYMAN_TEST_SOURCE_BOOTSTRAP`` and
``FERRYMAN_TEST_DESTINATION_BOOTSTRAP`` to reuse running clusters instead
(for instance from ``python -m ferryman_local up``) and skip the start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient

from tests.helpers import kafka as kafka_helpers
from tests.helpers.kafka import ExternalCluster, KafkaCluster

_log = logging.getLogger("tests")
_SOURCE_ENV = "FERRYMAN_TEST_SOURCE_BOOTSTRAP"
_DESTINATION_ENV = "FERRYMAN_TEST_DESTINATION_BOOTSTRAP"
_NIGHTLY_ENV = "FERRYMAN_NIGHTLY"
# Set by pytest-xdist in its workers (scripts/test runs the unit, contract and integration tests on two).
_XDIST_WORKER_ENV = "PYTEST_XDIST_WORKER"
_XDIST_WORKER_COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"
_PORT_SHARD_ENV = "FERRYMAN_LOCAL_PORT_SHARD"  # ferryman_local.SHARD_ENV; ferryman_local is imported only for brokers
# Two JVMs starting side by side on 2 cores take ~7 s; a cold jar cache adds Maven's download.
_CLUSTER_READY_TIMEOUT_S = 120.0


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get(_XDIST_WORKER_ENV)
    if worker:
        # Each test worker reserves its own share of loopback ports for its brokers and servers.
        os.environ[_PORT_SHARD_ENV] = f"{worker.removeprefix('gw')}/{os.environ[_XDIST_WORKER_COUNT_ENV]}"
    config.addinivalue_line("markers", "integration: real Kafka brokers and/or real gRPC servers on loopback")
    config.addinivalue_line("markers", "e2e: the services as processes, the way a user runs them")
    config.addinivalue_line("markers", "slow: takes more than a few seconds; deselect with -m 'not slow'")
    config.addinivalue_line("markers", "nightly: long variants, run with FERRYMAN_NIGHTLY=1")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the long (``nightly``) variants out unless FERRYMAN_NIGHTLY=1: CI runs the sizes made for it.

    They are deselected, not skipped (pytest counts them as "deselected"), and
    ``FERRYMAN_NIGHTLY=1 scripts/test`` runs them with everything else.

    Under pytest-xdist (``--dist loadgroup``) a module's tests stay on one worker, so that its module
    fixtures (a three-node cluster, a flow) start once, and every test that uses Spark goes to the same
    worker, so that one Spark session serves them all.
    """
    if os.environ.get(_XDIST_WORKER_ENV):
        for item in items:
            group = "spark" if "spark" in getattr(item, "fixturenames", ()) else item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get(_NIGHTLY_ENV) == "1":
        return
    long_variants = [item for item in items if item.get_closest_marker("nightly") is not None]
    if long_variants:
        config.hook.pytest_deselected(items=long_variants)
        items[:] = [item for item in items if item.get_closest_marker("nightly") is None]


def _external(name: str, bootstrap: str) -> ExternalCluster:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    cluster_id = admin.describe_cluster(request_timeout=10).result(timeout=15).cluster_id
    return ExternalCluster(name=name, bootstrap_servers=bootstrap, cluster_id=str(cluster_id))


@pytest.fixture(scope="session")
def _clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KafkaCluster]]:
    src, dst = os.environ.get(_SOURCE_ENV), os.environ.get(_DESTINATION_ENV)
    if src or dst:
        if not (src and dst):
            raise pytest.UsageError(f"set both {_SOURCE_ENV} and {_DESTINATION_ENV}, or neither")
        yield {"source": _external("source", src), "destination": _external("destination", dst)}
        return
    from ferryman_local import start_clusters  # noqa: PLC0415 -- only when a test needs brokers

    base = tmp_path_factory.mktemp("clusters")
    clusters = start_clusters(["source", "destination"], base_dir=base, ready_timeout_s=_CLUSTER_READY_TIMEOUT_S)
    _log.info("test clusters: %s (logs under %s)", clusters, base)
    try:
        yield {c.name: c for c in clusters}
    finally:
        for c in clusters:
            c.stop()


@pytest.fixture(scope="session")
def source_cluster(_clusters: dict[str, KafkaCluster]) -> KafkaCluster:
    """The source cluster, started once per session (a ``LocalCluster`` unless reused from env)."""
    return _clusters["source"]


@pytest.fixture(scope="session")
def destination_cluster(_clusters: dict[str, KafkaCluster]) -> KafkaCluster:
    """The destination cluster: a separate cluster with its own id, started alongside the source."""
    return _clusters["destination"]


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """A factory of names unique to each call: ``prefix-<test name>-<random>`` (legal topic names)."""

    def make(prefix: str) -> str:
        return kafka_helpers.unique_name(request.node.name, prefix)

    return make
