"""Which records are traced: the per-record head sampling decision, cheap for the records it skips.

An OpenTelemetry SDK span costs tens of microseconds in Python; the data path
spends well under one per record. So the decision is taken per *run* of
records, before any span exists, and costs close to nothing for the records
it skips:

* trace context is looked for only in records that have headers (the
  compiled codec's ``header_indexes`` finds them in one pass over the
  messages' fields; records without headers run no Python code);
* the ratio is a geometric skip count (how many records pass before the next
  one starting a trace), drawn once per *sampled* record, not a random draw
  per record.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ferryman.config import TracingConfig
from ferryman.tracing._lean import tracepath

#: W3C trace-context header names (https://www.w3.org/TR/trace-context/).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_HEX = frozenset("0123456789abcdef")
#: Skips up to this are exact in a double (the compiled sampler counts in doubles).
_MAX_EXACT = 2**53

#: A record's headers as confluent-kafka gives them (values are bytes; str is accepted too).
Headers = Sequence[tuple[str, bytes | str | None]]


@dataclass(frozen=True, slots=True)
class ParentContext:
    """The W3C trace context a source record carries in its headers."""

    traceparent: str
    """The ``traceparent`` value, as found (version 00 layout checked)."""
    tracestate: str
    """The ``tracestate`` value, or empty."""

    @property
    def sampled(self) -> bool:
        """The sampled flag of the trace flags."""
        return bool(int(self.traceparent[53:55], 16) & 1)

    @property
    def trace_id(self) -> str:
        """The trace id, 32 lowercase hex digits."""
        return self.traceparent[3:35]


def parse_traceparent(value: str) -> str | None:
    """Value when it is a valid W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``), else None.

    Versions above 00 are accepted by their first four fields, as the W3C
    recommendation asks (the first 55 characters are returned); all-zero ids
    and version ff are invalid. Surrounding whitespace is stripped.
    """
    if tracepath is not None:  # the canonical form, checked in C (~60 ns against ~800)
        canonical = tracepath.canonical_traceparent(value)
        if canonical is not None:
            return value if canonical else None
    return parse_traceparent_py(value)


def parse_traceparent_py(value: str) -> str | None:
    """`parse_traceparent` in Python: every form (the reference the compiled check is held to)."""
    value = value.strip()
    if len(value) < 55 or (len(value) > 55 and (value[:2] == "00" or value[55] != "-")):
        return None
    version, trace_id, span_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    if not _HEX.issuperset(version + trace_id + span_id + flags) or version == "ff":
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return value[:55]


def format_traceparent(trace_id: int, span_id: int, *, sampled: bool = True) -> str:
    """A version-00 ``traceparent`` for a span's ids."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def context_of(headers: Headers | Mapping[str, bytes | str | None]) -> ParentContext | None:
    """The trace context a record's headers carry, or None (no valid ``traceparent``).

    headers as ``Message.headers()`` gives them (a list of pairs; a mapping is taken too).

    With several ``traceparent`` headers the first valid one counts; a
    ``tracestate`` is kept only beside a valid ``traceparent``.
    """
    parent = state = None
    for key, value in headers.items() if isinstance(headers, Mapping) else headers:
        if value is None:
            continue
        if parent is None and key == TRACEPARENT:
            parent = parse_traceparent(value.decode("ascii", "replace") if isinstance(value, bytes) else value)
        elif state is None and key == TRACESTATE:
            state = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return ParentContext(parent, state or "") if parent is not None else None


class RecordSampler:
    """The head-sampling decision for runs of records (see the module docstring).

    ``parentbased_*`` samplers follow a record's ``traceparent`` sampled flag
    and apply the root rule (ratio, always on/off) to records without context;
    the others apply the rule to every record. Not thread-safe: one per data
    path thread.
    """

    def __init__(self, sampler: str, ratio: float, rng: random.Random | None = None) -> None:
        self.follow_parent = sampler.startswith("parentbased_")
        rule = sampler.removeprefix("parentbased_")
        self.ratio = 1.0 if rule == "always_on" else 0.0 if rule == "always_off" else ratio
        self._rng = rng or random.Random()
        self._log_miss = math.log1p(-self.ratio) if 0 < self.ratio < 1 else 0.0
        self._skip = self._draw()

    @classmethod
    def of(cls, config: TracingConfig, rng: random.Random | None = None) -> RecordSampler:
        """The sampler a tracing configuration asks for."""
        return cls(config.sampler, config.sampler_ratio, rng)

    def _draw(self) -> float:
        """Records to pass before the next one the ratio samples (geometric; inf when the ratio is 0)."""
        if self.ratio >= 1:
            return 0
        if self.ratio <= 0:
            return math.inf
        return math.floor(math.log1p(-self._rng.random()) / self._log_miss)

    def roots(self, n: int) -> list[int]:
        """Indexes among the next n records that the ratio rule samples (the draws carry over between runs)."""
        if self.ratio >= 1:
            return list(range(n))
        if tracepath is not None and self.ratio > 0 and self._skip < _MAX_EXACT:  # the same draws, in C
            drawn = tracepath.roots(n, self._skip, self._log_miss, self._rng.random)
            if drawn is not None:
                out, skip = drawn
                self._skip = int(skip)
                return out
        out = []
        i = self._skip
        while i < n:
            out.append(int(i))
            i += 1 + self._draw()
        self._skip = i - n
        return out

    def decide(
        self, n: int, with_headers: Iterable[tuple[int, Headers]] = ()
    ) -> list[tuple[int, ParentContext | None]]:
        """The traced records of a run of n: (index, the context they join or None for a new trace), by index.

        Args:
            n: records in the run.
            with_headers: (index, headers) of the records that have headers, the only ones looked at
                for trace context.
        """
        contexts: dict[int, ParentContext] = {}
        for i, headers in with_headers:
            found = context_of(headers)
            if found is not None:
                contexts[i] = found
        if not contexts:  # no record carries context (the common case): the rule alone, already in order
            return [(i, None) for i in self.roots(n)]
        chosen: dict[int, ParentContext | None] = {}
        if self.follow_parent:
            chosen.update((i, c) for i, c in contexts.items() if c.sampled)
            chosen.update((i, None) for i in self.roots(n) if i not in contexts)
        else:
            chosen.update((i, contexts.get(i)) for i in self.roots(n))
        return sorted(chosen.items(), key=lambda item: item[0])
