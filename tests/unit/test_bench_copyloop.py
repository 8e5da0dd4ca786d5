"""The bench's copy loop stays bare: it imports only the client library and gets the shared settings from its row."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
from ferryman.client_config import STREAMING_CONSUMER_DEFAULTS
from ferryman.service import GC_GEN0_THRESHOLD

from bench import copyloop
from bench.rows.base import RowContext, RowOptions
from bench.rows.copyloop import CopyLoopRow

_REPO = Path(__file__).resolve().parents[2]
#: The required arguments, before the ones under test.
_REQUIRED = ["--source", "s", "--destination", "d", "--prefix", "p", "--group", "g"]


def test_the_loop_imports_no_ferryman_module() -> None:
    # A fresh interpreter: this test process has imported ferryman already.
    probe = "import sys, bench.copyloop; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ferryman'))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=_REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_consumer_properties_are_key_value_pairs() -> None:
    args = copyloop._parse(
        [*_REQUIRED, "--consumer-property", "fetch.min.bytes=1048576", "--consumer-property=client.id=a=b", "t"]
    )
    assert args.consumer_property == [("fetch.min.bytes", "1048576"), ("client.id", "a=b")]
    assert copyloop._parse([*_REQUIRED, "t"]).consumer_property == []


@pytest.mark.parametrize("bad", ["fetch.min.bytes", "=1"])
def test_a_property_without_key_or_value_separator_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        copyloop._parse([*_REQUIRED, "--consumer-property", bad, "t"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_the_row_passes_the_services_streaming_consumer_settings(tmp_path: Path) -> None:
    ctx = RowContext("run1", "src:1", "dst:1", ("topic",), 8, tmp_path, RowOptions())
    argv = CopyLoopRow(ctx).argv()
    assert argv[1:3] == ["-m", "bench.copyloop"]
    passed = dict(copyloop._parse(argv[3:]).consumer_property)
    assert passed == {k: str(v) for k, v in STREAMING_CONSUMER_DEFAULTS.items()}


def test_the_row_gives_the_loop_the_services_gc_setting(tmp_path: Path) -> None:
    ctx = RowContext("run1", "src:1", "dst:1", ("topic",), 8, tmp_path, RowOptions())
    assert copyloop._parse(CopyLoopRow(ctx).argv()[3:]).gc_gen0_threshold == GC_GEN0_THRESHOLD
    assert copyloop._parse([*_REQUIRED, "t"]).gc_gen0_threshold is None  # by hand: CPython's GC as is


@pytest.mark.usefixtures("restored_gc")
def test_the_loop_freezes_its_start_up_heap_and_collects_young_objects_rarely() -> None:
    alive = [object() for _ in range(10)]  # stand-in for the clients and the loop's closures
    _g0, g1, g2 = gc.get_threshold()
    copyloop._keep_gc_off_the_hot_path(12_345)
    assert gc.get_freeze_count() > len(alive)
    assert gc.get_threshold() == (12_345, g1, g2)
