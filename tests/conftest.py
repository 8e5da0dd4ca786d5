"""Session fixtures: two real Kafka clusters (source, destination), unique names."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ferryman_local import start_clusters


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: real Kafka brokers and/or real gRPC servers on loopback")
    config.addinivalue_line("markers", "e2e: the services as processes, the way a user runs them")
    config.addinivalue_line("markers", "nightly: long variants, run with FERRYMAN_NIGHTLY=1")


@dataclass(frozen=True)
class ClusterRef:
    """What tests need from a cluster (a LocalCluster, or one given by env for dev loops)."""

    name: str
    bootstrap_servers: str


@pytest.fixture(scope="session")
def _clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    src = os.environ.get("FERRYMAN_TEST_SOURCE_BOOTSTRAP")
    dst = os.environ.get("FERRYMAN_TEST_DESTINATION_BOOTSTRAP")
    if src and dst:
        yield {"source": ClusterRef("source", src), "destination": ClusterRef("destination", dst)}
        return
    base: Path = tmp_path_factory.mktemp("clusters")
    clusters = start_clusters(["source", "destination"], base_dir=base)
    try:
        yield {c.name: c for c in clusters}
    finally:
        for c in clusters:
            c.stop()


@pytest.fixture(scope="session")
def source_cluster(_clusters: dict[str, object]) -> object:
    """The source cluster (started once per session)."""
    return _clusters["source"]


@pytest.fixture(scope="session")
def destination_cluster(_clusters: dict[str, object]) -> object:
    """The destination cluster (a separate cluster, started once per session)."""
    return _clusters["destination"]


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Make names unique per test: prefix + test name + short random suffix."""
    test = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[-40:].strip("-")
    suffix = uuid.uuid4().hex[:6]

    def make(prefix: str) -> str:
        return f"{prefix}-{test}-{suffix}"

    return make
