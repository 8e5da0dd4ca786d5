"""Types of the compiled per-record tracing work of the data paths (_tracepath.pyx)."""

from collections.abc import Callable, Sequence
from typing import Any

from ferryman.tracing._lean import RecordSpanPy as RecordSpan
from ferryman.tracing._lean import SpanShape

__all__ = ["RecordSpan"]

def span_id() -> str: ...
def trace_id() -> str: ...
def canonical_traceparent(value: object) -> bool | None: ...
def record_traces_suffix(spans: list[tuple[int, RecordSpan]], after: int, upto: int) -> bytes | None: ...
def start_spans(
    decided: list[tuple[int, Any]],
    run: Sequence[Any],
    shape: SpanShape,
    now: int,
    offset_key: str,
    offset_new_key: str,
    timestamp_key: str,
) -> list[tuple[int, RecordSpan]]: ...
def continue_traces(
    record_traces: dict[int, tuple[str, str]],
    offsets: Sequence[int],
    start: int,
    headers: Sequence[Any] | None,
    process_shape: SpanShape,
    publish_shape: SpanShape,
    staging: tuple[tuple[str, int], ...],
    source_offset_key: str,
    now: int,
    opened: list[RecordSpan],
    parse: Callable[[str], str | None],
    with_traceparent: Callable[[Any, str], Any],
    traceparent_key: str,
) -> tuple[list[Any] | None, list[RecordSpan]]: ...
def _seed() -> None: ...
def roots(n: int, skip: float, log_miss: float, uniform: Callable[[], float]) -> tuple[list[int], float] | None: ...
