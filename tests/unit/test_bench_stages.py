"""bench.stages: a traced record's time inside Ferryman, stage by stage, read from spans the file exporter wrote."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ferryman.tracing import RecordSpan, SpanShape, new_span_id, new_trace_id
from ferryman.tracing._file import FileBatches
from ferryman.tracing._spans import SOURCE_TIMESTAMP
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.trace import SpanKind

from bench import row_run, stages
from bench.latency import LatencyResult
from bench.results import RowResult

T0 = 1_800_000_000_000_000_000  # ns
MS = 1_000_000
WRAPPER = SpanShape("orders process", SpanKind.CONSUMER, {"messaging.destination.name": "orders"})
PROCESS = SpanShape("ferryman.f.staging.internal process", SpanKind.CONSUMER, {})
PUBLISH = SpanShape("orders publish", SpanKind.PRODUCER, {"messaging.destination.name": "orders"})
COMMIT = SpanShape("ferryman commit", SpanKind.INTERNAL, {})


def _record(
    taken_ms: int, handed_ms: int, written_ms: int, committed_ms: int, appended_ms: int | None = None
) -> tuple[RecordSpan, ...]:
    """A traced record's spans as the services make them: the wrapper's (with the source timestamp when the record
    has one), then the deduper's process and publish."""
    trace = new_trace_id()
    stamp = () if appended_ms is None else ((SOURCE_TIMESTAMP, T0 // MS + appended_ms),)
    w = RecordSpan(WRAPPER, trace, new_span_id(), "", T0 + taken_ms * MS, attributes=stamp, end_ns=T0 + handed_ms * MS)
    p = RecordSpan(PROCESS, trace, new_span_id(), w.span_id, T0 + written_ms * MS, end_ns=T0 + written_ms * MS)
    q = RecordSpan(PUBLISH, trace, new_span_id(), p.span_id, T0 + written_ms * MS, end_ns=T0 + committed_ms * MS)
    return w, p, q


def _write(path: Path, wrapper: list[RecordSpan], deduper: list[RecordSpan]) -> None:
    """Both services' spans in one file, as the bench's traced rows have them."""
    with path.open("a", encoding="utf-8") as out:
        for service, spans in (("ferryman-wrapper", wrapper), ("ferryman-deduper", deduper)):
            exporter = ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
            assert FileBatches(exporter, Resource.create({"service.name": service})).export(spans)


@pytest.fixture
def spans_file(tmp_path: Path) -> Path:
    """Four complete records from 1 s on, one the deduper never wrote, one before 1 s, two commits."""
    # appended 10, 20, 30, 40 ms before the wrapper took them
    records = [_record(1000 + i, 1001 + i, 1100 + 10 * i, 1300 + 10 * i, 1000 + i - 10 * (i + 1)) for i in range(4)]
    unwritten = _record(1005, 1006, 0, 0)[0]
    early = _record(10, 11, 50, 60)
    commits = [
        RecordSpan(COMMIT, new_trace_id(), new_span_id(), "", T0 + ms * MS, end_ns=T0 + (ms + 40) * MS)
        for ms in (1200, 1300, 1500)
    ]
    path = tmp_path / "spans.jsonl"
    deduper = [s for r in [*records, early] for s in r[1:]]
    _write(path, [r[0] for r in records] + [unwritten, early[0]], deduper + commits)
    return path


def test_stages_split_each_record_from_the_wrapper_to_the_commit(spans_file: Path) -> None:
    found = stages.read_stages(spans_file, since_s=(T0 + 1000 * MS) / 1e9)
    assert found is not None
    assert found.records == 4  # the record the deduper never wrote and the one before `since` are left out
    ms = {name: {q: round(v, 3) for q, v in p.items()} for name, p in found.stages.items()}
    assert ms["wrapper"] == {50: 1.0, 90: 1.0, 99: 1.0}
    # handed at 1001+i, written at 1100+10i: 99, 108, 117, 126
    assert ms["staging"] == {50: 108.0, 90: 126.0, 99: 126.0}
    assert ms["commit"] == {50: 200.0, 90: 200.0, 99: 200.0}
    # taken at 1000+i, committed at 1300+10i: 300, 309, 318, 327
    assert ms["ferryman"] == {50: 309.0, 90: 327.0, 99: 327.0}
    assert ms["source"] == {50: 20.0, 90: 40.0, 99: 40.0}
    assert ms["total"] == {50: 329.0, 90: 367.0, 99: 367.0}  # 310 + 19i
    assert (found.commits, round(found.commit_ms, 3), round(found.commit_every_ms, 3)) == (3, 40.0, 150.0)
    assert found.as_dict()["stages_ms"]["staging"] == {"p50": ms["staging"][50], "p90": 126.0, "p99": 126.0}  # type: ignore[index]
    assert found.describe().splitlines()[1:4] == [
        "  source   20.0 / 40.0 / 40.0",
        "  wrapper  1.0 / 1.0 / 1.0",
        "  staging  108.0 / 126.0 / 126.0",
    ]


def test_no_window_reads_every_record_and_an_empty_or_missing_file_reads_none(spans_file: Path, tmp_path: Path) -> None:
    everything = stages.read_stages(spans_file)
    assert everything is not None and everything.records == 5
    untimed = tmp_path / "untimed.jsonl"
    w, p, q = _record(0, 1, 2, 3)  # a record without a source timestamp: no source or total stage
    _write(untimed, [w], [p, q])
    alone = stages.read_stages(untimed)
    assert alone is not None and set(alone.stages) == {"wrapper", "staging", "commit", "ferryman"}
    assert stages.read_stages(tmp_path / "absent.jsonl") is None
    (tmp_path / "empty.jsonl").write_text("")
    assert stages.read_stages(tmp_path / "empty.jsonl") is None
    one = tmp_path / "one.jsonl"
    _write(one, [], [RecordSpan(COMMIT, new_trace_id(), new_span_id(), "", T0, end_ns=T0 + MS)])
    assert stages.read_stages(one) is None  # a commit alone: no record to split


def test_cli_prints_the_stages_and_names_what_is_wrong(
    spans_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stages.main([str(spans_file), "--since", "2027-01-15T08:00:01Z"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 traced records") and "3 transactions: 40.0 ms each" in out
    with pytest.raises(SystemExit) as exc:
        stages.main([str(tmp_path / "absent.jsonl")])
    assert exc.value.code == 2 and "spans: no file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stages.main([str(spans_file), "--since", "yesterday"])
    assert "--since: not an ISO 8601 time: 'yesterday'" in capsys.readouterr().err
    assert stages.main([str(spans_file), "--since", "2027-01-15T09:00:00"]) == 1  # no zone: UTC; nothing after it
    assert "no traced record" in capsys.readouterr().out


def test_a_traced_row_gets_its_latency_phase_split_once_stopped(spans_file: Path) -> None:
    row: Any = SimpleNamespace(name="ferryman-trace1", spans_file=lambda: spans_file)
    phase = LatencyResult(1.0, 1.0, 4, 4, 0, 1.0, 2.0, 3.0, started_s=(T0 + 1000 * MS) / 1e9)
    result = RowResult("ferryman-trace1", True, latency=phase)
    row_run._read_stages(row, result)
    assert result.latency is not None and result.latency.stages["records"] == 4
    untraced: Any = SimpleNamespace(name="copyloop", spans_file=lambda: None)
    plain = RowResult("copyloop", False, latency=LatencyResult(1.0, 1.0, 4, 4, 0, 1.0, 2.0, 3.0))
    row_run._read_stages(untraced, plain)
    assert plain.latency is not None and plain.latency.stages == {} and math.isnan(plain.latency.started_s)
