"""The e2e modules' own cluster pair: a module that restarts brokers never disturbs the session's clusters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ferryman_local import start_clusters

from tests.helpers.restarts import Pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """A source and a destination cluster of one node each, for the module that asks for them."""
    clusters = start_clusters(["bsource", "bdestination"], base_dir=tmp_path_factory.mktemp("bounce"))
    try:
        yield Pair(clusters[0], clusters[1])
    finally:
        for c in clusters:
            c.stop()


@pytest.fixture(autouse=True)
def _pair_running_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails while a broker of the pair is down restarts it, so the module's next tests find it up.

    Without it, one failure during an outage failed every later test of the module (the deduper never
    found its destination), which hid the first failure among the rest.
    """
    pair: Pair | None = request.getfixturevalue("pair") if "pair" in request.fixturenames else None
    yield
    for cluster in (pair.source, pair.destination) if pair is not None else ():
        if cluster.pid is None:
            cluster.restart()
