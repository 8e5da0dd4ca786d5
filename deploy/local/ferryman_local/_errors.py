"""Errors of the local cluster harness: one root, one subclass per failure kind."""

from __future__ import annotations

from ferryman.errors import FerrymanError


class HarnessError(FerrymanError):
    """Root of every error the local cluster harness raises on purpose."""


class ToolMissingError(HarnessError):
    """A program the harness needs (``java``, ``mvn``) is not on ``PATH``."""


class JarResolutionError(HarnessError):
    """Maven could not resolve the pinned Apache Kafka jars.

    The message ends with the tail of Maven's output.
    """


class ClusterStartError(HarnessError):
    """A broker could not be formatted or did not become ready in time.

    The message ends with the tail of the broker's logs.
    """


class CoordinatorNotFoundError(HarnessError):
    """No broker can be named as the coordinator of a transactional id or group right now."""


class PrometheusStartError(HarnessError):
    """A local Prometheus server exited at start or did not become ready in time.

    The message ends with the tail of its log.
    """


class ZipkinStartError(HarnessError):
    """A local Zipkin server exited at start or did not become ready in time.

    The message ends with the tail of its log.
    """
