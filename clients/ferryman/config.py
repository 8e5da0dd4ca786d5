"""Ferryman configuration: typed, frozen models, parsed once at the edge.

A configuration names clusters by alias and lists replication flows between
them (the vocabulary of MirrorMaker 2 and managed-Kafka replication flows).
It comes from one YAML file (``--config``), environment overrides of the form
``FERRYMAN_<SECTION>__<FIELD>[__<FIELD>...]`` (for example
``FERRYMAN_DEDUPER__INSTANCE_ID=d1``; lists and maps too, as ``ferryman._config_env``
describes) and, for drop-in compatibility with kafka-reo, the ``KAFKA_CLUSTERS_*``
variables, which on their own describe a complete one-topic flow. Nothing below the services' ``cli`` modules reads the
environment or files.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import yaml
from msgspec import Meta, Struct, field

from ferryman._config_env import apply_env_overrides
from ferryman._config_otel import apply_otel_env
from ferryman.errors import ConfigError

#: Topics never replicated unless a flow names them explicitly: Kafka's own
#: internal topics, internal topics of Connect/MM2/Ferryman, and replicas.
DEFAULT_TOPICS_EXCLUDE: tuple[str, ...] = (r"__.*", r".*[-.]internal", r".*\.replica")
#: Consumer groups never synced unless a flow says otherwise (MirrorMaker 2's ``groups.exclude`` default).
DEFAULT_GROUPS_EXCLUDE: tuple[str, ...] = (r"console-consumer-.*", r"connect-.*", r"__.*")

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_SECRET_WORDS = ("password", "secret", "token", "key.pem", "private", "oauthbearer.config", "jaas", "credential")


class SecretStr:
    """A secret string that never prints (``get_secret_value()`` reads it)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        """The secret itself."""
        return self._value

    def __repr__(self) -> str:
        return "SecretStr('**********')"

    def __str__(self) -> str:
        return "**********"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class _FieldError(ValueError):
    """A field's value is refused by a check its type cannot express."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _Model(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Frozen, keyword-only, unknown fields refused; ``validated()`` checks every constraint."""


_M = TypeVar("_M", bound=_Model)


class ClusterConfig(_Model, frozen=True):
    """How to reach one Kafka cluster."""

    bootstrap_servers: str
    """Comma-separated host:port list (librdkafka ``bootstrap.servers``)."""
    client_config: dict[str, str | int | float | bool] = field(default_factory=dict)
    """Extra librdkafka properties for every client on this cluster
    (security.protocol, sasl.*, ssl.*); secret values are masked when printed.
    Numbers and booleans are passed on as they are (``linger.ms: 5``), as librdkafka takes them."""

    def __repr__(self) -> str:
        masked = {
            k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in self.client_config.items()
        }
        return f"ClusterConfig(bootstrap_servers={self.bootstrap_servers!r}, client_config={masked!r})"

    __str__ = __repr__


class NamingConfig(_Model, frozen=True):
    """Replication (naming) policy: how a source topic name becomes a destination name."""

    policy: Literal["prefix", "identity"] = "prefix"
    """``prefix``: ``<source-alias><separator><topic>`` (MirrorMaker 2's default);
    ``identity``: the source name unchanged."""
    separator: str = "."
    """Separator between the source alias and the topic name (prefix policy)."""
    rename: dict[str, str] = field(default_factory=dict)
    """Explicit source-topic to destination-topic names; they win over the policy."""


class AcknowledgedLoss(_Model, frozen=True):
    """An operator's explicit acceptance that source records were lost before they were replicated.

    The deduper holds a partition at a gap and never skips it on its own; with
    this entry it skips the missing records of ``topic``/``partition`` up to and
    including ``through_offset`` (each skip is logged and counted), and a
    resent copy of any of them that turns up later is dropped as already past.
    """

    topic: str
    """Source topic."""
    partition: Annotated[int, Meta(ge=0)]
    """Source partition."""
    through_offset: Annotated[int, Meta(ge=0)]
    """Last lost offset accepted (inclusive): the end of the gap's ``lost_to`` in the deduper's status."""
    note: str = ""
    """Who acknowledged it and why (kept with the configuration, logged with each skip)."""


