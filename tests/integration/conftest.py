"""Fixtures of the integration tests: one real local Spark session for the whole run, started when first asked for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A real local Spark session (``local[2]``, this machine's cores), shared by every test that audits.

    A session takes ~5 s to start: one for the run keeps the audit tests' added time small.
    """
    from ferryman_auditor import spark_session  # noqa: PLC0415 -- only when a test needs Spark

    session = spark_session("local[2]", app_name="ferryman-tests")
    yield session
    session.stop()
