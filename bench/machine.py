"""What the machine does under the bench that the bench cannot control: memory reclaim by DAMON.

Some virtual machines (this one) run a DAMON scheme that pages out file pages idle
for a while, at up to gigabytes per second. Page cache a broker wrote seconds ago can
go with a cold region around it, and the broker then faults it back, in the kernel:
a round slowed that way shows a destination broker whose kernel CPU has doubled
(``Throughput.broker_kernel_cpu_s_per_m``). The schemes are read from sysfs, read
only, and written into the run's JSON so that its figures say which machine they
came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: DAMON's sysfs interface (Linux 5.18+).
DAMON_ADMIN = Path("/sys/kernel/mm/damon/admin")


@dataclass(frozen=True)
class ReclaimScheme:
    """One DAMON scheme of a running kdamond."""

    action: str
    """What DAMON does to matching regions (``pageout`` reclaims them)."""
    min_idle_s: float
    """Regions must have been this long without (enough) access: the minimum age times the aggregation interval."""
    quota_bytes_per_s: int
    """Most bytes acted on per second (0: no limit)."""
    filters: list[str]
    """The scheme's memory filters, e.g. ``"anon: excluded"``, ``"unmapped: allowed"``."""


def _read(path: Path) -> str:
    return path.read_text().strip()


def _filters(scheme: Path) -> list[str]:
    out = []
    for kind in ("ops_filters", "filters", "core_filters"):
        for f in sorted((scheme / kind).glob("[0-9]*")):
            allowed = _read(f / "allow") == "Y"
            matching = _read(f / "matching") == "Y"
            # A filter acts on the memory that matches it (or, with matching N, on the rest).
            what = _read(f / "type") if matching else f"not {_read(f / 'type')}"
            out.append(f"{what}: {'allowed' if allowed else 'excluded'}")
    return out


def reclaim_schemes(admin: Path = DAMON_ADMIN) -> list[ReclaimScheme]:
    """The schemes of every running kdamond; [] without DAMON or without permission to read it."""
    schemes: list[ReclaimScheme] = []
    try:
        for kdamond in sorted((admin / "kdamonds").glob("[0-9]*")):
            if _read(kdamond / "state") != "on":
                continue
            for ctx in sorted((kdamond / "contexts").glob("[0-9]*")):
                aggr_s = int(_read(ctx / "monitoring_attrs" / "intervals" / "aggr_us")) / 1e6
                for scheme in sorted((ctx / "schemes").glob("[0-9]*")):
                    quota_bytes = int(_read(scheme / "quotas" / "bytes"))
                    reset_s = int(_read(scheme / "quotas" / "reset_interval_ms")) / 1000
                    schemes.append(
                        ReclaimScheme(
                            action=_read(scheme / "action"),
                            min_idle_s=int(_read(scheme / "access_pattern" / "age" / "min")) * aggr_s,
                            quota_bytes_per_s=round(quota_bytes / reset_s) if reset_s > 0 else quota_bytes,
                            filters=_filters(scheme),
                        )
                    )
    except (OSError, ValueError):
        return []  # no DAMON here, not readable, or a layout this code does not know: nothing to report
    return schemes


def describe_reclaim(schemes: list[ReclaimScheme]) -> str | None:
    """One line for the bench's log when a scheme reclaims memory under it, else None."""
    pageouts = [s for s in schemes if s.action == "pageout"]
    if not pageouts:
        return None
    parts = [
        f"pages out memory idle for {s.min_idle_s:.0f} s"
        + (f", up to {s.quota_bytes_per_s / 2**30:.1f} GiB/s" if s.quota_bytes_per_s else "")
        + (f" ({'; '.join(s.filters)})" if s.filters else "")
        for s in pageouts
    ]
    return (
        "this machine's kernel (DAMON) "
        + " and ".join(parts)
        + ": broker page cache can be reclaimed under a row; a round that is slow with a doubled "
        "broker kernel CPU is the machine"
    )


def as_json(schemes: list[ReclaimScheme]) -> list[dict[str, Any]]:
    """The schemes as plain data for the run's JSON."""
    return [asdict(s) for s in schemes]