class FlowConfig(_Model, frozen=True):
    """One replication flow: topics of a source cluster copied to a target cluster."""

    name: str
    """Flow name; part of internal topic, group and transactional ids."""
    source: str
    """Alias of the source cluster (a key of ``clusters``)."""
    target: str
    """Alias of the target (destination) cluster."""
    topics: list[str] = field(default_factory=lambda: [".*"])
    """Regexes (full match) of source topics to replicate."""
    topics_exclude: list[str] = field(default_factory=lambda: list(DEFAULT_TOPICS_EXCLUDE))
    """Regexes (full match) of source topics never to replicate."""
    naming: NamingConfig = field(default_factory=NamingConfig)
    """How destination topics are named."""
    exactly_once: bool = True
    """Deduplicate and write destination records in Kafka transactions. When false
    the deduper still drops replays it can see but commits without transactions."""
    staging_topic: str | None = None
    """Staging topic on the target; default ``ferryman.<flow>.staging.internal``."""
    staging_partitions: Annotated[int, Meta(ge=1, le=10_000)] = 12
    """Partitions of the staging topic; fixed for the life of the flow (the
    source-partition to staging-partition map depends on it)."""
    start_position: Literal["earliest", "latest"] = "earliest"
    """Where the wrapper starts on a source partition it has never replicated."""
    replicate_topic_configs: bool = True
    """Create destination topics with the source topics' configs (minus the
    broker-specific ones MirrorMaker 2 also excludes)."""
    emit_offset_mappings: bool = True
    """Write the exact source-offset to destination-offset mapping of every
    committed record to ``ferryman.<flow>.offset-map.internal``."""
    on_topic_recreated: Literal["reset", "halt"] = "reset"
    """When a source topic is deleted and re-created (new topic id): ``reset``
    starts its partitions' watermarks again at -1 (loudly); ``halt`` stops
    writing them until an operator intervenes."""
    acknowledged_losses: list[AcknowledgedLoss] = field(default_factory=list)
    """Source records accepted as lost (see the deduper's gaps in ``ferryman status``):
    a gap they cover no longer holds its partition. Empty: every gap holds."""
    replication_factor: Annotated[int, Meta(ge=-1, le=32767)] = -1
    """Replication factor of the destination topics the deduper creates; -1: the broker's
    ``default.replication.factor``. Applies to topics created after a change."""
    topic_configs_exclude: list[str] = field(default_factory=list)
    """Regexes (full match) of source topic configs not copied to created destination topics,
    in addition to the broker-specific ones always left out. Applies to topics created after a change."""
    topic_refresh_interval_s: Annotated[float, Meta(gt=0)] | None = None
    """How often this flow's source topic list is re-read; default ``wrapper.topic_refresh_interval_s``."""
    paused: bool = False
    """Paused: wrappers read nothing from the source (what is in flight is still committed)."""
    sync_group_offsets: bool = False
    """Commit the source consumer groups' translated offsets at the destination (MirrorMaker 2's
    ``sync.group.offsets.enabled``): a group moved there resumes where it stopped at the source. Only
    groups with no members at the destination are written, and an offset never moves back there.
    Needs ``emit_offset_mappings``."""
    groups: list[str] = field(default_factory=lambda: [".*"])
    """Regexes (full match) of consumer groups whose offsets are synced."""
    groups_exclude: list[str] = field(default_factory=lambda: list(DEFAULT_GROUPS_EXCLUDE))
    """Regexes (full match) of consumer groups never synced (Ferryman's own groups never are)."""
    sync_group_offsets_interval_s: Annotated[float, Meta(gt=0)] = 60.0
    """How often group offsets are read at the source and synced."""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise _FieldError("name", "flow name may only contain letters, digits, '.', '_' and '-'")
        for name, patterns in (
            ("topics", self.topics),
            ("topics_exclude", self.topics_exclude),
            ("topic_configs_exclude", self.topic_configs_exclude),
            ("groups", self.groups),
            ("groups_exclude", self.groups_exclude),
        ):
            what = "group" if name.startswith("groups") else "topic"
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise _FieldError(name, f"invalid {what} regex {pattern!r}: {exc}") from exc
        if self.sync_group_offsets and not self.emit_offset_mappings:
            raise _FieldError(
                "sync_group_offsets", "needs emit_offset_mappings (group offsets are translated with the offset map)"
            )


