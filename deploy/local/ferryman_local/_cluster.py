"""Single-node Apache Kafka (KRaft) clusters on loopback, started from the cached jars."""

from __future__ import annotations

import base64
import functools
import json
import logging
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ferryman_local._broker import (
    BrokerProcess,
    brokers_listed,
    discard_data_at_exit,
    groups_ready,
    port_open,
    transactions_ready,
    wait_ready,
)
from ferryman_local._errors import ClusterStartError, HarnessError
from ferryman_local._maven import KAFKA_VERSION, ensure_kafka_jars
from ferryman_local._ports import reserve_port
from ferryman_local._sasl import SaslPlain

_log = logging.getLogger("ferryman_local")

SINGLE_NODE_PROPERTIES: Mapping[str, str] = {
    # One node: every internal topic at replication factor 1 / min ISR 1.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    # 4 instead of 50 partitions: creating and loading them is most of the first
    # transaction's latency on 2 cores.
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    # Groups form at once instead of waiting 3 s for more members.
    "group.initial.rebalance.delay.ms": "0",
    # Topics exist only when a test or Ferryman creates them (as in production).
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    # The cleaner re-checks every 0.5 s instead of 15 s, so compaction tests are quick.
    "log.cleaner.backoff.ms": "500",
    # Retention runs every second, starting 1 s after boot (default: every 5 min after 30 s),
    # so tests that need records deleted from a source wait seconds, not minutes.
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "1000",
    # After a SIGKILL the restarted broker may register only once its previous incarnation's
    # session has expired (default 9 s); 5 s with heartbeats every second (default 2 s) keeps
    # crash tests quick and still tolerates four missed heartbeats on a busy 2-core machine.
    "broker.session.timeout.ms": "5000",
    "broker.heartbeat.interval.ms": "1000",
    # 2-core machines: fewer threads than the defaults (3 network, 8 I/O).
    "num.network.threads": "2",
    "num.io.threads": "4",
    # Index files of 256 KiB instead of 10 MiB (a segment then rolls after ~85 MiB of log). The broker
    # memory-maps them sparse; a first entry faults, and the kernel zero-fills as far around it as the
    # block device reads ahead (8 MiB on the VMs here): at 10 MiB, 16 MiB of page cache per new partition,
    # most of the broker's CPU at 1,000 partitions (docs/notes.md, "Index files and read-ahead").
    "log.index.size.max.bytes": str(256 * 1024),
}
"""Broker settings every local cluster gets (extra properties override them)."""

_STATE_FILE = "cluster.json"
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class _ClusterState:
    """What must stay the same across restarts of one cluster, persisted in its work dir."""

    name: str
    cluster_id: str
    """KRaft cluster id, written into the storage by ``StorageTool format``."""
    port: int
    """PLAINTEXT (client) listener port on 127.0.0.1."""
    controller_port: int
    """CONTROLLER listener port; KRaft stores it in the voter set, so it must not change."""
    kafka_version: str

    @classmethod
    def load(cls, path: Path) -> _ClusterState:
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(
            name=str(data["name"]),
            cluster_id=str(data["cluster_id"]),
            port=int(data["port"]),
            controller_port=int(data["controller_port"]),
            kafka_version=str(data["kafka_version"]),
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 characters)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka's own Uuid.randomUuid() avoids these: they read as CLI flags
            return cid


@dataclass(frozen=True)
class ProxiedListener:
    """A second client listener (``PROXIED``) whose advertised address is a proxy's, for fault injection.

    Kafka clients learn broker addresses from metadata, so a proxy in front of a broker is only on
    the path of every request if the broker advertises the proxy's address. Clients that bootstrap
    through the proxy get the ``PROXIED`` addresses back; everyone else (inter-broker traffic,
    clients on the ``PLAINTEXT`` port) stays on the direct path.
    """

    port: int
    """Port the broker binds the ``PROXIED`` listener to on 127.0.0.1 (the proxy's upstream)."""
    advertised_port: int
    """Port advertised for it on 127.0.0.1: where the proxy listens."""


