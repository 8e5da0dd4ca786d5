"""One Kafka JVM (broker and controller in one process) and the probes that tell when a cluster serves.

Both cluster shapes are built from it: ``LocalCluster`` runs one ``BrokerProcess``,
``MultiNodeCluster`` runs several that form one KRaft quorum. A process knows its
work dir (``server.properties``, ``data/``, ``stdout.log``, ``logs/server.log``),
formats its storage, launches, stops and crashes; what the properties say and
how the storage is formatted is the cluster's business.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib import resources
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ferryman_local import _process
from ferryman_local._errors import ClusterStartError
from ferryman_local._maven import require_tool
from ferryman_local._ports import port_free

_log = logging.getLogger("ferryman_local")
# librdkafka's own log lines (connection refused while a broker starts, "coordinator load in
# progress") go to Python logging instead of stderr.
_client_log = logging.getLogger("ferryman_local.librdkafka")

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

# How often readiness is re-probed while a broker starts (~3.5 s); short, the probes are cheap.
_PROBE_INTERVAL_S = 0.2
# A single probe (TCP connect, metadata request) may take this long before it counts as failed.
_PROBE_TIMEOUT_S = 5.0
_LOG_TAIL_CHARS = 4000
# StorageTool is a short-lived JVM (~2 s idle); this only bounds a wedged one. Four of them at once (a chaos
# run's two clusters) on a 2-core machine shared with other Kafka tests took over 120 s (load average 50+).
_FORMAT_TIMEOUT_S = 300.0


class BrokerProcess:
    """One broker+controller JVM and its work dir; the JVM never outlives the Python process.

    Attributes:
        label: names the process in log lines and errors (``destination``, ``dest3/node-2``).
        work_dir: configuration, data and logs of this process.
        port: client (PLAINTEXT) listener port on 127.0.0.1.
        controller_port: KRaft CONTROLLER listener port on 127.0.0.1.
    """

    def __init__(self, label: str, work_dir: Path, jars: Path, *, port: int, controller_port: int) -> None:
        """Describe a process; nothing runs until ``launch``."""
        self.label = label
        self.work_dir = work_dir
        self.port = port
        self.controller_port = controller_port
        self._jars = jars
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``: this process alone."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the JVM while it runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def exit_code(self) -> int | None:
        """The JVM's exit code once it has exited, None while it runs or before the first launch."""
        proc = self._proc
        return None if proc is None else proc.poll()

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

    def write_config(self, properties: Mapping[str, str]) -> None:
        """Write ``server.properties`` and the log4j configuration into the work dir."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        log4j = resources.files("ferryman_local").joinpath("kafka", "log4j2.xml").read_bytes()
        (self.work_dir / "log4j2.xml").write_bytes(log4j)
        (self.work_dir / "logs").mkdir(exist_ok=True)

    def format(self, cluster_id: str, quorum_args: Sequence[str]) -> None:
        """Format the storage with ``StorageTool format`` unless it already holds a cluster.

        Args:
            cluster_id: the KRaft cluster id.
            quorum_args: how the controller quorum starts (``--standalone``, or
                ``--initial-controllers <voters>``, the same on every node).

        Raises:
            ClusterStartError: the tool failed (the message ends with its output).
        """
        if (self.data_dir / "meta.properties").exists():
            return
        cmd = self._java(
            "kafka.tools.StorageTool", "format", *quorum_args, "-t", cluster_id, "-c", str(self.properties_path)
        )
        # A short-lived tool: plain subprocess.run, no process-group bookkeeping needed.
        result = subprocess.run(
            cmd, cwd=self.work_dir, capture_output=True, text=True, check=False, timeout=_FORMAT_TIMEOUT_S
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-_LOG_TAIL_CHARS:]
            raise ClusterStartError(f"formatting the storage of {self.label} failed:\n{output}")

    def launch(self) -> None:
        """Start the JVM on the configured ports (returns at once; readiness is probed apart).

        Raises:
            ClusterStartError: a port is taken (another process could answer the probes).
        """
        with self._lock:
            busy = [p for p in (self.port, self.controller_port) if not port_free(p)]
            if busy:
                # Checked up front: otherwise the readiness probes could talk to whatever holds the port.
                raise ClusterStartError(
                    f"{self.label}: port(s) {busy} on 127.0.0.1 are in use; is this cluster ({self.work_dir}) "
                    "already running in another process?"
                )
            with (self.work_dir / "stdout.log").open("ab") as out:
                self._proc = _process.spawn(
                    self._java("kafka.Kafka", str(self.properties_path)), cwd=self.work_dir, output=out
                )
            _log.info(
                "%s: broker pid %d on %s, work dir %s",
                self.label,
                self._proc.pid,
                self.bootstrap_servers,
                self.work_dir,
            )

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut the JVM down in order (SIGTERM), SIGKILL after timeout_s. Idempotent.

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
                _log.warning("%s: no clean shutdown within %.0fs; killing it", self.label, timeout_s)
                self.kill()
            _process.forget(proc)

    def kill(self) -> None:
        """SIGKILL the JVM, as a crash would. Idempotent."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            _process.signal_group(proc, signal.SIGKILL)
            proc.wait()  # SIGKILL cannot be ignored; this reaps it at once
            _process.forget(proc)

    def log_tail(self) -> str:
        """The last lines of the JVM's output and of its broker log, for error messages."""
        parts = []
        for path in (self.work_dir / "stdout.log", self.server_log):
            if path.exists():
                parts.append(f"--- tail of {path}\n{path.read_text(errors='replace')[-_LOG_TAIL_CHARS:]}")
        return "\n".join(parts) or f"(no logs in {self.work_dir})"

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