class TlsConfig(_Model, frozen=True):
    """TLS for every gRPC server and client of the project (one set of settings)."""

    cert_file: Path | None = None
    """PEM certificate chain of this process (server cert, or client cert for mTLS)."""
    key_file: Path | None = None
    """PEM private key matching cert_file."""
    ca_file: Path | None = None
    """PEM CA bundle used to verify the peer."""
    require_client_cert: bool = False
    """Servers only: demand and verify a client certificate (mutual TLS)."""
    server_name_override: str | None = None
    """Clients only: expected server name when it differs from the address host (tests)."""

    @property
    def enabled(self) -> bool:
        """True when any TLS material is configured."""
        return any((self.cert_file, self.key_file, self.ca_file))


#: Roles an API token can hold; what each may call is decided in ``ferryman.rpc`` (`required_role`).
TokenRole = Literal["read-only", "admin", "peer"]


class ApiToken(_Model, frozen=True):
    """One bearer token a server accepts, and the role it grants."""

    secret: SecretStr
    """The token itself (``authorization: Bearer <secret>``); never logged or printed."""
    role: TokenRole = "read-only"
    """``read-only``: reads only (Get*, List*, Watch*, Translate* RPCs); ``admin``: every operator
    RPC, reads included; ``peer``: the wrapper-deduper control link only (ControlService)."""


class RpcConfig(_Model, frozen=True):
    """gRPC settings shared by the services, the admin client and the CLI."""

    tls: TlsConfig = field(default_factory=TlsConfig)
    """Transport security; plaintext when nothing is set."""
    auth_token: SecretStr | None = None
    """This process's own bearer token: sent on every call it makes (the wrapper's control link, the
    admin client, the CLI), and accepted by its servers with every role (admin and peer). With neither
    this nor ``tokens`` set, the servers check no token."""
    tokens: dict[str, ApiToken] = field(default_factory=dict)
    """More tokens the servers accept, by name (the name is logged, the secret never), each with its
    role: e.g. ``{ops: {secret: ..., role: read-only}}``, or from the environment
    ``FERRYMAN_RPC__TOKENS__OPS__SECRET`` and ``FERRYMAN_RPC__TOKENS__OPS__ROLE``."""
    connect_backoff_max_s: Annotated[float, Meta(gt=0)] = 10.0
    """Longest wait between reconnect attempts of a control stream."""

    @property
    def auth_enabled(self) -> bool:
        """True when the servers check bearer tokens (``auth_token`` or ``tokens`` set)."""
        return self.auth_token is not None or bool(self.tokens)


