"""Exception hierarchy shared by every Ferryman package.

One root (`FerrymanError`) with small named subclasses. Foreign errors
(librdkafka, gRPC, msgspec) are translated into these once, at the boundary
where they are caught, so callers never need to know the library underneath.
"""

from __future__ import annotations


class FerrymanError(Exception):
    """Root of every error Ferryman raises on purpose."""


class ConfigError(FerrymanError):
    """The configuration is missing, malformed or inconsistent."""


class EnvelopeError(FerrymanError):
    """A staging record could not be decoded into an envelope."""


class CorruptEnvelopeError(EnvelopeError):
    """An envelope's checksum does not match its records."""


class TopicShapeError(FerrymanError):
    """An existing topic has a shape Ferryman cannot safely use."""


class SourceDataLostError(FerrymanError):
    """Source records that were never replicated are no longer readable.

    Raised instead of silently skipping ahead (for instance when retention
    deleted records the wrapper had not yet read).
    """


class KafkaOperationError(FerrymanError):
    """A Kafka client call failed and could not be retried within its budget."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(f"{what}: {cause}")
        self.what = what
        self.__cause__ = cause


class FencedError(FerrymanError):
    """Another instance with the same transactional identity took over.

    The fenced process must stop writing: carrying on would fence the new owner
    in turn, and the two would take the partitions from each other forever.
    """


class WedgedCallError(FerrymanError):
    """A blocking Kafka client call overran its deadline and was abandoned.

    librdkafka honours its API timeouts almost always; where it does not (a
    coordinator it dropped from its cache, librdkafka #5511), the call's client
    is given up: the caller builds a new one and rewinds to its last commit.
    """

    def __init__(self, what: str, deadline_s: float) -> None:
        super().__init__(f"{what} did not return within its {deadline_s:g} s deadline; its client was abandoned")
        self.what = what
        self.deadline_s = deadline_s


class ClusterUnreachableError(FerrymanError):
    """A cluster did not answer within the start-up deadline (``startup_timeout_s``)."""


class NotFoundError(FerrymanError):
    """A named thing asked for (a flow, an audit run) does not exist."""


class BusyError(FerrymanError):
    """The server is busy with what this request would start (an audit run already queued or running).

    Attributes:
        details: What is in the way (``run_id``: the run), sent as ``ErrorInfo`` metadata.
    """

    def __init__(self, message: str, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})
