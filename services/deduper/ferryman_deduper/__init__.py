"""The deduper service: staging envelopes to destination records, exactly once."""

from ferryman_deduper._deduper import Deduper, DeduperStats

__all__ = ["Deduper", "DeduperStats"]