class WrapperConfig(_Model, frozen=True):
    """Tuning of the wrapper service (source side)."""

    instance_id: str | None = None
    """Stable identity of this wrapper process. When set it is also the source
    consumer's ``group.instance.id`` (static membership, KIP-345), so a restarted
    wrapper takes its partitions back at once instead of waiting for a rebalance."""
    session_timeout_ms: Annotated[int, Meta(ge=1000)] = 10_000
    """Consumer group session timeout: how long a dead wrapper keeps its partitions."""
    group_id: str | None = None
    """Source consumer group; default ``ferryman-wrapper.<flow>``."""
    consume_batch_size: Annotated[int, Meta(ge=1)] = 10_000
    """Records fetched per consume() call (one Python/C crossing per batch)."""
    poll_timeout_ms: Annotated[int, Meta(ge=1)] = 10
    """Longest wait for records in one consume() call. consume() returns early only
    on a full batch, so at low rates this is added to end-to-end latency."""
    envelope_max_records: Annotated[int, Meta(ge=1)] = 1000
    """Most records packed into one envelope."""
    envelope_max_bytes: Annotated[int, Meta(ge=1024)] = 512 * 1024
    """Target payload size of one envelope (a single larger record still gets its own)."""
    commit_interval_ms: Annotated[int, Meta(ge=10)] = 1000
    """How often acknowledged source offsets are committed to the source cluster. The
    loop does not wait for these commits (a failed one is covered by the next); the
    commits on shutdown, rewind and partition revocation are waited for."""
    topic_refresh_interval_s: Annotated[float, Meta(gt=0)] = 10.0
    """How often the source topic list is re-read to pick up new topics. The reads run
    on a thread of their own, so a source slow to answer does not stop replication."""
    linger_ms: Annotated[int, Meta(ge=0)] = 5
    """Producer linger (librdkafka ``linger.ms``) for staging writes."""
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    """Compression of staging batches."""
    staging_max_message_bytes: Annotated[int, Meta(ge=1024 * 1024)] = 8 * 1024 * 1024
    """``max.message.bytes`` of the staging topic and the producer's
    ``message.max.bytes``; must exceed the largest source record plus envelope overhead."""
    shutdown_timeout_s: Annotated[float, Meta(gt=0)] = 30.0
    """Budget for flushing staging writes and committing on SIGTERM."""
    listen_address: str = "[::]:7450"
    """gRPC listen address of the wrapper (health, reflection, status)."""
    deduper_addresses: list[str] = field(default_factory=list)
    """Control services of the flow's dedupers (host:port). Empty (the default): the wrapper finds
    them in the destination cluster, where each deduper advertises its ``advertised_address``
    (``ferryman.<flow>.dedupers.internal``), links to every live one and follows scale-out."""
    discover_dedupers: bool = True
    """With ``deduper_addresses`` empty, find the dedupers in the destination cluster; ``false``:
    no control link at all (data still flows; gaps are held until their records come back)."""
    progress_interval_s: Annotated[float, Meta(gt=0)] = 2.0
    """How often source progress is sent over the control link."""
    metrics_address: str = "[::]:9450"
    """Prometheus endpoint of the wrapper (``host:port``, served on any path, e.g. ``/metrics``); port 0
    picks a free port, ``""`` turns it off. Values are read from the status snapshot at scrape time."""
    startup_timeout_s: Annotated[float, Meta(gt=0)] = 120.0
    """How long the wrapper waits at start-up for each cluster to answer before it exits
    (code 5, naming the cluster), and then for each start-up step (its internal topics, the flow
    store) to get past a transient fault. Once running, an outage of any length is waited out."""


