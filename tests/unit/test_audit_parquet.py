"""The Parquet report of an audit run (ferryman_auditor._report; no Kafka, no Spark).

A run's Parquet file is written after the run is stored in the audit topic, whose verdict decides the exit
status: a directory that cannot take the file is logged and the verdict stands (an unwritable ``--reports-dir``
is refused before Spark starts: tests/integration/test_audit_spark_loss.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ferryman_auditor._report import store_parquet

from tests.helpers.audit import one_partition_report


def test_the_report_is_one_file_per_run_with_a_row_per_partition(tmp_path: Path) -> None:
    report = one_partition_report("run-7", missing=1, unverifiable=2)
    path = store_parquet(report, tmp_path / "reports")
    assert path == tmp_path / "reports" / "run-7.parquet"
    rows = pq.read_table(path).to_pylist()
    assert [(r["run_id"], r["flow"], r["topic"], r["partition"], r["missing"], r["unverifiable"]) for r in rows] == [
        ("run-7", "f", "t", 0, 1, 2)
    ]
    assert rows[0]["unverifiable_ranges"] == "[[0, 2]]"  # nested fields as JSON text
    assert sorted(p.name for p in path.parent.iterdir()) == ["run-7.parquet"]


def test_a_directory_that_is_a_file_is_logged_and_nothing_is_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    taken = tmp_path / "reports"
    taken.write_text("not a directory")
    with caplog.at_level(logging.ERROR, logger="ferryman_auditor._report"):
        assert store_parquet(one_partition_report("run-8", missing=1), taken) is None
    assert "audit run-8 of flow f is stored, but its Parquet report could not be written to" in caplog.text
    assert str(taken) in caplog.text
    assert taken.read_text() == "not a directory"


def test_a_failed_write_leaves_no_partial_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "run-9.parquet").mkdir()  # the final name is taken: the rename fails after the write
    with caplog.at_level(logging.ERROR, logger="ferryman_auditor._report"):
        assert store_parquet(one_partition_report("run-9"), tmp_path) is None
    assert "run-9" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["run-9.parquet"]  # the directory that was there, no .tmp
    assert (tmp_path / "run-9.parquet").is_dir()
