"""Types of the compiled per-span work of the record-span encoders (_spanwire.pyx)."""

from collections.abc import Callable, Mapping, Sequence

from ferryman.tracing._file import FileBatches
from ferryman.tracing._lean import AttributeValue, RecordSpan
from ferryman.tracing._otlp import OtlpBatches
from ferryman.tracing._zipkin import ZipkinBatches

def file_lines(
    batches: FileBatches, spans: Sequence[RecordSpan], statuses: Mapping[int, str], error: Callable[[str], str]
) -> bytes | None: ...
def zipkin_spans(
    batches: ZipkinBatches,
    spans: Sequence[RecordSpan],
    status_tags: Mapping[int, str],
    tag: Callable[[object], str],
) -> bytes | None: ...
def otlp_request(
    batches: OtlpBatches,
    spans: Sequence[RecordSpan],
    key_value: Callable[[str, AttributeValue], bytes],
    flags_local: bytes,
    flags_remote: bytes,
    link_flags: bytes,
) -> bytes | None: ...
