"""Where a traced record's latency goes, stage by stage, from the spans file of a traced row.

``python -m bench.stages SPANS [--since 2026-11-29T06:47:58Z]``

The latency phase times source append -> visible at the destination as a whole. A traced row
(``ferryman-trace1``...) also leaves, per traced record, the wrapper's ``process`` span and the
deduper's ``publish`` span in its ``file`` exporter's JSON lines. Paired by trace id, their times
(and the source timestamp on the wrapper's span) split the record's path into:

* ``source``: the source record's timestamp -> the wrapper took it from its consumer (the source
  append, the wrapper's fetch and its consume loop; records without a timestamp have no such stage);
* ``wrapper``: the wrapper took the record from its consumer -> handed its envelope to the producer;
* ``staging``: handed to the staging producer -> the deduper handed the record to the destination
  producer (the staging write, the deduper's fetch, decoding, and any wait while its loop was busy,
  e.g. committing; the deduper's process and publish spans both start as it writes the record);
* ``commit``: handed to the destination producer -> its transaction committed (the publish span
  ends with the commit);
* ``ferryman``: the wrapper took the record -> committed (what Ferryman adds between the two
  clusters' consumers, without the source consumer's wait and the reader's);
* ``total``: the source timestamp -> committed (the latency phase's figure without the reader's share).

The ``ferryman commit`` spans give the transactions' durations and the time between their starts.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ferryman.tracing._spans import SOURCE_TIMESTAMP

from bench.latency import percentile

#: The stages, in path order (the last two span others).
STAGES = ("source", "wrapper", "staging", "commit", "ferryman", "total")
#: Percentiles reported per stage.
PERCENTILES = (50, 90, 99)
_WRAPPER = "ferryman-wrapper"
_COMMIT = "ferryman commit"


@dataclass(frozen=True)
class StageLatencies:
    """Per stage, percentiles in milliseconds over the records whose two spans were both found."""

    records: int
    """Traced records with a wrapper span and a deduper publish span."""
    stages: Mapping[str, Mapping[int, float]]
    """Stage name -> percentile -> milliseconds (``source`` and ``total`` only when records carry their
    source timestamp)."""
    commits: int
    """``ferryman commit`` spans that started in the window."""
    commit_ms: float
    """Their median duration."""
    commit_every_ms: float
    """Median time between the starts of consecutive ones (NaN with fewer than two)."""

    def describe(self) -> str:
        """One line per stage, then the transactions."""
        lines = [f"{self.records:,} traced records spent their time (ms, p50 / p90 / p99):"]
        for name in (name for name in STAGES if name in self.stages):
            p = self.stages[name]
            lines.append(f"  {name:8s} " + " / ".join(f"{p[q]:.1f}" for q in PERCENTILES))
        lines.append(
            f"  {self.commits} transactions: {self.commit_ms:.1f} ms each (median), one every "
            f"{self.commit_every_ms:.1f} ms"
        )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, object]:
        """For the bench's JSON."""
        return {
            "records": self.records,
            "stages_ms": {name: {f"p{q}": v for q, v in p.items()} for name, p in self.stages.items()},
            "commits": self.commits,
            "commit_ms": self.commit_ms,
            "commit_every_ms": self.commit_every_ms,
        }


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)


def _micros(iso: str) -> int:
    """Epoch microseconds of an ISO 8601 time like the file exporter's ``2026-11-29T06:47:47.067530Z`` (UTC if no
    zone), exact: float seconds would blur the microseconds."""
    moment = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return ((moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)) - _EPOCH) // _MICROSECOND


def stage_latencies(lines: Iterable[str], since_s: float = 0.0) -> StageLatencies | None:
    """The stages of the records the wrapper took at or after ``since_s``; None when no record has both spans.

    Args:
        lines: the spans file's lines (other lines, e.g. gRPC call spans, are skipped).
        since_s: epoch seconds; earlier records (say, the bulk copy before a latency phase) are left out.
    """
    since = round(since_s * 1e6)
    wrapper: dict[str, tuple[int, int, int | None]] = {}
    publish: dict[str, tuple[int, int]] = {}
    commits: list[tuple[int, int]] = []
    for line in lines:
        span = json.loads(line)
        name: str = span["name"]
        start, end = _micros(span["start_time"]), _micros(span["end_time"])
        if name == _COMMIT:
            if start >= since:
                commits.append((start, end))
            continue
        trace_id: str = span["context"]["trace_id"]
        if span["resource"]["attributes"].get("service.name") == _WRAPPER:
            if name.endswith(" process") and start >= since:
                stamped = span["attributes"].get(SOURCE_TIMESTAMP)
                wrapper[trace_id] = (start, end, None if stamped is None else int(stamped) * 1000)
        elif name.endswith(" publish") and start >= since:  # it starts after the wrapper's span
            publish[trace_id] = (start, end)
    per_stage: dict[str, list[float]] = {name: [] for name in STAGES}
    for trace_id, (taken, handed, appended) in wrapper.items():
        if trace_id not in publish:
            continue
        written, committed = publish[trace_id]
        spans = {
            "wrapper": handed - taken,
            "staging": written - handed,
            "commit": committed - written,
            "ferryman": committed - taken,
        }
        if appended is not None:
            spans["source"], spans["total"] = taken - appended, committed - appended
        for name, micros in spans.items():
            per_stage[name].append(micros / 1000)
    records = len(per_stage["ferryman"])
    if not records:
        return None
    stages = {name: {q: percentile(values, q) for q in PERCENTILES} for name, values in per_stage.items() if values}
    starts = sorted(start for start, _ in commits)
    return StageLatencies(
        records=records,
        stages=stages,
        commits=len(commits),
        commit_ms=statistics.median((end - start) / 1000 for start, end in commits) if commits else float("nan"),
        commit_every_ms=(
            statistics.median((b - a) / 1000 for a, b in itertools.pairwise(starts))
            if len(starts) > 1
            else float("nan")
        ),
    )


def read_stages(path: Path, since_s: float = 0.0) -> StageLatencies | None:
    """`stage_latencies` of a spans file (None when it is missing or holds no complete record)."""
    try:
        with path.open(encoding="utf-8") as lines:
            return stage_latencies(lines, since_s)
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Print the stages of a spans file."""
    ap = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__.split("\n\n")[0])
    ap.add_argument("spans", type=Path, help="a traced row's spans file (the file exporter's JSON lines)")
    ap.add_argument("--since", help="only records the wrapper took from this UTC time on, e.g. 2026-11-29T06:47:58Z")
    args = ap.parse_args(argv)
    if not args.spans.is_file():
        ap.error(f"spans: no file {args.spans}")
    since = 0.0
    if args.since:
        try:
            since = _micros(args.since) / 1e6
        except ValueError:
            ap.error(f"--since: not an ISO 8601 time: {args.since!r}")
    found = read_stages(args.spans, since)
    if found is None:
        print(f"{args.spans}: no traced record with both its wrapper span and its publish span")
        return 1
    print(found.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