Probe = Callable[[float], bool]
"""One readiness check: given a budget in seconds, True when met (False or an exception: not yet)."""


def wait_ready(
    label: str, phases: Sequence[tuple[str, Probe]], processes: Sequence[BrokerProcess], timeout_s: float
) -> None:
    """Run each readiness phase in turn until it passes, all within one budget.

    Args:
        label: names the cluster in the log line and errors.
        phases: what is awaited and the probe that tells it, in order.
        processes: the JVMs that must keep running meanwhile.
        timeout_s: budget for all phases together.

    Raises:
        ClusterStartError: a process exited, or a phase did not pass in time
            (the message ends with the log tail of the process concerned).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    timings = []
    for what, attempt in phases:
        phase_start = time.monotonic()
        _probe(label, what, attempt, processes, deadline=deadline, timeout_s=timeout_s)
        timings.append(f"{what} +{time.monotonic() - phase_start:.1f}s")
    _log.info("%s: ready in %.1fs (%s)", label, time.monotonic() - started, ", ".join(timings))


def _probe(
    label: str, what: str, attempt: Probe, processes: Sequence[BrokerProcess], *, deadline: float, timeout_s: float
) -> None:
    last_error = ""
    while True:
        for p in processes:
            if p.pid is None:
                raise ClusterStartError(
                    f"broker {p.label} exited (code {p.exit_code}) during start-up:\n{p.log_tail()}"
                )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            tails = "\n".join(p.log_tail() for p in processes)
            raise ClusterStartError(
                f"{label} not ready within {timeout_s:.0f}s: {what} did not happen"
                f"{f' ({last_error})' if last_error else ''}\n{tails}"
            )
        try:
            if attempt(min(remaining, _PROBE_TIMEOUT_S)):
                return
        except (KafkaException, OSError, RuntimeError) as exc:
            last_error = str(exc)
        time.sleep(_PROBE_INTERVAL_S)


def port_open(port: int, timeout_s: float) -> bool:
    """True once a TCP connection to 127.0.0.1:port succeeds (an OSError otherwise)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
        return True


def brokers_listed(
    bootstrap: str,
    cluster_id: str,
    node_ids: Collection[int],
    timeout_s: float,
    *,
    client: Mapping[str, str] | None = None,
) -> bool:
    """True once the metadata bootstrap returns lists every one of node_ids as a live broker.

    ``client`` (here and in the other probes): more librdkafka settings, a login on an authenticated cluster.

    Raises:
        ClusterStartError: bootstrap answers for another cluster (another process holds the port).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, **dict(client or {})}, logger=_client_log)
    metadata = admin.list_topics(timeout=timeout_s)
    if metadata.cluster_id != cluster_id:
        raise ClusterStartError(
            f"{bootstrap} answers for cluster {metadata.cluster_id}, expected {cluster_id}: "
            "another process holds the port"
        )
    return set(node_ids) <= set(metadata.brokers)


def transactions_ready(bootstrap: str, timeout_s: float, *, client: Mapping[str, str] | None = None) -> bool:
    """True once a transactional producer initialises (``__transaction_state`` exists and is loaded)."""
    producer = Producer(
        {
            **dict(client or {}),
            "bootstrap.servers": bootstrap,
            "transactional.id": f"ferryman-local-warmup-{uuid.uuid4().hex}",
            "logger": _client_log,
        }
    )
    producer.init_transactions(timeout_s)
    return True


def groups_ready(bootstrap: str, timeout_s: float, *, client: Mapping[str, str] | None = None) -> bool:
    """True once a group coordinator answers an offset fetch (``__consumer_offsets`` exists and is loaded)."""
    consumer = Consumer(
        {
            **dict(client or {}),
            "bootstrap.servers": bootstrap,
            "group.id": "ferryman-local-warmup",
            "logger": _client_log,
        }
    )
    try:
        consumer.committed([TopicPartition("ferryman-local-warmup", 0)], timeout=timeout_s)
    finally:
        consumer.close()
    return True


_temporary: list[BrokerProcess] = []
_temporary_lock = threading.Lock()


def discard_data_at_exit(process: BrokerProcess) -> None:
    """Kill process and delete its ``data/`` when Python exits (its logs stay, for post-mortems).

    For work dirs in temp space that nobody asked for: benchmarks write hundreds of MB there,
    which must not fill /tmp.
    """
    with _temporary_lock:
        _temporary.append(process)


@atexit.register
def _drop_temporary_data() -> None:
    with _temporary_lock:
        processes = list(_temporary)
        _temporary.clear()
    for p in processes:
        p.kill()
        shutil.rmtree(p.data_dir, ignore_errors=True)
