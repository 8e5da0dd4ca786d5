"""Record spans as the ``file`` exporter's JSON lines, made from templates instead of SDK spans.

Each line is what ``ReadableSpan.to_json(indent=None)`` writes for the span
(the format the ``file`` exporter has always had); the resource and each
`SpanShape`'s name, kind and attributes are encoded once, and the time
strings once per second. The per-span work runs in C where built
(``_spanwire.pyx``); the pure-Python encoder is the fallback and the reference.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import IO

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.trace import TraceState

from ferryman.tracing._lean import ERROR, OK, UNSET, RecordSpan, SpanShape

#: The compiled per-span work (_spanwire.pyx), or None when it was not built (no C compiler at install).
try:
    from ferryman.tracing import _spanwire
except ImportError:
    _spanwire = None  # type: ignore[assignment]
spanwire = _spanwire  # the public name (tests swap it for None to run the pure-Python encoder)

#: Which encoder this process runs (the pure-Python one costs ~5x the CPU per span).
ENCODER = "compiled" if spanwire is not None else "pure Python (_spanwire not built)"

_STATUS = {UNSET: '{"status_code": "UNSET"}', OK: '{"status_code": "OK"}'}


def _error(message: str) -> str:
    """An ERROR status's JSON (its description when it has one)."""
    return json.dumps({"status_code": "ERROR", "description": message} if message else {"status_code": "ERROR"})


class FileBatches:
    """JSON lines of record spans, written to the SDK file exporter's stream."""

    def __init__(self, exporter: ConsoleSpanExporter, resource: Resource) -> None:
        """Write to exporter's stream (it owns the file); the resource is encoded once."""
        self.exporter = exporter
        self._out: IO[str] = exporter.out
        self._resource = json.dumps({"attributes": dict(resource.attributes), "schema_url": resource.schema_url})
        self._heads: dict[SpanShape, tuple[str, str, str]] = {}
        self._states: dict[str, str] = {"": json.dumps(repr(TraceState()))}
        self._second = -1
        self._second_text = ""

    def _head(self, shape: SpanShape) -> tuple[str, str, str]:
        """The JSON before the context, between context and parent, and the shape's attributes unclosed."""
        attributes = json.dumps(dict(shape.attributes))[:-1]  # "{...": the span's own ones follow
        head = self._heads[shape] = (
            f'{{"name": {json.dumps(shape.name)}, "context": ',
            f', "kind": "{shape.kind}", ',
            attributes if attributes != "{" else "",
        )
        return head

    def _state(self, tracestate: str) -> str:
        """The JSON of a tracestate as the SDK prints it (its repr)."""
        text = self._states[tracestate] = json.dumps(repr(TraceState.from_header([tracestate])))
        return text

    def _time(self, ns: int) -> str:
        """``ns_to_iso_str`` (to the microsecond, rounded), the date part made once per second."""
        micros = (ns + 500) // 1000
        second, fraction = divmod(micros, 1_000_000)
        if second != self._second:
            moment = datetime.datetime.fromtimestamp(second, tz=datetime.UTC)
            self._second, self._second_text = second, moment.strftime("%Y-%m-%dT%H:%M:%S")
        return f'"{self._second_text}.{fraction:06d}Z"'

    def _context(self, trace_id: str, span_id: str, tracestate: str) -> str:
        state = self._states.get(tracestate) or self._state(tracestate)
        return f'{{"trace_id": "0x{trace_id}", "span_id": "0x{span_id}", "trace_state": {state}}}'

    def encode_bytes(self, spans: Sequence[RecordSpan]) -> bytes:
        """The lines of spans (each ending in a newline) as written: compiled where built, else `encode_py`."""
        if spanwire is not None:
            lines = spanwire.file_lines(self, spans, _STATUS, _error)
            if lines is not None:
                return lines
        return self.encode_py(spans).encode()

    def encode(self, spans: Sequence[RecordSpan]) -> str:
        """`encode_bytes` as a str."""
        return self.encode_bytes(spans).decode()

    def encode_py(self, spans: Sequence[RecordSpan]) -> str:
        """The lines of spans (each ending in a newline), in Python: the reference.

        The per-span attribute keys are Ferryman's constants, written without JSON escaping.
        """
        out = []
        heads, time_of, context, statuses = self._heads, self._time, self._context, _STATUS
        resource = self._resource
        for s in spans:
            before, after, attributes = heads.get(s.shape) or self._head(s.shape)
            if s.attributes:
                varying = ", ".join(
                    [f'"{k}": {v}' if type(v) is int else f'"{k}": {json.dumps(v)}' for k, v in s.attributes]
                )
                attributes = f"{attributes}, {varying}}}" if attributes else f"{{{varying}}}"
            else:
                attributes = attributes + "}" if attributes else "{}"
            links = (
                ", ".join([f'{{"context": {context(k.trace_id, k.span_id, "")}, "attributes": null}}' for k in s.links])
                if s.links
                else ""
            )
            out.append(
                f"{before}{context(s.trace_id, s.span_id, s.tracestate)}{after}"
                f'"parent_id": {f"{chr(34)}0x{s.parent_id}{chr(34)}" if s.parent_id else "null"}, '
                f'"start_time": {time_of(s.start_ns)}, "end_time": {time_of(s.end_ns)}, '
                f'"status": {statuses[s.status] if s.status != ERROR else _error(s.message)}, '
                f'"attributes": {attributes}, "events": [], "links": [{links}], "resource": {resource}}}\n'
            )
        return "".join(out)

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Append the lines and flush: as bytes to the stream's binary buffer when it has one.

        The lines are ASCII, so bytes skip the str the text layer would encode
        again (a batch is ~1.6 MB). The SDK exporter of the other spans writes whole
        lines through the same buffer, whose lock keeps lines from interleaving.
        """
        buffer: IO[bytes] | None = getattr(self._out, "buffer", None)
        if buffer is not None:
            buffer.write(self.encode_bytes(spans))
            buffer.flush()
        else:
            self._out.write(self.encode(spans))
            self._out.flush()
        return True

    def shutdown(self) -> None:
        """Shut the exporter down (closes nothing: the SDK exporter does not close its stream either)."""
        self.exporter.shutdown()
