"""Types of the compiled span reader (_spanread.pyx)."""

from typing import Any

from confluent_kafka import Consumer

def bind() -> str | None: ...

class SpanReader:
    def __init__(self, consumer: Consumer, topic: str, partition: int) -> None: ...
    def read(
        self, max_records: int, timeout_ms: int, end: int
    ) -> tuple[tuple[Any, ...] | None, int, bool, tuple[int, str] | None]: ...
    def close(self) -> None: ...
