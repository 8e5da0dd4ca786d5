"""``ferryman audit`` run as an operator runs it (subprocesses), for the tests of the scheduler and the audit CLI."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.audit import audit_config, copy_topic, write_audit_config
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences
from tests.helpers.services import BIN

PARTITIONS = 2
FIRST = 300  # per partition, before the scheduler starts
MORE = 50  # per partition, while it runs
#: A run here takes a few seconds (local[1]); the first also pays Spark's start and its Python workers' (~15-30 s
#: on 2 cores; 2 min seen with other suites running real brokers beside it).
RUNS_BUDGET_S = 300.0
#: SIGTERM to exit: the run in progress finishes (seconds), then Spark stops.
STOP_BUDGET_S = 90.0


def ferryman(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``ferryman`` CLI with args, its output captured."""
    return subprocess.run([str(BIN / "ferryman"), *args], capture_output=True, text=True, timeout=120, check=False)


#: How often the tests ask ``audit list`` (a process of its own, ~1 CPU s): less often, it takes less of the 2 cores
#: the scheduler runs on.
POLL_S = 2.0


def stored_runs(config: Path) -> list[dict[str, Any]]:
    """Every audit run stored for the flow of config (``audit list --output json``), oldest first."""
    listed = ferryman("audit", "list", "--config", str(config), "--output", "json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    runs: list[dict[str, Any]] = json.loads(listed.stdout)
    return runs


def at_least(n: int, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """runs when there are n or more, else [] (a wait_until condition)."""
    return runs if len(runs) >= n else []


@contextmanager
def scheduler(config: Path, log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``ferryman audit schedule`` with its stderr in log; killed if the test leaves it running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "ferryman"), "audit", "schedule", "--config", str(config), "--master", "local[1]", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the signals the test sends, and only those
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def copied_flow(
    source: KafkaCluster, destination: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> tuple[str, str, Path]:
    """A source topic of PARTITIONS x FIRST records copied record by record (no services) and a flow config over
    the two (its destination renamed to the copy): (topic, copy, config path)."""
    topic, dest = unique_name("scheduled"), unique_name("scheduled-copy")
    create_topic(source.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(source.bootstrap_servers, topic, PARTITIONS, FIRST)
    copy_topic(source, topic, destination, dest, PARTITIONS)
    data = audit_config(source, destination, unique_name("flow"), [topic])
    data["flows"][0]["naming"] = {"policy": "prefix", "rename": {topic: dest}}
    return topic, dest, write_audit_config(tmp_path / "flow.yaml", data)
