"""The audit CLI when Spark fails it: its JVM killed under the scheduler, a JVM that does not start, and where reports
cannot be written. Each exit status must say what happened (3: could not run), never a finding (1).

Apart from test_audit_schedule.py so that the two modules' Spark starts can run on two test workers.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from ferryman_local import reserve_port

from tests.helpers.audit import write_audit_config
from tests.helpers.audit_cli import POLL_S, RUNS_BUDGET_S, copied_flow, ferryman, scheduler, stored_runs
from tests.helpers.kafka import KafkaCluster, wait_until
from tests.helpers.services import BIN, flow_config

pytestmark = pytest.mark.integration


def _spark_jvm(proc: subprocess.Popen[bytes]) -> psutil.Process:
    """The JVM that PySpark started for the scheduler process (a java process below it)."""
    jvms = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "java"]
    assert len(jvms) == 1, [p.cmdline() for p in jvms]
    return jvms[0]


# Nightly: each case is a Spark start (60-80 s on a CI worker). CI keeps the decision (unit tests of the scheduler)
# and the exit statuses of a Spark that does not start (below); both cases pass on a 2-core machine in ~45-60 s.
@pytest.mark.nightly
@pytest.mark.parametrize("noticed_by", ["scheduled run", "run started over the API"])
def test_scheduler_whose_spark_jvm_is_killed_exits_3_at_the_next_run_with_the_reason(
    noticed_by: str,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """kill -9 of Spark's JVM (as the OOM killer would): PySpark cannot start another in the process, so the
    scheduler must not go on failing every run while it looks alive; it exits for its supervisor to restart it,
    at the next scheduled run or at a run started over its API, whichever fails first."""
    _topic, _dest, config = copied_flow(source_cluster, destination_cluster, unique_name, tmp_path)
    log = tmp_path / "schedule.log"
    api = f"127.0.0.1:{reserve_port()}"
    over_api = noticed_by == "run started over the API"
    interval = "3600" if over_api else "2"  # over the API: no scheduled run comes before the started one
    with scheduler(config, log, "--interval-s", interval, "--listen-address", api) as proc:
        first = wait_until(lambda: stored_runs(config), RUNS_BUDGET_S, POLL_S, "the first run")
        _spark_jvm(proc).kill()
        if over_api:
            started = ferryman("audit", "run", "--server", api, "--output", "json")
            assert started.returncode == 3, started.stdout + started.stderr
        code = proc.wait(RUNS_BUDGET_S)
        stored = stored_runs(config)
    output = log.read_text(errors="replace")
    assert code == 3, output[-4000:]
    assert first and all(r["verdict"] == "EXACTLY_ONCE" for r in first), first
    assert "Spark's session is lost" in output and "exiting to be restarted" in output, output[-4000:]
    lost = (
        "an audit run on the session failed and Spark's session is lost: its JVM does not answer"
        if over_api
        else "could not run and Spark's session is lost: its JVM does not answer"
    )
    assert lost in output, output[-4000:]
    assert all(r["verdict"] == "EXACTLY_ONCE" for r in stored)  # nothing of a failed run is stored
    # No stop tried on the dead JVM (PySpark's own threads may still print a traceback as the JVM goes).
    assert "did not stop cleanly" not in output, output[-4000:]


def _offline(
    command: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ferryman audit COMMAND`` on a flow whose clusters are never reached (what is checked comes first)."""
    data = flow_config(source_bootstrap="127.0.0.1:1", destination_bootstrap="127.0.0.1:2", flow="f", topics=["t"])
    config = write_audit_config(tmp_path / "flow.yaml", data)
    return subprocess.run(
        [str(BIN / "ferryman"), "audit", command, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | (env or {}),
    )


@pytest.mark.parametrize("command", ["run", "schedule"])
def test_spark_that_does_not_start_is_an_audit_that_could_not_run_exit_3_not_a_finding(
    command: str, tmp_path: Path
) -> None:
    """No Java (JAVA_HOME wrong): exit 3 (could not run: a CronJob retries it) with the reason, never 1 (a
    violation, which fails the Job) or a traceback. Spark starts before the clusters are asked."""
    done = _offline(command, tmp_path, env={"JAVA_HOME": str(tmp_path / "no-java")})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ferryman: Spark did not start: [JAVA_GATEWAY_EXITED]" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["run", "schedule"])
def test_a_reports_dir_that_cannot_be_written_is_bad_usage_before_spark_starts(command: str, tmp_path: Path) -> None:
    """Not after the run: its verdict would be stored and then hidden behind the error (or a traceback)."""
    (tmp_path / "a-file").write_text("")
    done = _offline(command, tmp_path, "--reports-dir", str(tmp_path / "a-file" / "reports"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ferryman: --reports-dir (FERRYMAN_AUDIT_REPORTS_DIR)" in done.stderr, done.stderr
    assert "cannot write reports there: Not a directory" in done.stderr
    assert "Spark" not in done.stderr and "Traceback" not in done.stderr
