"""Types of the compiled direct produce path (_rdproduce.pyx)."""

from typing import Any

from confluent_kafka import Producer

def resolve(names: tuple[bytes, ...]) -> tuple[int, ...] | str: ...
def bind() -> str | None: ...
def adopts(producer: Producer, client_id: str) -> bool: ...
def produce_rows(
    producer: Producer,
    topic: str,
    partition: int,
    values: list[Any],
    keys: list[Any],
    timestamps: list[Any],
    headers: list[Any] | None,
    start: int,
    n: int,
) -> int: ...