def broker_properties(
    *,
    port: int,
    controller_port: int,
    data_dir: Path,
    extra: Mapping[str, str] | None = None,
    proxied: ProxiedListener | None = None,
    sasl: SaslPlain | None = None,
) -> dict[str, str]:
    """The ``server.properties`` of a one-node cluster (broker and controller in one process).

    Args:
        port: client (PLAINTEXT) listener port on 127.0.0.1.
        controller_port: KRaft controller listener port on 127.0.0.1.
        data_dir: the broker's ``log.dirs`` (also holds the KRaft metadata log).
        extra: properties that override or add to the defaults.
        proxied: a second client listener advertised at a proxy's address (none by default).
        sasl: users and ACLs (``SaslPlain``): the listeners take SASL/PLAIN logins instead of anonymous clients.

    Returns:
        Property names to values, in file order.
    """
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}"
    advertised = f"PLAINTEXT://127.0.0.1:{port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    if proxied is not None:
        if sasl is not None:
            raise HarnessError("a cluster with SASL users has no PROXIED listener (not needed so far)")
        listeners += f",PROXIED://127.0.0.1:{proxied.port}"
        advertised += f",PROXIED://127.0.0.1:{proxied.advertised_port}"
        protocols += ",PROXIED:PLAINTEXT"
    security = {} if sasl is None else sasl.broker_properties(port, controller_port)
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        "log.dirs": str(data_dir),
        **security,
        **SINGLE_NODE_PROPERTIES,
        **dict(extra or {}),
    }