class DeduperConfig(_Model, frozen=True):
    """Tuning of the deduper service (destination side)."""

    instance_id: str = field(default_factory=socket.gethostname)
    """Stable identity of this deduper process; its transactional.id is
    ``ferryman-deduper.<flow>.<instance_id>``. Two live processes must never share it."""
    group_id: str | None = None
    """Staging consumer group; default ``ferryman-deduper.<flow>``."""
    session_timeout_ms: Annotated[int, Meta(ge=1000)] = 10_000
    """Consumer group session timeout. The instance id is the consumer's
    ``group.instance.id`` (static membership), so a restarted deduper takes its
    partitions back at once; a deduper that is gone for good keeps them this long."""
    consume_batch_size: Annotated[int, Meta(ge=1)] = 500
    """Staging records (envelopes) fetched per consume() call."""
    poll_timeout_ms: Annotated[int, Meta(ge=1)] = 10
    """Longest wait for envelopes in one consume() call (added to latency at low rates)."""
    transaction_interval_ms: Annotated[int, Meta(ge=10)] = 100
    """Commit the open transaction once it is this old: the main term of end-to-end
    latency when caught up (p99 ~260 ms at 40 k records/s here). Kafka transactions
    have a fixed cost each, so they are committed on a time/size budget, never per
    record; while catching up they stretch to 3x the last commit's duration (1 s at most)."""
    transaction_max_records: Annotated[int, Meta(ge=1)] = 200_000
    """Commit the open transaction once it holds this many destination records."""
    transaction_timeout_ms: Annotated[int, Meta(ge=1000)] = 60_000
    """librdkafka ``transaction.timeout.ms``: the coordinator aborts a transaction
    older than this. Must exceed interval + worst-case commit time; read_committed
    readers of the destination wait at most this long behind a stuck transaction."""
    operation_timeout_s: Annotated[float, Meta(gt=0)] = 30.0
    """Budget for one flush/commit/abort call including retries (a rebuilt producer's init_transactions: 4x;
    at start-up ``startup_timeout_s``). Each
    attempt has a 3 s librdkafka timeout and a deadline that holds (a watchdog abandons and
    replaces a producer whose call overruns it); a budget that runs out rewinds to the last
    commit and retries with backoff, it never stops the deduper."""
    linger_ms: Annotated[int, Meta(ge=0)] = 5
    """Producer linger for destination writes (librdkafka's default), with or without
    transactions. A transaction's records stream to the broker while it is open, so
    the commit's flush waits for the last linger's worth only. Lingering until the
    commit (the default before: the transaction interval) made the commit send the
    whole transaction, and the loop stopped for it: at 300 k rec/s paced, commits of
    ~95 ms (a ~55 ms flush) against ~40 ms (a 3-8 ms flush), and end-to-end p99 575-579 ms
    against 369-466, with the same CPU in bulk (see docs/notes.md, session 16)."""
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    """Compression of destination batches. ``none`` like Kafka's producer and
    MirrorMaker 2: the destination broker is near, and compressing costs the
    deduper and the broker (which decompresses to validate) CPU per record. A
    destination topic whose ``compression.type`` config is set (replicated from
    the source) is compressed by the broker either way."""
    max_message_bytes: Annotated[int, Meta(ge=1024 * 1024)] = 8 * 1024 * 1024
    """Producer ``message.max.bytes``; the destination topic's own limit still applies."""
    direct_produce: bool = True
    """Hand destination records to librdkafka without a ``produce()`` call each
    (``ferryman.rowproduce``; the same records, about half the deduper's CPU per
    record) where this build and this confluent-kafka allow it; ``false``: call
    ``produce()`` per record. The deduper logs which path it runs."""
    listen_address: str = "[::]:7460"
    """gRPC listen address of the deduper (control service, health, reflection, status)."""
    advertised_address: str | None = None
    """host:port at which wrappers reach this deduper's gRPC server, advertised in the destination
    cluster (``ferryman.<flow>.dedupers.internal``) so that wrappers without ``deduper_addresses``
    find it, as Kafka's ``advertised.listeners``. Default: the listen address, with the host name
    for a wildcard host (``[::]``, ``0.0.0.0``) and the bound port for port 0."""
    advertise_interval_s: Annotated[float, Meta(gt=0)] = 5.0
    """How often the advertisement is rewritten (a heartbeat); wrappers drop a deduper whose last
    one is older than 3 intervals and whose link is down, so a crashed deduper's address is left
    within ~15 s, while a destination outage (no heartbeats written) keeps links that are up."""
    metrics_address: str = "[::]:9460"
    """Prometheus endpoint of the deduper (``host:port``, served on any path, e.g. ``/metrics``); port 0
    picks a free port, ``""`` turns it off. Values are read from the status snapshot at scrape time."""
    watermark_interval_s: Annotated[float, Meta(gt=0)] = 1.0
    """How often committed watermarks are sent to connected wrappers."""
    backpressure_max_staging_lag: Annotated[int, Meta(ge=1)] = 200_000
    """Pause wrappers when this many staging records wait to be deduplicated."""
    resend_retry_s: Annotated[float, Meta(gt=0)] = 10.0
    """Ask again for a gap's records if they have not arrived after this long."""
    startup_timeout_s: Annotated[float, Meta(gt=0)] = 120.0
    """How long the deduper waits at start-up for the destination cluster to answer before it
    exits (code 5, naming the cluster), and then for each start-up step (the brokers' settings,
    its internal topics, the flow store, init_transactions) to get past a transient fault. Once
    running, an outage of any length is waited out."""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.instance_id):
            raise _FieldError("instance_id", "instance_id may only contain letters, digits, '.', '_' and '-'")


