"""The bench's named scale scenarios (issue 29), its source topics and its Ferryman row's staging partitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.config import SCENARIOS, parse_args
from bench.preload import split_jobs
from bench.replication import round_order
from bench.rows.base import RowContext, RowOptions
from bench.rows.ferryman import FerrymanRow
from bench.testbed import source_topics
from bench.warmup import warmup_rate


def test_a_scenario_sets_its_shape() -> None:
    cfg = parse_args(["--scenario", "partitions"])
    assert cfg.partitions == 256
    assert cfg.records == 1_000_000
    large = parse_args(["--scenario", "large"])
    assert (large.records, large.value_bytes) == (100_000, 10_240)
    out = parse_args(["--scenario", "scale-out"])
    assert (out.partitions, out.options.wrapper_procs, out.options.deduper_procs) == (256, 2, 2)
    topics = parse_args(["--scenario", "topics"])
    assert (topics.topics, topics.partitions, topics.records) == (100, 10, 1_000_000)
    # The many-partition shapes delete each row's topics once audited; the default run keeps them.
    assert cfg.drop_copies and out.drop_copies and topics.drop_copies
    assert not large.drop_copies and not parse_args([]).drop_copies


def test_explicit_options_override_the_scenario() -> None:
    cfg = parse_args(["--scenario", "large", "--value-bytes", "102400", "--records", "20000"])
    assert (cfg.records, cfg.value_bytes) == (20_000, 102_400)
    assert parse_args(["--scenario", "partitions", "--partitions", "64"]).partitions == 64
    assert not parse_args(["--scenario", "topics", "--no-drop-copies"]).drop_copies


def test_one_source_topic_by_default_and_as_many_as_asked() -> None:
    assert parse_args([]).topics == 1
    assert parse_args(["--topics", "20", "--partitions", "4"]).topics == 20
    assert parse_args(["--scenario", "topics", "--topics", "50"]).partitions == 10
    # --smoke keeps its small partition count, not the topic count.
    smoke = parse_args(["--smoke", "--topics", "20"])
    assert (smoke.topics, smoke.partitions) == (20, 4)


@pytest.mark.parametrize("argv", [["--topics", "0"], ["--topics", "100", "--partitions", "100"]])
def test_topic_counts_the_record_header_cannot_number_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "--topics" in capsys.readouterr().err


def test_source_topics_keep_the_single_topic_name_and_number_several() -> None:
    assert source_topics("bench-abc", 1) == ("bench-abc",)
    assert source_topics("bench-abc", 3) == ("bench-abc-t0", "bench-abc-t1", "bench-abc-t2")
    many = source_topics("bench-abc", 100)
    assert (many[0], many[-1], len(set(many))) == ("bench-abc-t00", "bench-abc-t99", 100)


def test_the_preload_numbers_each_topics_partitions_in_the_record_headers() -> None:
    """Partition p of the i-th topic carries header partition i * P + p; every partition is written once."""
    jobs = split_jobs(["a", "b", "c"], [5, 6, 7, 8, 9, 10], 4)
    flat = sorted((numbered, topic, p, n) for worker in jobs for topic, p, numbered, n in worker)
    assert flat == [(0, "a", 0, 5), (1, "a", 1, 6), (2, "b", 0, 7), (3, "b", 1, 8), (4, "c", 0, 9), (5, "c", 1, 10)]
    # One topic: the jobs the preload always made (partition p, its own number, round-robin over the workers).
    assert split_jobs(["t"], [3, 4, 5], 2) == [[("t", 0, 0, 3), ("t", 2, 2, 5)], [("t", 1, 1, 4)]]


def test_every_scenario_parses() -> None:
    for name in SCENARIOS:
        assert parse_args(["--scenario", name]).records > 0


def test_an_unknown_scenario_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--scenario", "nope"])
    assert "--scenario" in capsys.readouterr().err


def _row(options: RowOptions, tmp_path: Path) -> FerrymanRow:
    ctx = RowContext("r1", "s:1", "d:1", ("t",), 256, tmp_path, options)
    return FerrymanRow(ctx)


def test_the_ferryman_row_leaves_staging_partitions_to_the_service_by_default(tmp_path: Path) -> None:
    flow = _row(RowOptions(), tmp_path)._config([])["flows"][0]
    # Not the source's 256: every staging partition a deduper owns costs writes in every transaction.
    assert "staging_partitions" not in flow
    assert parse_args([]).options.staging_partitions is None


def test_the_ferryman_row_takes_a_staging_partition_count(tmp_path: Path) -> None:
    cfg = parse_args(["--staging-partitions", "32"])
    flow = _row(cfg.options, tmp_path)._config([])["flows"][0]
    assert flow["staging_partitions"] == 32
    with pytest.raises(SystemExit):
        parse_args(["--staging-partitions", "0"])


def test_each_round_rotates_the_row_order_so_no_row_always_follows_the_same_one() -> None:
    rows = ["ferryman-bare", "ferryman", "ferryman-trace1"]
    orders = [round_order(rows, n) for n in range(1, 5)]
    assert orders[0] == rows and orders[3] == rows  # the first round keeps the order given (its latency phase needs it)
    assert orders[1] == ["ferryman", "ferryman-trace1", "ferryman-bare"]
    assert {tuple(o) for o in orders[:3]} == {tuple(rows[i:] + rows[:i]) for i in range(3)}
    assert round_order([], 3) == []


def test_the_warm_up_offers_large_records_at_a_bounded_byte_rate() -> None:
    assert warmup_rate(100) == 50_000  # small records: the record rate rules
    assert warmup_rate(102_400) * 102_400 == 25 * 1024 * 1024  # 100 KB: 256 records/s, not 5 GB/s