class LocalCluster:
    """One single-node KRaft cluster (broker and controller in one JVM) on 127.0.0.1.

    Create it with ``LocalCluster.start(name)``. ``stop()`` shuts it down in
    order, ``kill()`` crashes it (SIGKILL), ``restart()`` brings it back on the
    same ports with the same data. Used as a context manager it stops on exit.

    The work dir holds ``server.properties``, ``cluster.json`` (id and ports,
    so the same dir can be started again later), ``data/`` and the logs:
    ``stdout.log`` (JVM output) and ``logs/server.log`` (broker log, WARN and up).
    The JVM never outlives the Python process that started it.

    Attributes:
        name: a label for humans (log lines, ``clusters.json``).
        bootstrap_servers: ``127.0.0.1:<port>``, for ``bootstrap.servers``.
        cluster_id: the KRaft cluster id, as ``AdminClient.describe_cluster()`` reports it.
        work_dir: data, configuration and logs of this cluster.
    """

    def __init__(
        self,
        state: _ClusterState,
        work_dir: Path,
        jars: Path,
        extra_properties: Mapping[str, str] | None,
        sasl: SaslPlain | None = None,
    ) -> None:
        """Use ``LocalCluster.start``; this only holds the parts together."""
        self.sasl = sasl
        """The cluster's users when it takes SASL/PLAIN logins and enforces ACLs (``start(..., sasl=...)``)."""
        self.name = state.name
        self.bootstrap_servers = f"127.0.0.1:{state.port}"
        self.cluster_id = state.cluster_id
        self.work_dir = work_dir
        self._state = state
        self._extra = dict(extra_properties or {})
        self._broker = BrokerProcess(state.name, work_dir, jars, port=state.port, controller_port=state.controller_port)
        self._lock = threading.RLock()

    @classmethod
    def start(
        cls,
        name: str,
        *,
        work_dir: Path | None = None,
        extra_properties: Mapping[str, str] | None = None,
        ready_timeout_s: float = 90.0,
        sasl: SaslPlain | None = None,
    ) -> LocalCluster:
        """Start a cluster and return once it serves metadata, groups and transactions.

        A fresh work dir is formatted with a new cluster id and new ports; a work
        dir that already holds a cluster (``cluster.json``) starts that cluster
        again with its id, ports and data. A temp work dir (no ``work_dir``
        given) loses its ``data/`` when the Python process exits; its logs stay
        for post-mortems.

        Args:
            name: label of the cluster, letters, digits, ``.``, ``_`` and ``-``.
            work_dir: where data, configuration and logs go; default a new temp dir.
            extra_properties: broker properties added to or overriding
                ``SINGLE_NODE_PROPERTIES``.
            ready_timeout_s: budget for the JVM start and the readiness probes
                (jar resolution and storage formatting come before it).
            sasl: users, for a cluster that takes only SASL/PLAIN logins and enforces ACLs with
                KRaft's ``StandardAuthorizer`` (``SaslPlain``; clients use ``client_config(user)``).
                Give it again when starting the same work dir again.

        Returns:
            The running cluster.

        Raises:
            ToolMissingError: ``java`` or ``mvn`` is not installed.
            JarResolutionError: the Kafka jars could not be resolved.
            ClusterStartError: formatting failed, or the broker exited or was not
                ready in time (the message ends with its log tail).
        """
        check_cluster_name(name)
        jars = ensure_kafka_jars()
        temporary = work_dir is None
        wd = (work_dir or Path(tempfile.mkdtemp(prefix=f"ferryman-{name}-"))).resolve()
        wd.mkdir(parents=True, exist_ok=True)
        state_file = wd / _STATE_FILE
        if state_file.exists():
            state = _ClusterState.load(state_file)
            check_kafka_version(state.kafka_version, wd)
            state = _ClusterState(name, state.cluster_id, state.port, state.controller_port, state.kafka_version)
        elif (wd / "data" / "meta.properties").exists():
            raise ClusterStartError(f"{wd} holds Kafka data but no {_STATE_FILE}; delete it or pick another dir")
        else:
            state = _ClusterState(name, new_cluster_id(), reserve_port(), reserve_port(), KAFKA_VERSION)
        cluster = cls(state, wd, jars, extra_properties, sasl)
        if temporary:
            discard_data_at_exit(cluster._broker)
        cluster._write_config()
        format_start = time.monotonic()
        cluster._broker.format(cluster.cluster_id, ["--standalone"])
        _log.info("%s: storage ready in %.1fs", name, time.monotonic() - format_start)
        state.save(state_file)
        try:
            cluster._broker.launch()
            cluster._wait_ready(ready_timeout_s)
        except BaseException:
            cluster.kill()
            raise
        return cluster

    @property
    def pid(self) -> int | None:
        """Process id of the broker JVM while it runs, else None."""
        return self._broker.pid

    @property
    def server_log(self) -> Path:
        """The broker's log file (WARN and above, plus start-up and shutdown lines)."""
        return self._broker.server_log

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs``: every topic's data and the KRaft metadata log."""
        return self._broker.data_dir

    @property
    def properties_path(self) -> Path:
        """The broker's ``server.properties``."""
        return self._broker.properties_path

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut the broker down in order (SIGTERM), SIGKILL after timeout_s. Idempotent.

        Args:
            timeout_s: how long the controlled shutdown may take.
        """
        with self._lock:
            self._broker.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would. Idempotent."""
        with self._lock:
            self._broker.kill()

    def restart(self, ready_timeout_s: float = 90.0) -> None:
        """Stop the broker if it runs, then start it on the same ports with the same data.

        Args:
            ready_timeout_s: budget for the JVM start and the readiness probes.

        Raises:
            ClusterStartError: the broker exited or was not ready in time.
        """
        with self._lock:
            self.stop()
            self._write_config()
            self._broker.launch()
            self._wait_ready(ready_timeout_s)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster(name={self.name!r}, bootstrap_servers={self.bootstrap_servers!r}, pid={self.pid})"

    # -- internals -------------------------------------------------------------------------------

    def _write_config(self) -> None:
        self._broker.write_config(
            broker_properties(
                port=self._state.port,
                controller_port=self._state.controller_port,
                data_dir=self.data_dir,
                extra=self._extra,
                sasl=self.sasl,
            )
        )

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """The librdkafka settings of a client of this cluster (bootstrap servers and the login of user).

        On a cluster with SASL users, user logs in (default: the super user); on one without, user is None.

        Raises:
            HarnessError: a user named on a cluster without SASL users, or not one of its users.
        """
        if self.sasl is None:
            if user is not None:
                raise HarnessError(f"{self.name} has no SASL users (start it with sasl=SaslPlain(...))")
            return {"bootstrap.servers": self.bootstrap_servers}
        return {"bootstrap.servers": self.bootstrap_servers, **self.sasl.client_config(user)}

    def _wait_ready(self, timeout_s: float) -> None:
        """Wait until the listener, metadata, the transaction and the group coordinator all answer."""
        bootstrap = self.bootstrap_servers
        login = {} if self.sasl is None else self.sasl.client_config()
        wait_ready(
            self.name,
            [
                ("client port accepts connections", functools.partial(port_open, self._state.port)),
                (
                    "metadata lists the broker",
                    functools.partial(brokers_listed, bootstrap, self.cluster_id, [1], client=login),
                ),
                # The first transaction and the first group create and load __transaction_state and
                # __consumer_offsets; doing it here keeps that cost (and its flakiness) out of the tests.
                ("transaction coordinator serves", functools.partial(transactions_ready, bootstrap, client=login)),
                ("group coordinator serves", functools.partial(groups_ready, bootstrap, client=login)),
            ],
            [self._broker],
            timeout_s,
        )


