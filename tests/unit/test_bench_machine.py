"""The bench reads the machine's DAMON reclaim schemes from sysfs (read only) and says what they do."""

from __future__ import annotations

from pathlib import Path

from bench.machine import ReclaimScheme, as_json, describe_reclaim, reclaim_schemes


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def _kdamond(root: Path, n: int, *, state: str, action: str = "pageout") -> None:
    """A kdamond as this machine's sysfs shows it: pageout of unmapped file pages idle for 12 x 5 s."""
    k = f"kdamonds/{n}"
    s = f"{k}/contexts/0/schemes/0"
    _write(
        root,
        {
            f"{k}/state": state,
            f"{k}/contexts/0/monitoring_attrs/intervals/aggr_us": "5000000",
            f"{s}/action": action,
            f"{s}/quotas/bytes": "2147483648",
            f"{s}/quotas/reset_interval_ms": "1000",
            f"{s}/access_pattern/age/min": "12",
            f"{s}/ops_filters/0/type": "anon",
            f"{s}/ops_filters/0/allow": "N",
            f"{s}/ops_filters/0/matching": "Y",
            f"{s}/ops_filters/1/type": "unmapped",
            f"{s}/ops_filters/1/allow": "Y",
            f"{s}/ops_filters/1/matching": "Y",
        },
    )


def test_a_running_pageout_scheme_is_read_and_described(tmp_path: Path) -> None:
    _kdamond(tmp_path, 0, state="on")
    _kdamond(tmp_path, 1, state="off", action="stat")  # stopped: not reported
    schemes = reclaim_schemes(tmp_path)
    assert schemes == [
        ReclaimScheme(
            action="pageout",
            min_idle_s=60.0,
            quota_bytes_per_s=2 * 2**30,
            filters=["anon: excluded", "unmapped: allowed"],
        )
    ]
    line = describe_reclaim(schemes)
    assert line is not None
    assert "pages out memory idle for 60 s, up to 2.0 GiB/s (anon: excluded; unmapped: allowed)" in line
    assert as_json(schemes)[0]["min_idle_s"] == 60.0


def test_no_damon_or_an_unknown_layout_reports_nothing(tmp_path: Path) -> None:
    assert reclaim_schemes(tmp_path / "absent") == []
    _kdamond(tmp_path, 0, state="on")
    (tmp_path / "kdamonds/0/contexts/0/schemes/0/quotas/bytes").write_text("lots\n")
    assert reclaim_schemes(tmp_path) == []
    assert describe_reclaim([]) is None


def test_a_scheme_that_reclaims_nothing_is_recorded_but_not_announced(tmp_path: Path) -> None:
    _kdamond(tmp_path, 0, state="on", action="stat")
    schemes = reclaim_schemes(tmp_path)
    assert [s.action for s in schemes] == ["stat"]
    assert describe_reclaim(schemes) is None
