"""CPU cost of one traced record, per service and in all: ``python -m bench.span_cost [--records N]``.

Runs the services' own record-span code (``ferryman_wrapper._traces``, ``ferryman_deduper._traces``) on
records that are all traced, in one process, and prints CPU microseconds per traced record (process time,
so the export thread's work counts, as it does in a service):

* ``spans``: the record spans alone (made, ended and queued; the export thread drops the batches);
* ``+ zipkin`` / ``+ otlp`` / ``+ file``: the export thread also encodes the batches as Zipkin JSON v2 / OTLP
  protobuf / the file exporter's JSON lines (what ``exporter: zipkin`` / ``otlp-*`` / ``file`` send or write;
  the benchmark rows use ``file``), but does not send or write them.

With ``--cold`` also the data-path thread's CPU alone with the CPU caches flushed before each envelope of 10
traced records (`measure_cold`): at a 1 % ratio the tracing code runs between batches that have evicted it, and
the pipeline pays about that figure, not the warm one (docs/notes.md, issue 26).

Beside it, the compiled envelope decode of the same records, per record: figures on a busy machine scale
with it. The amortised cost at a ratio r is r x the total; the budget of issue 26 is 5 % of Ferryman's
CPU per record (~2-4 us/record for both services together on this machine, README "Benchmark").
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Message
from ferryman import envelope
from ferryman.config import TracingConfig
from ferryman.tracing import BatchExporter, RecordSampler, RecordSpan, RecordSpans, Tracing
from ferryman.tracing._file import FileBatches
from ferryman.tracing._otlp import HttpSpanExporter, OtlpBatches
from ferryman.tracing._zipkin import ZipkinBatches
from ferryman.v1 import envelope_pb2
from ferryman_deduper._traces import DeduperTraces
from ferryman_wrapper._traces import WrapperTraces
from opentelemetry.exporter.zipkin.json import ZipkinExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

#: Memory written before each envelope by measure_cold (more than this machine's caches).
COLD_BYTES = 8 << 20
#: Traced records per envelope in measure_cold: a 1 % ratio traces ~10 of a 1,000-record envelope (with 1, the
#: deduper's figure is the difference of two cold decodes, noisier than the tracing work it is after).
COLD_PER_ENVELOPE = 10
#: Records per envelope (and per run) in the measurement.
RUN = 100
#: Traced records per envelope: 1, as at the ratios that are used (one traced record per transaction, so
#: each has a ``ferryman commit`` span of its own); 100 (``--all``) for a run where every record is traced.


class _Dropped:
    """Drops batches (the cost of the spans alone)."""

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Drop."""
        return True

    def shutdown(self) -> None:
        """Nothing to release."""


class _EncodeOnly:
    """Encodes batches as the exporter would send them, then drops the bytes."""

    def __init__(self, encode: Callable[[Sequence[RecordSpan]], object]) -> None:
        self._encode = encode

    def export(self, spans: Sequence[RecordSpan]) -> bool:
        """Encode, drop."""
        self._encode(spans)
        return True

    def shutdown(self) -> None:
        """Nothing to release."""


def _exporter(kind: str) -> BatchExporter:
    resource = Resource.create({"service.name": "bench"})
    scope = InstrumentationScope("ferryman")
    if kind == "zipkin":
        return _EncodeOnly(ZipkinBatches(ZipkinExporter(), resource, scope).encode_bytes)
    if kind == "file":
        return _EncodeOnly(FileBatches(ConsoleSpanExporter(out=io.StringIO()), resource).encode_bytes)
    if kind == "otlp":
        return _EncodeOnly(OtlpBatches(HttpSpanExporter(), resource, scope).encode)
    return _Dropped()


def _tracing(kind: str, records: int) -> Tracing:
    config = TracingConfig(enabled=True, sampler="always_on", sampler_ratio=1.0, exporter="zipkin")
    return Tracing(
        config=config,
        sampler=RecordSampler.of(config),
        records=RecordSpans(_exporter(kind), max_links=config.max_links, max_queue=4 * records),  # none dropped
        provider=TracerProvider(),
    )


def _run(n: int) -> tuple[list[Message], bytes]:
    """n records as messages (for the wrapper) and as one envelope (for the deduper)."""
    messages = [Message(topic="t", partition=0, offset=i, key=b"k%d" % i, value=b"v" * 100) for i in range(n)]
    run = envelope.RecordRun(
        offsets=range(n),
        timestamps_ms=[1_800_000_000_000 + i for i in range(n)],
        timestamp_types=[0],
        keys=[m.key() for m in messages],
        values=[m.value() for m in messages],
    )
    src = envelope_pb2.SourcePartition(topic="t", partition=0, cluster_id="c", topic_id=b"0123456789abcdef")
    return messages, envelope.encode(src, -1, run, wrapper_id="w", wrapper_epoch=1)


