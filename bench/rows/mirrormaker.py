"""Rows ``mm2`` and ``mm2-eos``: Apache MirrorMaker 2 in dedicated mode, from Maven Central jars.

It runs the way ``bin/connect-mirror-maker.sh`` runs it (same main class, heap and
JVM flags), with the single-node replication factors of machine.md. The source
alias is unique per run (``mm2<run>`` / ``mm2eos<run>``): MM2 names the destination
topic ``<alias>.<topic>`` and keeps its Connect offsets, configs and status in
``mm2-*.<alias>.internal`` topics, so a fresh alias means a fresh destination topic
and no offsets left over from an earlier row or run.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from ferryman_local import HarnessError, ensure_kafka_jars, reserve_port

from bench.crossing import Placement
from bench.loader import LOAD_COMPRESSION
from bench.rows.base import Row, RowContext, RowUnavailableError

_TARGET = "target"
#: ``KAFKA_HEAP_OPTS`` of ``bin/connect-mirror-maker.sh`` and ``KAFKA_JVM_PERFORMANCE_OPTS`` of
#: ``bin/kafka-run-class.sh``: MM2 as its own start script runs it.
_JVM_OPTIONS = (
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
#: Log4j 2 configuration: warnings and errors only (INFO logging costs MM2 CPU at high rates).
_LOG4J2 = """\
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = %d %p %c{1} %m%n
"""


class MirrorMakerRow(Row):
    """MirrorMaker 2, at-least-once (``mm2``) or with KIP-618 exactly-once source support (``mm2-eos``)."""

    name = "mm2"
    exactly_once = False

    def __init__(self, ctx: RowContext) -> None:
        super().__init__(ctx)
        self._jars = ""

    @property
    def alias(self) -> str:
        """Source cluster alias, unique per run; destination topics are ``<alias>.<topic>``."""
        return f"{self.name.replace('-', '')}{self.ctx.run_id}"

    def placement(self) -> Placement:
        """Next to the destination, as MirrorMaker 2 is usually deployed (consume remote, produce local).

        What crosses is its traffic with the source's brokers: the fetch responses, compressed
        only as the source's producers wrote them (``target.producer.compression.type`` applies
        on the destination's side), and what it writes to the source (its offset syncs).
        """
        return Placement("destination", crossing_compression=f"source batches as written: {LOAD_COMPRESSION}")

    def check(self) -> None:
        """Java must be installed and the MirrorMaker jars resolvable."""
        if shutil.which("java") is None:
            raise RowUnavailableError("java is not on PATH")
        try:
            self._jars = str(ensure_kafka_jars(with_mirrormaker=True))
        except HarnessError as exc:
            raise RowUnavailableError(f"MirrorMaker 2 jars: {exc}") from exc

    def properties(self) -> dict[str, str]:
        """The ``mm2.properties`` of this row."""
        src, opts = self.alias, self.ctx.options
        flow = f"{src}->{_TARGET}"
        props = {
            "clusters": f"{src}, {_TARGET}",
            f"{src}.bootstrap.servers": self.ctx.source,
            f"{_TARGET}.bootstrap.servers": self.ctx.destination,
            f"{flow}.enabled": "true",
            # Plain names, not escaped regexes: a .properties reader drops backslashes.
            f"{flow}.topics": ", ".join(self.ctx.topics),
            f"{_TARGET}->{src}.enabled": "false",
            "tasks.max": str(opts.mm2_tasks),
            # Single-node clusters (machine.md): every topic MM2 creates at replication factor 1.
            "replication.factor": "1",
            "checkpoints.topic.replication.factor": "1",
            "heartbeats.topic.replication.factor": "1",
            "offset-syncs.topic.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "config.storage.replication.factor": "1",
            # ACL sync needs an authorizer; the single-node clusters have none.
            "sync.topic.acls.enabled": "false",
            # Same source semantics as the other rows (librdkafka's default): aborted records are not copied.
            f"{flow}.consumer.isolation.level": "read_committed",
            # The same compression as the other rows' producers (Connect's default is none too).
            f"{_TARGET}.producer.compression.type": opts.compression,
        }
        if opts.mm2_producer_tuning:
            # Batching like the Python rows (Connect's producer defaults: 16 KB batches, linger 0).
            props.update(
                {
                    f"{_TARGET}.producer.batch.size": "1000000",
                    f"{_TARGET}.producer.linger.ms": "5",
                    f"{src}.consumer.max.poll.records": "10000",
                }
            )
        if self.exactly_once:
            props.update(
                {
                    f"{_TARGET}.exactly.once.source.support": "enabled",
                    # Exactly-once source tasks need the workers' internal REST API (KIP-710).
                    "dedicated.mode.enable.internal.rest": "true",
                    "listeners": f"http://127.0.0.1:{reserve_port()}",
                }
            )
        return props

    def launch(self) -> None:
        """Write ``mm2.properties`` and a log configuration, start the JVM."""
        props = self.ctx.work_dir / "mm2.properties"
        props.write_text("".join(f"{k} = {v}\n" for k, v in self.properties().items()))
        log4j = self.ctx.work_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        self._spawn(
            [
                "java",
                *_JVM_OPTIONS,
                f"-Dlog4j2.configurationFile={log4j}",
                "-cp",
                f"{self._jars}/*",
                "org.apache.kafka.connect.mirror.MirrorMaker",
                str(props),
            ],
            "mm2.log",
        )

    def settings(self) -> Mapping[str, object]:
        """Tasks, exactly-once mode and tuning."""
        return {
            "tasks.max": self.ctx.options.mm2_tasks,
            "exactly_once_source_support": self.exactly_once,
            "producer_tuning": "batch 1 MB, linger 5 ms"
            if self.ctx.options.mm2_producer_tuning
            else "Connect defaults",
            "heap": "-Xms256M -Xmx2G (as connect-mirror-maker.sh)",
            "producer_compression": self.ctx.options.compression,
        }


class MirrorMakerEosRow(MirrorMakerRow):
    """MirrorMaker 2 with ``exactly.once.source.support=enabled`` on the target."""

    name = "mm2-eos"
    exactly_once = True
