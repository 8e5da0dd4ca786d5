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
