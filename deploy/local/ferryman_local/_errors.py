"""Errors of the local cluster harness."""

from __future__ import annotations

from ferryman.errors import FerrymanError


class HarnessError(FerrymanError):
    """A local cluster could not be prepared, started or stopped."""