def _cpu_per(fn: Callable[[], Any], n: int, repeat: int = 3) -> float:
    """Best of repeat: CPU microseconds (all threads) per record."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best / n * 1e6


def measure(records: int, per_envelope: int) -> dict[str, float]:
    """CPU us per traced record: wrapper, deduper, both; without and with export; decode for scale."""
    messages, data = _run(per_envelope)
    out: dict[str, float] = {}
    out["decode"] = _cpu_per(lambda: [envelope.decode(data) for _ in range(records // per_envelope)], records)
    for kind in ("spans", "+ zipkin", "+ otlp", "+ file"):
        tracing = _tracing(kind.removeprefix("+ "), records)
        wrapper = WrapperTraces(tracing, consumer_group="g")
        deduper = DeduperTraces(tracing, staging_topic="staging", consumer_group="d")
        suffixes: list[bytes] = []

        def wrap(wrapper: WrapperTraces = wrapper, suffixes: list[bytes] = suffixes) -> None:
            suffixes.clear()
            for _ in range(records // per_envelope):
                traces = wrapper.start("t", 0, messages)
                assert traces is not None
                suffixes.append(traces.suffix(-1, per_envelope - 1))
                traces.end()

        def dedupe(deduper: DeduperTraces = deduper, suffixes: list[bytes] = suffixes) -> None:
            for suffix in suffixes:
                traced = envelope.decode(data + suffix)
                deduper.written(traced, 0, destination="t2", staging_partition=0, staging_offset=0, headers=None)
                deduper.committed(per_envelope, time.time_ns())  # a transaction per envelope

        def flushed(fn: Callable[[], None], tracing: Tracing = tracing) -> Callable[[], None]:
            def call() -> None:
                fn()
                assert tracing.records.flush()  # the export thread's work is part of the cost

            return call

        tag = kind
        out[f"wrapper {tag}"] = _cpu_per(flushed(wrap), records)
        wrap()  # suffixes for the deduper
        out[f"deduper {tag}"] = _cpu_per(flushed(dedupe), records) - out["decode"]  # its decode is not tracing
        out[f"both {tag}"] = out[f"wrapper {tag}"] + out[f"deduper {tag}"]
        tracing.records.shutdown()
    return out


def measure_cold(records: int, per_envelope: int = COLD_PER_ENVELOPE) -> dict[str, float]:
    """CPU us per traced record on the data-path thread alone, with the CPU caches flushed before each envelope.

    In a service at a low ratio the tracing code runs once per run or envelope, between batches of about a
    thousand records that have evicted it from the caches (8 MB written here, more than this machine's caches);
    warm loops (`measure`) see a third or less of that cost. Each step is timed on its own (thread CPU time),
    so the flush is not counted; export is not either (it runs on the export thread, batches dropped).
    """
    messages, plain = _run(per_envelope)
    junk = bytearray(COLD_BYTES)
    ones = b"\x01" * len(junk[::64])
    clock = time.thread_time_ns
    tracing = _tracing("spans", records)
    wrapper = WrapperTraces(tracing, consumer_group="g")
    deduper = DeduperTraces(tracing, staging_topic="staging", consumer_group="d")
    spent = {"wrapper": 0, "deduper": 0}
    best = {"wrapper": float("inf"), "deduper": float("inf")}
    for _ in range(3):
        spent = dict.fromkeys(spent, 0)
        for _ in range(records // per_envelope):
            junk[::64] = ones  # one write per cache line
            t = clock()
            traces = wrapper.start("t", 0, messages)
            assert traces is not None
            data = plain + traces.suffix(-1, per_envelope - 1)
            traces.end()
            spent["wrapper"] += clock() - t
            junk[::64] = ones
            t = clock()
            traced = envelope.decode(data)
            deduper.written(traced, 0, destination="t2", staging_partition=0, staging_offset=0, headers=None)
            deduper.committed(per_envelope, time.time_ns())
            spent["deduper"] += clock() - t
            junk[::64] = ones
            t = clock()
            envelope.decode(plain)  # the decode the deduper makes without tracing, taken off
            spent["deduper"] -= clock() - t
        best = {k: min(best[k], v / records / 1000) for k, v in spent.items()}
    tracing.records.shutdown()
    return {
        "wrapper spans (cold)": best["wrapper"],
        "deduper spans (cold)": best["deduper"],
        "both spans (cold)": best["wrapper"] + best["deduper"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000, help="traced records per measurement (20000)")
    parser.add_argument(
        "--all", action="store_true", help=f"{RUN} traced records per transaction (default: 1, as at low ratios)"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help=f"also the data-path thread's CPU with the caches flushed before each envelope of {COLD_PER_ENVELOPE}",
    )
    args = parser.parse_args(argv)
    per = RUN if args.all else 1
    figures = measure(args.records, per)
    if args.cold:
        figures.update(measure_cold(args.records // 4))
    load = open("/proc/loadavg").read().split()[0]  # noqa: SIM115
    print(f"CPU us per traced record ({args.records} records, {per} per transaction, best of 3; load {load}):")
    for name, value in figures.items():
        print(f"  {name:20s} {value:8.2f}")
    both = max(figures["both + zipkin"], figures["both + otlp"], figures["both + file"])
    for ratio in (0.01, 0.001):
        print(f"  at ratio {ratio:g}: {ratio * both * 1000:.1f} ns per record amortised (both services, export)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
