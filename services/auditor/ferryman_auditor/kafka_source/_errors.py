"""Errors of the ``ferryman-kafka`` data source."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ferryman.errors import FerrymanError

if TYPE_CHECKING:
    from ferryman_auditor.kafka_source._planning import OffsetSpan


class KafkaSourceError(FerrymanError):
    """A read cannot be planned or performed (bad options, a range that is gone, a stalled broker)."""


class StallWatch:
    """A span reader's progress: a read that brings nothing for stall_timeout_ms is an error (both read paths)."""

    def __init__(self, span: OffsetSpan, stall_timeout_ms: int) -> None:
        self._span = span
        self._timeout_ms = stall_timeout_ms
        self._at = time.monotonic()

    def progressed(self) -> None:
        """Something was read."""
        self._at = time.monotonic()

    def check(self, position: int) -> None:
        """After a read that brought nothing.

        Raises:
            KafkaSourceError: nothing read for stall_timeout_ms.
        """
        if time.monotonic() - self._at > self._timeout_ms / 1000:
            s = self._span
            raise KafkaSourceError(
                f"{s.topic}-{s.partition}: nothing read for {self._timeout_ms} ms at offset {position} "
                f"(reading up to {s.end})"
            )
