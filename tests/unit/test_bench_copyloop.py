"""The bench's copy loop stays bare: it imports only the client library and gets the shared settings from its row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ferryman.client_config import STREAMING_CONSUMER_DEFAULTS

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
