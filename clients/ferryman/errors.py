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


class AuthorizationError(ConfigError):
    """The cluster refused an operation for lack of an ACL; the message names the resource and the operation."""


class EnvelopeError(FerrymanError):
    """A staging record could not be decoded into an envelope."""


class CorruptEnvelopeError(EnvelopeError):
    """An envelope's checksum does not match its records."""


class UnsupportedEnvelopeError(EnvelopeError):
    """An envelope of a schema version this reader does not know (written by a newer wrapper)."""


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
        # A cause with no text of its own (a bare TimeoutError) adds nothing after what.
        super().__init__(f"{what}: {cause}" if str(cause) else what)
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


class InvalidRequestError(FerrymanError):
    """A request field has a value the server cannot accept (INVALID_ARGUMENT); ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFoundError(FerrymanError):
    """What a request names does not exist (or, for a source position, is not replicated yet)."""


class PreconditionError(FerrymanError):
    """The request is valid but cannot be carried out in the current state (FAILED_PRECONDITION).

    A feature turned off, a change that cannot be applied live, a replication cycle. ``field``
    names the request field the refusal is about, or is ``""`` when there is none.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class AlreadyExistsError(FerrymanError):
    """What a request would create exists already (ALREADY_EXISTS)."""


class ConflictError(FerrymanError):
    """A concurrent change won (ABORTED): read the current state again and retry."""


class FlowError(FerrymanError):
    """A request about a replication flow (the flows admin API) cannot be carried out."""


class FlowFieldError(FlowError, InvalidRequestError):
    """A flow field has a value that is refused (INVALID_ARGUMENT); ``field`` names it (``naming.renames``)."""


class FlowNotFoundError(FlowError, NotFoundError):
    """No flow of that name is stored."""


class FlowNotStoredYetError(FlowError):
    """The deduper's own flow (its configuration file's) is asked for before start-up has stored it (UNAVAILABLE).

    It is stored once the destination cluster answers; asking again then succeeds.
    """


class FlowExistsError(FlowError, AlreadyExistsError):
    """A flow of that name is already stored."""


class StaleEtagError(FlowError, ConflictError):
    """The flow changed since the etag the request was based on: read it again and retry."""


class FlowStoreBusyError(FlowError, ConflictError):
    """Concurrent writers kept fencing this write of the flow store; retrying later succeeds."""


class FlowNotLiveError(FlowError, PreconditionError):
    """A change cannot be applied to running services; ``field`` names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


class FlowCycleError(FlowError, PreconditionError):
    """The flow would close a replication cycle in which topics could come back (FAILED_PRECONDITION)."""


class BusyError(PreconditionError):
    """The server is busy with what this request would start (an audit run already queued or running).

    Attributes:
        details: What is in the way (``run_id``: the run), sent as ``ErrorInfo`` metadata.
    """

    def __init__(self, message: str, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})