class AuditorConfig(_Model, frozen=True):
    """The audit scheduler (``ferryman audit schedule``): how often a flow is audited, how it stops."""

    interval_s: Annotated[float, Meta(gt=0)] = 300.0
    """Time from the start of one scheduled audit to the start of the next (a run that takes
    longer is followed at once, never overlapped). Each run checks only what was committed
    since the last verified position, so a shorter interval means smaller runs, not more work."""
    shutdown_timeout_s: Annotated[float, Meta(ge=0)] = 30.0
    """On SIGTERM, how long a run in progress may take to finish and store its results before
    its Spark job is cancelled and the run abandoned (nothing of it stored: the next run checks
    that range again)."""
    listen_address: str = ""
    """``host:port`` of the scheduler's gRPC admin API (``AuditService``: start, follow and read
    audits; TLS and tokens as ``rpc`` says). Empty: no API (the default, as the API starts Spark
    jobs on the scheduler's session); port 0 picks a free port."""


class TracingConfig(_Model, frozen=True):
    """OpenTelemetry traces that follow each sampled record through both services.

    The standard ``OTEL_*`` variables (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``,
    ``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``/``PROTOCOL``,
    ``OTEL_EXPORTER_ZIPKIN_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_SDK_DISABLED``) override the
    file; ``FERRYMAN_TRACING__*`` variables override both.
    """

    enabled: bool = False
    """Trace sampled records and gRPC calls. Off: no span is created and replication is byte for
    byte. ``OTEL_TRACES_EXPORTER`` set to an exporter (not ``none``) turns it on."""
    sampler: Literal[
        "parentbased_traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "traceidratio",
        "always_on",
        "always_off",
    ] = "parentbased_traceidratio"
    """Which records are traced. ``parentbased_*``: a source record whose ``traceparent`` header
    is sampled joins its trace, one marked unsampled is not traced, and records without one are
    traced at ``sampler_ratio`` (``*_always_on``: all, ``*_always_off``: none). Without
    ``parentbased``, the ratio (or always on/off) decides for every record; a traced record with
    a ``traceparent`` still joins its trace. gRPC calls follow the same sampler."""
    sampler_ratio: Annotated[float, Meta(ge=0, le=1)] = 0.0001
    """Share of records (without sampled trace context) that start a trace (``OTEL_TRACES_SAMPLER_ARG``).
    A traced record costs both services ~10 µs of tracing code in the pipeline (its spans and their export;
    ~2 µs for an untraced record), so 1 in 10 000 adds about a nanosecond per record (README "Operations:
    tracing")."""
    exporter: Literal["otlp-grpc", "otlp-http", "zipkin", "console", "file"] = "console"
    """Where spans go: OTLP over gRPC or HTTP, Zipkin's JSON API, the console (stdout) or a file."""
    endpoint: str = ""
    """Exporter address; empty: its standard default (``http://localhost:4317`` for otlp-grpc,
    ``http://localhost:4318/v1/traces`` for otlp-http, ``http://localhost:9411/api/v2/spans`` for zipkin)."""
    file_path: Path = Path("ferryman-spans.jsonl")
    """File the ``file`` exporter appends spans to (one JSON object per line)."""
    service_name: str = ""
    """``service.name`` of the spans; empty: ``ferryman-wrapper`` / ``ferryman-deduper``."""
    ui_url_template: str = "http://localhost:9411/zipkin/traces/{trace_id}"
    """Link to a trace in the tracing UI (``ferryman trace`` prints it); ``{trace_id}`` is replaced."""
    max_links: Annotated[int, Meta(ge=0, le=1000)] = 64
    """Most links a transaction-commit or resend span keeps to the sampled records it carries."""
    export_timeout_s: Annotated[float, Meta(gt=0)] = 5.0
    """Budget for flushing spans at shutdown (after the services' drain)."""

    def __post_init__(self) -> None:
        if "{trace_id}" not in self.ui_url_template:
            raise _FieldError("ui_url_template", "ui_url_template must contain {trace_id}")