def check_cluster_name(name: str) -> None:
    """Raise HarnessError unless name is usable in paths and log lines."""
    if not _NAME_RE.fullmatch(name):
        raise HarnessError(f"cluster name {name!r}: use letters, digits, '.', '_' and '-' only")


def check_kafka_version(version: str, work_dir: Path) -> None:
    """Raise ClusterStartError if the cluster in work_dir was made by another Kafka release than this harness runs."""
    if version != KAFKA_VERSION:
        raise ClusterStartError(
            f"{work_dir} holds a Kafka {version} cluster; this harness runs {KAFKA_VERSION}. "
            "Delete the directory to start afresh."
        )


def start_clusters(
    names: Sequence[str],
    *,
    base_dir: Path | None = None,
    extra_properties: Mapping[str, str] | None = None,
    ready_timeout_s: float = 90.0,
) -> list[LocalCluster]:
    """Start several separate clusters concurrently (each spends seconds in JVM start-up).

    Args:
        names: one cluster per name, distinct.
        base_dir: if given, cluster ``n`` lives in ``base_dir / n`` (and a cluster
            already there starts again with its data); default temp dirs.
        extra_properties: broker properties for every cluster.
        ready_timeout_s: per-cluster readiness budget, see ``LocalCluster.start``.

    Returns:
        The running clusters, in the order of names.

    Raises:
        HarnessError: a cluster failed to start; the ones that did start are stopped.
    """
    if len(set(names)) != len(names):
        raise HarnessError(f"cluster names must be distinct: {list(names)}")
    if not names:
        return []
    ensure_kafka_jars()  # once, here, rather than racing for the lock in every thread

    def one(name: str) -> LocalCluster:
        return LocalCluster.start(
            name,
            work_dir=None if base_dir is None else base_dir / name,
            extra_properties=extra_properties,
            ready_timeout_s=ready_timeout_s,
        )

    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="ferryman-local-start") as pool:
        futures = [pool.submit(one, n) for n in names]
        clusters: list[LocalCluster] = []
        errors: list[BaseException] = []
        for f in futures:
            try:
                clusters.append(f.result())
            except BaseException as exc:  # collect every failure, clean up, then raise the first
                errors.append(exc)
    if errors:
        for c in clusters:
            c.stop()
        for extra in errors[1:]:
            _log.error("another cluster failed to start too: %s", extra)
        raise errors[0]
    return clusters
