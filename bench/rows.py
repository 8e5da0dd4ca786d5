"""The replicators under test, each started as real processes on the same two clusters."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from ferryman_local import ensure_kafka_jars

BIN = Path(sys.executable).parent
#: The source cluster's alias everywhere: destination topics are "source.<topic>".
SOURCE_ALIAS = "source"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RowContext:
    """What every row needs to know."""

    name: str
    source: str
    destination: str
    topic_pattern: str
    topics: list[str]
    work_dir: Path
    wrapper_procs: int = 1
    deduper_procs: int = 1
    ferryman_txn_ms: int = 100


class Row:
    """One replicator: start() launches its processes, stop() ends them."""

    exactly_once = False

    def __init__(self, ctx: RowContext) -> None:
        self.ctx = ctx
        self.procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> None:
        log = (self.ctx.work_dir / log_name).open("wb")
        self.procs.append(
            subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
            )
        )

    def start(self) -> None:
        """Launch the replicator's processes."""
        raise NotImplementedError  # each row defines how it runs

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, the whole process groups."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


class FerrymanRow(Row):
    """Ferryman exactly-once: wrapper and deduper processes joined by the control link."""

    exactly_once = True

    def start(self) -> None:
        ports = [_free_port() for _ in range(self.ctx.deduper_procs)]
        cfg = {
            "clusters": {
                SOURCE_ALIAS: {"bootstrap_servers": self.ctx.source},
                "target": {"bootstrap_servers": self.ctx.destination},
            },
            "flows": [
                {
                    "name": f"bench-{self.ctx.name}",
                    "source": SOURCE_ALIAS,
                    "target": "target",
                    "topics": [self.ctx.topic_pattern],
                    "staging_partitions": 8,
                    "emit_offset_mappings": True,
                }
            ],
            "wrapper": {"listen_address": "127.0.0.1:0", "deduper_addresses": [f"127.0.0.1:{p}" for p in ports]},
            "deduper": {"transaction_interval_ms": self.ctx.ferryman_txn_ms},
        }
        path = self.ctx.work_dir / "ferryman.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        for i, port in enumerate(ports):
            self._spawn(
                [
                    str(BIN / "ferryman-deduper"),
                    "--config",
                    str(path),
                    "--instance-id",
                    f"d{i}",
                    "--listen",
                    f"127.0.0.1:{port}",
                ],
                f"deduper-{i}.log",
            )
        for i in range(self.ctx.wrapper_procs):
            self._spawn(
                [str(BIN / "ferryman-wrapper"), "--config", str(path), "--instance-id", f"w{i}"], f"wrapper-{i}.log"
            )


class CopyLoopRow(Row):
    """The bare at-least-once copy loop, one process per topic."""

    def start(self) -> None:
        # Unlike MirrorMaker 2 and Ferryman, a bare loop does not create its destination topics.
        source_admin = AdminClient({"bootstrap.servers": self.ctx.source})
        md = source_admin.list_topics(self.ctx.topics[0], timeout=10).topics[self.ctx.topics[0]]
        admin = AdminClient({"bootstrap.servers": self.ctx.destination})
        new = [NewTopic(f"{SOURCE_ALIAS}.{t}", len(md.partitions), 1) for t in self.ctx.topics]
        for fut in admin.create_topics(new).values():
            fut.result(30)
        for t in self.ctx.topics:
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "bench.copyloop",
                    self.ctx.source,
                    self.ctx.destination,
                    t,
                    f"{SOURCE_ALIAS}.{t}",
                    f"bench-copy-{self.ctx.name}-{t}",
                ],
                f"copyloop-{t}.log",
            )


class MirrorMakerRow(Row):
    """Apache MirrorMaker 2, dedicated mode, from Maven Central."""

    def __init__(self, ctx: RowContext, *, exactly_once: bool, tasks: int) -> None:
        super().__init__(ctx)
        self.exactly_once = exactly_once
        self.tasks = tasks

    def start(self) -> None:
        jars = ensure_kafka_jars(with_mirrormaker=True)
        props = {
            "clusters": f"{SOURCE_ALIAS}, target",
            f"{SOURCE_ALIAS}.bootstrap.servers": self.ctx.source,
            "target.bootstrap.servers": self.ctx.destination,
            f"{SOURCE_ALIAS}->target.enabled": "true",
            f"{SOURCE_ALIAS}->target.topics": self.ctx.topic_pattern,
            f"target->{SOURCE_ALIAS}.enabled": "false",
            "tasks.max": str(self.tasks),
            "replication.factor": "1",
            "checkpoints.topic.replication.factor": "1",
            "heartbeats.topic.replication.factor": "1",
            "offset-syncs.topic.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "config.storage.replication.factor": "1",
            "refresh.topics.interval.seconds": "2",
            "sync.topic.acls.enabled": "false",
            "emit.checkpoints.enabled": "false",
            # Same consumer semantics as the other rows: aborted source records are not copied.
            f"{SOURCE_ALIAS}->target.consumer.isolation.level": "read_committed",
        }
        if self.exactly_once:
            props.update(
                {
                    "target.exactly.once.source.support": "enabled",
                    "dedicated.mode.enable.internal.rest": "true",
                    "listeners": f"http://127.0.0.1:{_free_port()}",
                }
            )
        path = self.ctx.work_dir / "mm2.properties"
        path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
        log4j = self.ctx.work_dir / "log4j2.properties"
        log4j.write_text(
            "rootLogger.level = WARN\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
            "appender.stdout.type = Console\nappender.stdout.name = STDOUT\n"
            "appender.stdout.layout.type = PatternLayout\nappender.stdout.layout.pattern = %d %p %m%n\n"
        )
        self._spawn(
            [
                "java",
                "-Xms256m",
                "-Xmx1g",
                f"-Dlog4j2.configurationFile={log4j}",
                "-cp",
                f"{jars}/*",
                "org.apache.kafka.connect.mirror.MirrorMaker",
                str(path),
            ],
            "mm2.log",
        )
