"""Errors of the auditor."""

from __future__ import annotations

from ferryman.errors import FerrymanError


class AuditError(FerrymanError):
    """An audit could not be run (its flow's clusters unreachable, its range invalid, a read failing)."""


class AuditUsageError(AuditError):
    """The audit was asked for something that cannot be (an unknown topic, partition or run)."""


class AuditCancelledError(AuditError):
    """The audit was cancelled before its results were stored (nothing of it was stored)."""
