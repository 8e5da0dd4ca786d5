"""Single-node Apache Kafka (KRaft) clusters on loopback, started from the cached jars."""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from types import TracebackType

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ferryman_local._errors import HarnessError
from ferryman_local._maven import ensure_kafka_jars

#: Settings that make a one-node cluster behave: every internal topic at
#: replication factor 1, few partitions (fast creation on 2 cores), no initial
#: rebalance delay, explicit topic creation only, a quick log cleaner.
_SINGLE_NODE = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "log.cleaner.backoff.ms": "500",
    "num.network.threads": "2",
    "num.io.threads": "4",
}
_JVM_OPTS = ("-Xms256m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
_live: set[LocalCluster] = set()
_live_lock = threading.Lock()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _new_cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka refuses ids that look like CLI flags
            return cid


class LocalCluster:
    """One single-node KRaft cluster (broker + controller) on 127.0.0.1.

    Use ``LocalCluster.start(name)``; ``stop()`` shuts it down cleanly,
    ``kill()`` crashes it, ``restart()`` brings it back with its data.
    """

    def __init__(self, name: str, work_dir: Path, extra_properties: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.work_dir = work_dir
        self.port = _free_port()
        self.controller_port = _free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.cluster_id = _new_cluster_id()
        self._extra = dict(extra_properties or {})
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        name: str,
        *,
        work_dir: Path | None = None,
        extra_properties: Mapping[str, str] | None = None,
        ready_timeout_s: float = 90.0,
    ) -> LocalCluster:
        """Format (first time) and start a cluster; return when it serves requests."""
        jars = ensure_kafka_jars()
        wd = work_dir or Path(tempfile.mkdtemp(prefix=f"ferryman-{name}-"))
        wd.mkdir(parents=True, exist_ok=True)
        cluster = cls(name, wd, extra_properties)
        cluster._write_properties()
        cluster._format(jars)
        cluster._launch(jars)
        cluster._wait_ready(ready_timeout_s)
        return cluster

    @property
    def pid(self) -> int | None:
        """Broker process id while running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def server_log(self) -> Path:
        """The broker's log file."""
        return self.work_dir / "logs" / "server.log"

    def _properties_path(self) -> Path:
        return self.work_dir / "server.properties"

    def _write_properties(self) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            **_SINGLE_NODE,
            **self._extra,
        }
        self._properties_path().write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _java(self, jars: Path, main: str, *args: str) -> list[str]:
        with resources.as_file(resources.files("ferryman_local") / "kafka" / "log4j2.xml") as log4j:
            return [
                "java",
                *_JVM_OPTS,
                f"-Dkafka.logs.dir={self.work_dir / 'logs'}",
                f"-Dlog4j2.configurationFile={log4j}",
                "-cp",
                f"{jars}/*",
                main,
                *args,
            ]

    def _format(self, jars: Path) -> None:
        if (self.work_dir / "data" / "meta.properties").exists():
            return
        cmd = self._java(
            jars,
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            self.cluster_id,
            "-c",
            str(self._properties_path()),
        )
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise HarnessError(f"formatting storage of {self.name} failed:\n{(result.stdout + result.stderr)[-2000:]}")

    def _launch(self, jars: Path) -> None:
        (self.work_dir / "logs").mkdir(exist_ok=True)
        with (self.work_dir / "stdout.log").open("ab") as out:
            self._proc = subprocess.Popen(
                self._java(jars, "kafka.Kafka", str(self._properties_path())),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as a unit, immune to our ^C
            )
        with _live_lock:
            _live.add(self)

    def _wait_ready(self, timeout_s: float) -> None:
        """Wait until metadata, the group coordinator and the transaction coordinator all answer."""
        deadline = time.monotonic() + timeout_s
        conf: dict[str, str | int | float | bool] = {"bootstrap.servers": self.bootstrap_servers}
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise HarnessError(f"broker {self.name} exited during start-up:\n{self._log_tail()}")
            try:
                admin = AdminClient(conf)
                got = admin.describe_cluster(request_timeout=5).result(timeout=10).cluster_id
                if got != self.cluster_id:
                    raise HarnessError(f"broker {self.name} reports cluster id {got}, expected {self.cluster_id}")
                self._warm_coordinators(max(5.0, deadline - time.monotonic()))
                return
            except (KafkaException, RuntimeError) as exc:
                last = exc
                time.sleep(0.25)  # the broker is still starting: poll its port again shortly
        raise HarnessError(f"broker {self.name} not ready within {timeout_s:.0f}s ({last}):\n{self._log_tail()}")

    def _warm_coordinators(self, timeout_s: float) -> None:
        # First use of transactions and groups creates __transaction_state and
        # __consumer_offsets; doing it here keeps that cost out of the tests.
        p = Producer(
            {"bootstrap.servers": self.bootstrap_servers, "transactional.id": f"ferryman-warmup-{uuid.uuid4()}"}
        )
        p.init_transactions(timeout_s)
        c = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "ferryman-warmup"})
        try:
            c.committed([TopicPartition("ferryman-warmup", 0)], timeout=timeout_s)
        finally:
            c.close()

    def _log_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in (self.work_dir / "stdout.log", self.server_log):
            if path.exists():
                parts.append(f"--- {path}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Controlled shutdown (SIGTERM), SIGKILL after timeout_s. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        with _live_lock:
            _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the broker (a crash)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def restart(self, ready_timeout_s: float = 90.0) -> None:
        """Start again on the same ports with the same data."""
        self.stop()
        jars = ensure_kafka_jars()
        self._launch(jars)
        self._wait_ready(ready_timeout_s)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster({self.name!r}, {self.bootstrap_servers}, id={self.cluster_id})"


def start_clusters(names: Sequence[str], *, base_dir: Path | None = None) -> list[LocalCluster]:
    """Start several clusters concurrently (each takes a few seconds of JVM start-up)."""
    ensure_kafka_jars()
    with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
        futures = [
            pool.submit(LocalCluster.start, n, work_dir=(base_dir / n) if base_dir is not None else None) for n in names
        ]
        clusters: list[LocalCluster] = []
        errors: list[BaseException] = []
        for f in futures:
            try:
                clusters.append(f.result())
            except BaseException as exc:
                errors.append(exc)
    if errors:
        for c in clusters:
            c.stop()
        raise errors[0]
    return clusters


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        live = list(_live)
    for c in live:
        c.kill()
