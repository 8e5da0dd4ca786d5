"""The bench's named scale scenarios (issue 29) and the staging partition count of its Ferryman row."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.replication import SCENARIOS, _parse
from bench.rows.base import RowContext, RowOptions
from bench.rows.ferryman import FerrymanRow


def test_a_scenario_sets_its_shape() -> None:
    cfg = _parse(["--scenario", "partitions"])
    assert cfg.partitions == 256
    assert cfg.records == 1_000_000
    large = _parse(["--scenario", "large"])
    assert (large.records, large.value_bytes) == (100_000, 10_240)
    out = _parse(["--scenario", "scale-out"])
    assert (out.partitions, out.options.wrapper_procs, out.options.deduper_procs) == (256, 2, 2)


def test_explicit_options_override_the_scenario() -> None:
    cfg = _parse(["--scenario", "large", "--value-bytes", "102400", "--records", "20000"])
    assert (cfg.records, cfg.value_bytes) == (20_000, 102_400)
    assert _parse(["--scenario", "partitions", "--partitions", "64"]).partitions == 64


def test_every_scenario_parses() -> None:
    for name in SCENARIOS:
        assert _parse(["--scenario", name]).records > 0


def test_an_unknown_scenario_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["--scenario", "nope"])
    assert "--scenario" in capsys.readouterr().err


def _row(options: RowOptions, tmp_path: Path) -> FerrymanRow:
    ctx = RowContext("r1", "s:1", "d:1", ("t",), 256, tmp_path, options)
    return FerrymanRow(ctx)


def test_the_ferryman_row_leaves_staging_partitions_to_the_service_by_default(tmp_path: Path) -> None:
    flow = _row(RowOptions(), tmp_path)._config([])["flows"][0]
    # Not the source's 256: every staging partition a deduper owns costs writes in every transaction.
    assert "staging_partitions" not in flow
    assert _parse([]).options.staging_partitions is None


def test_the_ferryman_row_takes_a_staging_partition_count(tmp_path: Path) -> None:
    cfg = _parse(["--staging-partitions", "32"])
    flow = _row(cfg.options, tmp_path)._config([])["flows"][0]
    assert flow["staging_partitions"] == 32
    with pytest.raises(SystemExit):
        _parse(["--staging-partitions", "0"])
