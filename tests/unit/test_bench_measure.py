"""The bench's CPU sampler splits a row's CPU by the process tree each root started."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.measure import TreeSampler

#: Spins until it has used ~0.3 CPU s.
_BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
#: Runs _BURN in a child of its own, then says so and waits for stdin to close.
_BURNER = f"""
import subprocess, sys
subprocess.run([sys.executable, "-c", {_BURN!r}], check=True)
print("burnt", flush=True)
sys.stdin.read()
"""
#: Spends ~0.3 CPU s mostly in the kernel (zero-filling reads), then says so and waits for stdin to close.
_KERNEL_BURNER = """
import os, sys, time
fd = os.open("/dev/zero", os.O_RDONLY)
end = time.process_time() + 0.3
while time.process_time() < end:
    os.read(fd, 1 << 20)
print("burnt", flush=True)
sys.stdin.read()
"""
#: Touches 128 MiB of fresh memory (32 768 pages, each a minor fault), then says so and waits for stdin to close.
_TOUCHER = """
import mmap, sys
buf = mmap.mmap(-1, 128 << 20)
for offset in range(0, len(buf), mmap.PAGESIZE):
    buf[offset] = 1
print("touched", flush=True)
sys.stdin.read()
"""
#: Starts, says so, and waits for stdin to close.
_IDLER = 'import sys; print("idle", flush=True); sys.stdin.read()'


@pytest.fixture
def roots() -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str]]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for code in (_BURNER, _IDLER)
    ]
    try:
        yield procs[0], procs[1]
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(30)


def test_cpu_is_split_by_root_with_the_work_of_its_descendants(
    roots: tuple[subprocess.Popen[str], subprocess.Popen[str]],
) -> None:
    burner, idler = roots
    sampler = TreeSampler([burner.pid, idler.pid])
    try:
        assert burner.stdout is not None and idler.stdout is not None
        assert burner.stdout.readline().strip() == "burnt"  # its child burnt the CPU and was reaped
        assert idler.stdout.readline().strip() == "idle"
        total = sampler.sample()
        split = sampler.by_root()
    finally:
        sampler.stop()
    assert set(split) == {burner.pid, idler.pid}
    assert split[burner.pid] >= 0.25  # the reaped child's CPU counts for the root that started it
    assert split[idler.pid] < split[burner.pid]
    assert sum(split.values()) == pytest.approx(total)


def test_the_kernel_share_of_the_cpu_is_reported() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KERNEL_BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        sampler = TreeSampler([proc.pid])
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "burnt"
            total = sampler.sample()
            kernel = sampler.kernel_s()
        finally:
            sampler.stop()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
    assert 0.15 <= kernel <= total  # reading /dev/zero is the kernel's work, the loop around it is not


def test_minor_faults_the_kernel_part_and_the_peak_rss_are_reported_per_root() -> None:
    toucher, idler = (
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for code in (_TOUCHER, _IDLER)
    )
    try:
        sampler = TreeSampler([toucher.pid, idler.pid])
        try:
            assert toucher.stdout is not None and idler.stdout is not None
            assert toucher.stdout.readline().strip() == "touched"
            assert idler.stdout.readline().strip() == "idle"
            sampler.sample()
            usage = sampler.usage_by_root()
            cpu = sampler.by_root()
            peaks = dict(sampler.peak_rss_by_root)
        finally:
            sampler.stop()
    finally:
        for proc in (toucher, idler):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)
    assert usage[toucher.pid].minor_faults >= 32_768  # one per fresh page touched
    assert usage[idler.pid].minor_faults < usage[toucher.pid].minor_faults - 20_000  # the interpreter's own start
    assert all(0 <= u.kernel_s <= u.cpu_s for u in usage.values())
    assert usage[toucher.pid].kernel_s > 0  # zero-filling 32 768 pages
    assert {pid: u.cpu_s for pid, u in usage.items()} == cpu
    assert peaks[toucher.pid] >= 128 << 20  # the touched pages are resident
    assert peaks[idler.pid] < 64 << 20  # an idle interpreter
    assert sampler.peak_rss_bytes >= peaks[toucher.pid]