class FerrymanConfig(_Model, frozen=True):
    """Everything a Ferryman service needs to run."""

    clusters: dict[str, ClusterConfig]
    """Clusters by alias."""
    flows: list[FlowConfig]
    """Replication flows."""
    wrapper: WrapperConfig = field(default_factory=WrapperConfig)
    """Wrapper tuning."""
    deduper: DeduperConfig = field(default_factory=DeduperConfig)
    """Deduper tuning."""
    rpc: RpcConfig = field(default_factory=RpcConfig)
    """gRPC transport security and authentication."""
    auditor: AuditorConfig = field(default_factory=AuditorConfig)
    """Audit scheduler settings."""
    tracing: TracingConfig = field(default_factory=TracingConfig)
    """OpenTelemetry tracing of records and gRPC calls."""

    def __post_init__(self) -> None:
        names = [f.name for f in self.flows]
        if len(names) != len(set(names)):
            raise ValueError(f"flow names must be unique, got {names}")
        for flow in self.flows:
            for role, alias in (("source", flow.source), ("target", flow.target)):
                if alias not in self.clusters:
                    raise ValueError(
                        f"flow {flow.name!r}: {role} cluster {alias!r} is not defined in clusters "
                        f"(defined: {sorted(self.clusters)})"
                    )
            if flow.source == flow.target and flow.naming.policy == "identity" and not flow.naming.rename:
                raise ValueError(f"flow {flow.name!r}: identity naming onto the same cluster would loop")

    def flow(self, name: str | None) -> FlowConfig:
        """Return the named flow, or the only flow when name is None."""
        if name is None:
            if len(self.flows) != 1:
                raise ConfigError(
                    f"the configuration has {len(self.flows)} flows; choose one with --flow "
                    f"({', '.join(f.name for f in self.flows) or 'none defined'})"
                )
            return self.flows[0]
        for f in self.flows:
            if f.name == name:
                return f
        raise ConfigError(f"no flow named {name!r} (flows: {', '.join(f.name for f in self.flows)})")


#: kafka-reo's environment variables that make a complete one-topic flow.
SEED_ENV = (
    "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS",
    "KAFKA_CLUSTERS_SOURCE_TOPIC",
    "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS",
    "KAFKA_CLUSTERS_DESTINATION_TOPIC",
)


