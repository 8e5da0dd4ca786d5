"""Errors of the ``ferryman-kafka`` data source."""

from __future__ import annotations

from ferryman.errors import FerrymanError


class KafkaSourceError(FerrymanError):
    """A read cannot be planned or performed (bad options, a range that is gone, a stalled broker)."""
