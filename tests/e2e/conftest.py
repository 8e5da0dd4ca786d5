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
