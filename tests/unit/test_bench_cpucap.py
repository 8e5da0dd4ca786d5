"""``--cpu-per-process``: a cgroup per process, capped by a CFS quota (``bench.cpucap``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import cpucap
from bench.cpucap import CpuCaps
from bench.errors import BenchError

#: Spins for ~1.5 s of wall time, then prints the CPU seconds it got.
_SPIN = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\nprint(time.process_time())"


def _fake_v1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cpu"
    root.mkdir()
    (root / "cpu.cfs_quota_us").write_text("-1")
    monkeypatch.setattr(cpucap, "_V1_ROOT", root)
    return root


def test_a_v1_cap_sets_the_quota_and_moves_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _fake_v1(tmp_path, monkeypatch)
    caps = CpuCaps(0.25, "r1")
    caps.confine(4242)
    group = root / "ferryman-bench-r1-4242"
    assert (group / "cpu.cfs_quota_us").read_text() == "25000"
    assert (group / "cpu.cfs_period_us").read_text() == "100000"
    assert (group / "cgroup.procs").read_text() == "4242"
    for f in group.iterdir():  # a real cgroup's files are the kernel's; rmdir alone removes it
        f.unlink()
    caps.release()
    assert not group.exists()


def test_a_v2_cap_writes_cpu_max_and_enables_the_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpucap, "_V1_ROOT", tmp_path / "absent")
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(cpucap, "_V2_ROOTS", (tmp_path / "nowhere", root))
    CpuCaps(1.5, "r2").confine(7)
    assert (root / "cgroup.subtree_control").read_text() == "+cpu"
    assert (root / "ferryman-bench-r2-7" / "cpu.max").read_text() == "150000 100000"


def test_a_cap_that_cannot_be_set_is_refused_naming_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpucap, "_V1_ROOT", tmp_path / "absent")
    monkeypatch.setattr(cpucap, "_V2_ROOTS", (tmp_path,))  # no cgroup.controllers
    with pytest.raises(BenchError, match="--cpu-per-process needs a writable cgroup"):
        CpuCaps(0.1, "r3")
    _fake_v1(tmp_path, monkeypatch)
    with pytest.raises(BenchError, match=r"--cpu-per-process: 0\.001 is not between"):
        CpuCaps(0.001, "r3")


def test_a_confined_process_gets_its_share_of_a_core() -> None:
    try:
        caps = CpuCaps(0.2, f"t{time.monotonic_ns()}")
    except BenchError as exc:
        pytest.skip(f"no cgroup cpu controller to write here: {exc}")
    free = subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, text=True)
    capped = subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, text=True)
    try:
        caps.confine(capped.pid)
        got = {name: float(p.communicate(timeout=30)[0]) for name, p in (("free", free), ("capped", capped))}
    finally:
        for p in (free, capped):
            p.kill()
            p.wait()
        caps.release()
    assert got["capped"] < 0.5  # 0.2 of 1.5 s is 0.3 s (plus the interpreter's start before it was moved)
    assert got["free"] > 2 * got["capped"]
