"""The replication bench's log: its timestamped lines, and how a row's figures read in them.

CPU seconds per million records (the row's, each program's, the kernel's part, the brokers'), and the bytes that
crossed between the clusters' regions (``bench.crossing``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from bench.crossing import CrossTraffic
from bench.measure import Usage
from bench.records import record_bytes
from bench.results import Throughput


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def crossed_line(crossed: CrossTraffic, value_bytes: int) -> str:
    """The crossing figures for a log line.

    For instance ``"12.3 MB, 123.4 B/record (113 B of payload): ferryman-wrapper to destination brokers 12.2 MB,
    ferryman-wrapper to ferryman-deduper 0.1 MB"``, with the sockets that closed in the phase when there were some.
    """
    per_record = crossed.bytes_per_record
    out = (
        f"{crossed.total_bytes / 1e6:,.1f} MB, {per_record or math.nan:,.1f} B/record "
        f"({record_bytes(value_bytes)} B of payload): "
    )
    out += ", ".join(f"{link} {crossed.by_link[link].total_bytes / 1e6:,.2f} MB" for link in crossed.crossing_links)
    if crossed.sockets_closed:
        out += f"; {crossed.sockets_closed} sockets closed in the phase (counted to their last reading)"
    return out


def kernel_share(tp: Throughput) -> str:
    """The kernel's part of the row's and the brokers' CPU per million records, as a suffix for a log line.

    For instance ``"; kernel 0.45; brokers 1.3 CPU s/M, kernel 0.52"`` (brokers only for local clusters).
    """
    out = f"; kernel {tp.kernel_cpu_s_per_m:.2f}" if tp.kernel_cpu_s_per_m is not None else ""
    if tp.broker_cpu_s_per_m is not None and tp.broker_kernel_cpu_s_per_m is not None:
        out += f"; brokers {tp.broker_cpu_s_per_m:.1f} CPU s/M, kernel {tp.broker_kernel_cpu_s_per_m:.2f}"
    return out


def split_per_million(cpu_by_program: dict[str, float], records: int) -> str:
    """CPU s per million records of each program, as a suffix for a log line, when there are several.

    For instance ``" (ferryman-deduper 1.30, ferryman-wrapper 1.10)"``; "" for a one-program row.
    """
    if len(cpu_by_program) < 2 or not records:
        return ""
    return " (" + ", ".join(f"{k} {v / records * 1e6:.2f}" for k, v in cpu_by_program.items()) + ")"


def usage_per_million(usage_by_program: Mapping[str, Usage], records: int) -> str:
    """Each program's CPU, kernel part and minor faults per million records, for a log line.

    For instance ``"ferryman-deduper 1.30 CPU s (kernel 0.21), 58 k faults; ferryman-wrapper ..."``.
    """
    per_m = 1e6 / records if records else math.nan
    return "; ".join(
        f"{name} {u.cpu_s * per_m:.2f} CPU s (kernel {u.kernel_s * per_m:.2f}), "
        f"{u.minor_faults * per_m / 1e3:.0f} k faults"
        for name, u in usage_by_program.items()
    )