def _seed_config(env: Mapping[str, str]) -> dict[str, Any] | None:
    present = [k for k in SEED_ENV if env.get(k)]
    if not present:
        return None
    missing = [k for k in SEED_ENV if not env.get(k)]
    if missing:
        raise ConfigError(f"kafka-reo style configuration is incomplete: missing {', '.join(missing)}")
    src_topic = env["KAFKA_CLUSTERS_SOURCE_TOPIC"]
    dst_topic = env["KAFKA_CLUSTERS_DESTINATION_TOPIC"]
    flow: dict[str, Any] = {
        "name": env.get("APPLICATION_NAME") or "exactly-once-replicator",
        "source": "source",
        "target": "destination",
        "topics": [re.escape(src_topic)],
        "topics_exclude": [],
        "naming": {"policy": "identity", "rename": {src_topic: dst_topic}},
    }
    if env.get("KAFKA_CLUSTERS_DESTINATION_TOPIC_PROXY"):
        flow["staging_topic"] = env["KAFKA_CLUSTERS_DESTINATION_TOPIC_PROXY"]
    return {
        "clusters": {
            "source": {"bootstrap_servers": env["KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS"]},
            "destination": {"bootstrap_servers": env["KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS"]},
        },
        "flows": [flow],
    }


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> FerrymanConfig:
    """Build the configuration from a YAML file and/or the environment.

    Args:
        path: YAML file, or None to configure from the environment alone.
        env: environment to read (defaults to ``os.environ``).

    Raises:
        ConfigError: with a message naming the offending field.
    """
    env = os.environ if env is None else env
    data: dict[str, Any]
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
    else:
        seed = _seed_config(env)
        if seed is None:
            raise ConfigError(
                "no configuration: pass --config FILE (or set FERRYMAN_CONFIG), or set " + ", ".join(SEED_ENV)
            )
        data = seed
    apply_otel_env(data, env)
    apply_env_overrides(data, env, FerrymanConfig)
    try:
        return parse_config(data)
    except ConfigError as exc:
        where = f"config file {path}" if path else "environment configuration"
        raise ConfigError(f"invalid {where}:\n  {exc}") from exc


def parse_config(data: Mapping[str, Any]) -> FerrymanConfig:
    """The configuration in data (plain values, as YAML gives them), validated.

    Raises:
        ConfigError: naming the first offending field (``flows.0.staging_partitions: ...``).
    """
    try:
        return validated(FerrymanConfig, data)
    except ConfigError:
        # msgspec does not say which key of a mapping held the bad value: if a
        # cluster did, checking them one by one names its alias.
        clusters = data.get("clusters")
        if isinstance(clusters, Mapping):
            for alias, cluster in clusters.items():
                validated(ClusterConfig, cluster, at=("clusters", str(alias)))
        raise


def validated(kind: type[_M], data: object, *, at: tuple[str, ...] = ()) -> _M:
    """Validate data (plain values) as a kind of configuration model, checking every constraint.

    Strings are accepted where numbers and booleans are expected (environment
    overrides are strings). Building a model directly skips its numeric bounds;
    anything read from outside goes through here.

    Raises:
        ConfigError: ``<path>: <problem>``, the path relative to the top of data plus ``at``.
    """
    try:
        return msgspec.convert(data, kind, strict=False, dec_hook=_decode_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(_describe(exc, at)) from exc


#: msgspec's "<problem> - at `$.a[0].b`"; the path is absent at the top level.
_AT_RE = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_PATH_PART_RE = re.compile(r"\.([^.\[]+)|\[([^\]]+)\]")
#: Object-level problems, restated as problems of the field they name.
_FIELD_PROBLEMS = (
    (re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$"), "unknown field"),
    (re.compile(r"^Object missing required field `(?P<field>[^`]*)`$"), "field required"),
)


def _describe(exc: msgspec.ValidationError, at: tuple[str, ...]) -> str:
    match = _AT_RE.match(str(exc))
    problem, raw_path = (match["problem"], match["path"] or "") if match else (str(exc), "")
    path = list(at)
    for name, index in _PATH_PART_RE.findall(raw_path):
        if index == "...":  # a mapping's value; msgspec does not say which key
            path[-1] += "[...]"
        else:
            path.append(name or index)
    for pattern, restated in _FIELD_PROBLEMS:
        named = pattern.match(problem)
        if named:
            path.append(named["field"])
            problem = restated
    if isinstance(exc.__cause__, _FieldError):
        path.append(exc.__cause__.field)
    return f"{'.'.join(path)}: {problem}" if path else problem


def _decode_hook(kind: type, value: object) -> object:
    """The two field types msgspec does not build itself, from the strings YAML gives."""
    if kind not in (Path, SecretStr):
        raise TypeError(f"no conversion to {kind.__name__}")  # no field of the models has such a type
    if not isinstance(value, str):
        raise TypeError(f"Expected `str`, got `{type(value).__name__}`")  # msgspec adds the path
    return kind(value)
