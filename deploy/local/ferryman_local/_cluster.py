"""Single-node Apache Kafka (KRaft) clusters on loopback, started from the cached jars."""

from __future__ import annotations

import atexit
import base64
import json
import logging
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ferryman_local import _process
from ferryman_local._errors import ClusterStartError, HarnessError
from ferryman_local._maven import KAFKA_VERSION, ensure_kafka_jars, require_tool
from ferryman_local._ports import port_free, reserve_port

_log = logging.getLogger("ferryman_local")
# librdkafka's own log lines (connection refused while a broker starts, "coordinator load in
# progress") go to Python logging instead of stderr.
_client_log = logging.getLogger("ferryman_local.librdkafka")

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
}
"""Broker settings every local cluster gets (extra properties override them)."""

JVM_OPTIONS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
"""JVM flags of a broker: a small fixed heap (~400 MB RSS), the single-threaded collector (2 cores),
and the C1 compiler only. A local cluster lives for minutes, and C2 never finishes warming up in that
time: on a 2-core machine, after a dozen 1 M-record copies, C2 compilation was still a third of the
destination broker's CPU (25 CPU s in its first 11 minutes), landing on whatever was running. C1 compiled
for under 1 CPU s over the same work, and the destination broker took 1.4-1.5 CPU s per million
records copied by Ferryman instead of 2.4-3.9 (see docs/notes.md, session 8)."""

_STATE_FILE = "cluster.json"
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
# How often readiness is re-probed while a broker starts (~3.5 s); short, the probes are cheap.
_PROBE_INTERVAL_S = 0.2
# A single probe (TCP connect, metadata request) may take this long before it counts as failed.
_PROBE_TIMEOUT_S = 5.0
_LOG_TAIL_CHARS = 4000


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


