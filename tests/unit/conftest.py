"""Unit-test fixtures shared by several test modules (the codec's, the GC tuning's)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from ferryman import envelope


@pytest.fixture(params=["compiled", "pure-python"])
def each_codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once through the compiled codec and once through the pure-Python path.

    The compiled one must be built (tests/unit/test_batchcodec.py fails otherwise),
    so the "compiled" run never silently falls back.
    """
    if request.param == "pure-python":
        monkeypatch.setattr(envelope, "batchcodec", None)
    else:
        assert envelope.batchcodec is not None, "the compiled codec (ferryman._batchcodec) is not built"
    return str(request.param)


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """Undo a test's freeze, GC thresholds and switch (tune_gc and the copy loop change them process-wide)."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    if enabled:
        gc.enable()
    else:
        gc.disable()
