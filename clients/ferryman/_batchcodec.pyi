"""Types of the compiled fast path of the columnar RecordBatch codec (_batchcodec.pyx)."""

from confluent_kafka import Message

def encode_messages(messages: list[Message], lo: int, hi: int) -> tuple[bytes, int] | None: ...
def decode_columns(
    payload: bytes,
) -> (
    tuple[
        int,
        list[int],
        list[int],
        list[int],
        list[bytes],
        list[int],
        list[bytes],
        list[int],
        list[tuple[int, list[tuple[str, bytes | None]]]],
    ]
    | None
): ...

#: Whether encode_messages and partition_chunks read Message fields directly (the layout check passed).
DIRECT_MESSAGE_READS: bool

BATCH_ERRORS: int
BATCH_HEADERS: int

def has_error_events(messages: list[Message]) -> bool: ...
def batch_flags(messages: list[Message]) -> int: ...
def partition_chunks(messages: list[Message]) -> list[tuple[str, int, int, int]] | None: ...
def header_indexes(messages: list[Message]) -> list[int]: ...
def record_traces(envelope: bytes) -> dict[int, tuple[str, str]] | None: ...