def broker_properties(
    *, port: int, controller_port: int, data_dir: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The ``server.properties`` of a one-node cluster (broker and controller in one process).

    Args:
        port: client (PLAINTEXT) listener port on 127.0.0.1.
        controller_port: KRaft controller listener port on 127.0.0.1.
        data_dir: the broker's ``log.dirs`` (also holds the KRaft metadata log).
        extra: properties that override or add to the defaults.

    Returns:
        Property names to values, in file order.
    """
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
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
        self, state: _ClusterState, work_dir: Path, jars: Path, extra_properties: Mapping[str, str] | None
    ) -> None:
        """Use ``LocalCluster.start``; this only holds the parts together."""
        self.name = state.name
        self.bootstrap_servers = f"127.0.0.1:{state.port}"
        self.cluster_id = state.cluster_id
        self.work_dir = work_dir
        self._state = state
        self._jars = jars
        self._extra = dict(extra_properties or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    @classmethod
    def start(
        cls,
        name: str,
        *,
        work_dir: Path | None = None,
        extra_properties: Mapping[str, str] | None = None,
        ready_timeout_s: float = 90.0,
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

        Returns:
            The running cluster.

        Raises:
            ToolMissingError: ``java`` or ``mvn`` is not installed.
            JarResolutionError: the Kafka jars could not be resolved.
            ClusterStartError: formatting failed, or the broker exited or was not
                ready in time (the message ends with its log tail).
        """
        if not _NAME_RE.fullmatch(name):
            raise HarnessError(f"cluster name {name!r}: use letters, digits, '.', '_' and '-' only")
        jars = ensure_kafka_jars()
        temporary = work_dir is None
        wd = (work_dir or Path(tempfile.mkdtemp(prefix=f"ferryman-{name}-"))).resolve()
        wd.mkdir(parents=True, exist_ok=True)
        state_file = wd / _STATE_FILE
        if state_file.exists():
            state = _ClusterState.load(state_file)
            if state.kafka_version != KAFKA_VERSION:
                raise ClusterStartError(
                    f"{wd} holds a Kafka {state.kafka_version} cluster; this harness runs {KAFKA_VERSION}. "
                    "Delete the directory to start afresh."
                )
            state = _ClusterState(name, state.cluster_id, state.port, state.controller_port, state.kafka_version)
        elif (wd / "data" / "meta.properties").exists():
            raise ClusterStartError(f"{wd} holds Kafka data but no {_STATE_FILE}; delete it or pick another dir")
        else:
            state = _ClusterState(name, new_cluster_id(), reserve_port(), reserve_port(), KAFKA_VERSION)
        cluster = cls(state, wd, jars, extra_properties)
        if temporary:
            with _temporary_lock:
                _temporary.append(cluster)
        cluster._write_config()
        format_start = time.monotonic()
        cluster._format()
        _log.info("%s: storage ready in %.1fs", name, time.monotonic() - format_start)
        state.save(state_file)
        try:
            cluster._launch()
            cluster._wait_ready(ready_timeout_s)
        except BaseException:
            cluster.kill()
            raise
        return cluster

    @property
    def pid(self) -> int | None:
        """Process id of the broker JVM while it runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def server_log(self) -> Path:
        """The broker's log file (WARN and above, plus start-up and shutdown lines)."""
        return self.work_dir / "logs" / "server.log"

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs``: every topic's data and the KRaft metadata log."""
        return self.work_dir / "data"

    @property
    def properties_path(self) -> Path:
        """The broker's ``server.properties``."""
        return self.work_dir / "server.properties"

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut the broker down in order (SIGTERM), SIGKILL after timeout_s. Idempotent.

        Args:
            timeout_s: how long the controlled shutdown may take.
        """
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            _process.signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning("%s: no clean shutdown within %.0fs; killing it", self.name, timeout_s)
                self.kill()
            _process.forget(proc)

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would. Idempotent."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            _process.signal_group(proc, signal.SIGKILL)
            proc.wait()  # SIGKILL cannot be ignored; this reaps it at once
            _process.forget(proc)

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
            self._launch()
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
        props = broker_properties(
            port=self._state.port,
            controller_port=self._state.controller_port,
            data_dir=self.data_dir,
            extra=self._extra,
        )
        self.properties_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        log4j = resources.files("ferryman_local").joinpath("kafka", "log4j2.xml").read_bytes()
        (self.work_dir / "log4j2.xml").write_bytes(log4j)
        (self.work_dir / "logs").mkdir(exist_ok=True)

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            require_tool("java"),
            *JVM_OPTIONS,
            f"-Dkafka.logs.dir={self.work_dir / 'logs'}",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.xml'}",
            "-cp",
            f"{self._jars}/*",
            main,
            *args,
        ]

    def _format(self) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cmd = self._java(
            "kafka.tools.StorageTool", "format", "--standalone", "-t", self.cluster_id, "-c", str(self.properties_path)
        )
        # A short-lived tool: plain subprocess.run, no process-group bookkeeping needed.
        result = subprocess.run(cmd, cwd=self.work_dir, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-_LOG_TAIL_CHARS:]
            raise ClusterStartError(f"formatting the storage of {self.name} failed:\n{output}")

    def _launch(self) -> None:
        busy = [p for p in (self._state.port, self._state.controller_port) if not port_free(p)]
        if busy:
            # Checked up front: otherwise the readiness probes could talk to whatever holds the port.
            raise ClusterStartError(
                f"{self.name}: port(s) {busy} on 127.0.0.1 are in use; is this cluster ({self.work_dir}) "
                "already running in another process?"
            )
        with (self.work_dir / "stdout.log").open("ab") as out:
            self._proc = _process.spawn(
                self._java("kafka.Kafka", str(self.properties_path)), cwd=self.work_dir, output=out
            )
        _log.info(
            "%s: broker pid %d on %s, work dir %s", self.name, self._proc.pid, self.bootstrap_servers, self.work_dir
        )

    def _wait_ready(self, timeout_s: float) -> None:
        """Wait until the listener, metadata, the transaction and the group coordinator all answer."""
        started = time.monotonic()
        deadline = started + timeout_s
        phases: list[tuple[str, Callable[[float], bool]]] = [
            ("client port accepts connections", self._port_open),
            ("metadata lists the broker", self._metadata_ready),
            # The first transaction and the first group create and load __transaction_state and
            # __consumer_offsets; doing it here keeps that cost (and its flakiness) out of the tests.
            ("transaction coordinator serves", self._transactions_ready),
            ("group coordinator serves", self._groups_ready),
        ]
        timings = []
        for what, attempt in phases:
            phase_start = time.monotonic()
            self._probe(what, attempt, deadline, timeout_s)
            timings.append(f"{what} +{time.monotonic() - phase_start:.1f}s")
        _log.info("%s: ready in %.1fs (%s)", self.name, time.monotonic() - started, ", ".join(timings))

    def _probe(self, what: str, attempt: Callable[[float], bool], deadline: float, timeout_s: float) -> None:
        last_error = ""
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ClusterStartError(f"broker {self.name} exited (code {code}) during start-up:\n{self._log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClusterStartError(
                    f"broker {self.name} not ready within {timeout_s:.0f}s: {what} did not happen"
                    f"{f' ({last_error})' if last_error else ''}\n{self._log_tail()}"
                )
            try:
                if attempt(min(remaining, _PROBE_TIMEOUT_S)):
                    return
            except (KafkaException, OSError, RuntimeError) as exc:
                last_error = str(exc)
            time.sleep(_PROBE_INTERVAL_S)

    def _port_open(self, timeout_s: float) -> bool:
        with socket.create_connection(("127.0.0.1", self._state.port), timeout=timeout_s):
            return True

    def _metadata_ready(self, timeout_s: float) -> bool:
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers}, logger=_client_log)
        metadata = admin.list_topics(timeout=timeout_s)
        if metadata.cluster_id != self.cluster_id:
            raise ClusterStartError(
                f"{self.bootstrap_servers} answers for cluster {metadata.cluster_id}, expected {self.cluster_id}: "
                "another process holds the port"
            )
        return 1 in metadata.brokers

    def _transactions_ready(self, timeout_s: float) -> bool:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "transactional.id": f"ferryman-local-warmup-{uuid.uuid4().hex}",
                "logger": _client_log,
            }
        )
        producer.init_transactions(timeout_s)
        return True

    def _groups_ready(self, timeout_s: float) -> bool:
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap_servers, "group.id": "ferryman-local-warmup", "logger": _client_log}
        )
        try:
            consumer.committed([TopicPartition("ferryman-local-warmup", 0)], timeout=timeout_s)
        finally:
            consumer.close()
        return True

    def _log_tail(self) -> str:
        parts = []
        for path in (self.work_dir / "stdout.log", self.server_log):
            if path.exists():
                parts.append(f"--- tail of {path}\n{path.read_text(errors='replace')[-_LOG_TAIL_CHARS:]}")
        return "\n".join(parts) or f"(no logs in {self.work_dir})"


_temporary: list[LocalCluster] = []
_temporary_lock = threading.Lock()


@atexit.register
def _drop_temporary_data() -> None:
    # Benchmarks write hundreds of MB; temp dirs nobody asked for must not fill /tmp.
    with _temporary_lock:
        clusters = list(_temporary)
        _temporary.clear()
    for c in clusters:
        c.kill()
        shutil.rmtree(c.work_dir / "data", ignore_errors=True)


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
