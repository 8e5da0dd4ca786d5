"""``ferryman audit``: run an audit of a flow, run one every interval, list past audits, show one.

The audit engine (``ferryman_auditor``: PySpark, pyarrow) is imported only
when a command needs it, so the rest of the CLI starts without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ferryman.admin import AUDIT_TIMEOUT_S
from ferryman.cli._audit_remote import remote_list, remote_run, remote_show
from ferryman.cli._common import (
    EXIT_FAILED,
    EXIT_FINDING,
    EXIT_OK,
    EXIT_USAGE,
    ConfigOption,
    FlowOption,
    OutputOption,
    StopSignals,
    check_output,
    fail,
    load_flow,
)
from ferryman.cli._connection import ConnectionOptions, connection_options
from ferryman.client_config import base_config
from ferryman.config import AuditorConfig, validated
from ferryman.errors import ConfigError, FerrymanError
from ferryman.naming import FlowNames
from ferryman.rpc import RpcBindError

TopicOption = Annotated[list[str] | None, typer.Option("--topic", help="Source topic to audit (repeatable).")]
MasterOption = Annotated[
    str | None, typer.Option(envvar="FERRYMAN_SPARK_MASTER", help="Spark master (default local[2 x cores]).")
]
ReportsDirOption = Annotated[
    Path | None,
    typer.Option(envvar="FERRYMAN_AUDIT_REPORTS_DIR", help="Directory of Parquet reports (default: none)."),
]
#: The audit scheduler to go through instead of running Spark here (its auditor.listen_address).
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        "-s",
        envvar="FERRYMAN_AUDIT_SERVER",
        help="host:port of an audit scheduler's API: the audit runs (or is read) there, no Spark here "
        "(env FERRYMAN_AUDIT_SERVER).",
        show_default=False,
    ),
]
#: The connection options of the commands that can go through an audit scheduler.
_remote_options = connection_options(timeout_s=AUDIT_TIMEOUT_S, server=ServerOption, server_default=None)

if TYPE_CHECKING:
    from ferryman_auditor import AuditRange, AuditReport, ScheduleOutcome
    from pyspark.sql import SparkSession

group = typer.Typer(help="Check that a flow copied its source exactly once (PySpark jobs).", no_args_is_help=True)

#: How often the progress bar asks Spark how many tasks are done.
_PROGRESS_POLL_S = 0.25

_COLUMNS = ("expected", "found", "missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")


def _offsets(text: str | None, name: str) -> dict[int, int] | None:
    """``0=100,1=250`` (or one number for every partition: ``100``) as partition -> offset.

    Raises:
        ConfigError: malformed.
    """
    if text is None:
        return None
    out: dict[int, int] = {}
    try:
        for item in text.split(","):
            part, _, offset = item.strip().partition("=")
            out[int(part)] = int(offset)
    except ValueError as exc:
        raise ConfigError(f"{name} takes partition=offset pairs separated by commas, not {text!r}") from exc
    return out


def _time_ms(text: str | None, name: str) -> int | None:
    """Milliseconds since the epoch, or an ISO-8601 time (UTC unless it says otherwise).

    Raises:
        ConfigError: neither.
    """
    if text is None:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"{name} takes an ISO-8601 time or milliseconds since the epoch, not {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _reports_dir(path: Path | None) -> Path | None:
    """--reports-dir made and known writable before Spark starts (a run stored, then its report refused, helps no one).

    Raises:
        ConfigError: it cannot be made or written.
    """
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--reports-dir (FERRYMAN_AUDIT_REPORTS_DIR) {path}: cannot write reports there: {exc.strerror or exc}"
        ) from exc
    return path


def _audit_range(
    topics: list[str] | None, start: str | None, end: str | None, since: str | None, until: str | None
) -> AuditRange:
    from ferryman_auditor import AuditRange  # noqa: PLC0415 -- the audit engine, loaded when used

    chosen = tuple(topics) if topics else None
    if (start or end) and (since or until):
        raise ConfigError("give source offsets (--start-offsets/--end-offsets) or a time window (--since/--until)")
    if start or end:
        return AuditRange(
            kind="offsets",
            start_offsets=_offsets(start, "--start-offsets"),
            end_offsets=_offsets(end, "--end-offsets"),
            topics=chosen,
        )
    if since or until:
        return AuditRange(
            kind="time", start_ms=_time_ms(since, "--since") or 0, end_ms=_time_ms(until, "--until"), topics=chosen
        )
    return AuditRange(topics=chosen)


@group.command("run")
@_remote_options
def run(
    *,
    config: ConfigOption = None,
    flow: FlowOption = None,
    topic: TopicOption = None,
    start_offsets: Annotated[
        str | None, typer.Option(help="First source offsets, partition=offset,... (default: since the last audit).")
    ] = None,
    end_offsets: Annotated[
        str | None, typer.Option(help="End source offsets (exclusive), partition=offset,...")
    ] = None,
    since: Annotated[str | None, typer.Option(help="Time window start: ISO-8601 or ms since the epoch.")] = None,
    until: Annotated[str | None, typer.Option(help="Time window end (exclusive).")] = None,
    master: MasterOption = None,
    reports_dir: ReportsDirOption = None,
    output: OutputOption = "text",
    connection: ConnectionOptions,
) -> int:
    """Audit a flow: since the last verified position, or over explicit offsets or a time window.

    With --server the audit scheduler there runs it on its Spark session (progress followed here).

    Exit status: 0 exactly once, 1 violated, 2 bad usage, 3 the audit could not run (with --server: 4 no answer,
    5 credentials refused).
    """
    if connection.server:
        try:
            check_output(output)
            if (start_offsets or end_offsets) and (since or until):
                raise ConfigError(
                    "give source offsets (--start-offsets/--end-offsets) or a time window (--since/--until)"
                )
            range_args = {
                "topics": tuple(topic or ()),
                "start_offsets": _offsets(start_offsets, "--start-offsets"),
                "end_offsets": _offsets(end_offsets, "--end-offsets"),
                "start_ms": _time_ms(since, "--since"),
                "end_ms": _time_ms(until, "--until"),
            }
            connected = connection.connect()
        except ConfigError as exc:
            return fail(str(exc), EXIT_USAGE)
        return remote_run(connected, flow=flow or "", range_args=range_args, output=output, show=_print_run)
    try:
        check_output(output)
        cfg, chosen = load_flow(config, flow)
        audit_range = _audit_range(topic, start_offsets, end_offsets, since, until)
        reports_dir = _reports_dir(reports_dir)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    from ferryman_auditor import AuditError, AuditSettings, AuditUsageError, run_audit, spark_session  # noqa: PLC0415

    interactive = output == "text" and sys.stderr.isatty()
    try:
        with _progress(interactive) as (say, follow):
            say("starting Spark")
            spark = spark_session(master)
            follow(spark)
            report = run_audit(
                spark, cfg, chosen, audit_range, settings=AuditSettings(reports_dir=reports_dir), progress=say
            )
    except AuditUsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except (AuditError, FerrymanError) as exc:
        return fail(str(exc), EXIT_FAILED)
    _print_report(report, output)
    return EXIT_OK if report.verdict == "EXACTLY_ONCE" else EXIT_FINDING


@group.command("schedule")
def schedule(
    *,
    config: ConfigOption = None,
    flow: FlowOption = None,
    topic: TopicOption = None,
    interval_s: Annotated[
        float | None,
        typer.Option(
            "--interval-s",
            help="Seconds from the start of one audit to the start of the next (default: the configuration's "
            "auditor.interval_s, 300; env FERRYMAN_AUDITOR__INTERVAL_S).",
            show_default=False,
        ),
    ] = None,
    shutdown_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--shutdown-timeout-s",
            help="On SIGTERM, seconds a run in progress may take to finish before it is abandoned (default: "
            "auditor.shutdown_timeout_s, 30; env FERRYMAN_AUDITOR__SHUTDOWN_TIMEOUT_S).",
            show_default=False,
        ),
    ] = None,
    listen_address: Annotated[
        str | None,
        typer.Option(
            "--listen-address",
            help="host:port of the audit API (AuditService: audit run|list|show --server); default: the "
            "configuration's auditor.listen_address, empty: no API (env FERRYMAN_AUDITOR__LISTEN_ADDRESS).",
            show_default=False,
        ),
    ] = None,
    master: MasterOption = None,
    reports_dir: ReportsDirOption = None,
    log_level: Annotated[str, typer.Option(envvar="FERRYMAN_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR.")] = (
        "INFO"
    ),
) -> int:
    """Audit a flow every interval, each run since the last verified position, until SIGTERM or SIGINT.

    One Spark session serves every run; each verdict is logged on stderr (reports: audit list, audit show).

    With --listen-address (auditor.listen_address) it also serves the audit API: runs started there
    (audit run --server) take turns with the scheduled ones on the session, one started run at a time.

    On SIGTERM a run in progress gets --shutdown-timeout-s to finish, then it is abandoned (nothing stored).

    Exit status once stopped: 0 all runs exactly once, 1 a run found a violation, 2 bad usage, 3 the last failed.
    A failed run whose Spark session is lost (its JVM killed, its context stopped) stops the scheduler: PySpark
    cannot start another in the process, so it exits (3, or 1 after a violation) for its supervisor to restart
    it, and the next run resumes from the last verified position.
    """
    try:
        if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {log_level!r}")
        cfg, chosen = load_flow(config, flow)
        reports_dir = _reports_dir(reports_dir)
        overrides = {
            "interval_s": interval_s,
            "shutdown_timeout_s": shutdown_timeout_s,
            "listen_address": listen_address,
        }
        auditor = validated(
            AuditorConfig,
            {**msgspec.structs.asdict(cfg.auditor), **{k: v for k, v in overrides.items() if v is not None}},
            at=("auditor",),
        )
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s ferryman-audit %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per gateway connection otherwise
    from ferryman_auditor import (  # noqa: PLC0415
        AuditError,
        AuditRuns,
        AuditSettings,
        flow_scheduler,
        serve_audit_api,
        spark_session,
        stop_session,
    )

    signals = StopSignals()
    signals.install()
    try:
        spark = spark_session(master)
    except AuditError as exc:
        return fail(str(exc), EXIT_FAILED)
    outcome: ScheduleOutcome | None = None
    try:
        signals.install()  # again: PySpark installs a SIGINT handler of its own with its context
        settings = AuditSettings(reports_dir=reports_dir)
        session_lock = threading.Lock()  # scheduled runs and runs started over the API take turns
        scheduler = flow_scheduler(
            spark,
            cfg,
            chosen,
            topics=tuple(topic) if topic else None,
            settings=settings,
            interval_s=auditor.interval_s,
            shutdown_timeout_s=auditor.shutdown_timeout_s,
            session_lock=session_lock,
        )
        runs = AuditRuns(
            spark, cfg, settings=settings, session_lock=session_lock, on_failure=scheduler.run_failed_elsewhere
        )
        signals.forward_to(scheduler.shutdown)
        with contextlib.ExitStack() as api:
            if auditor.listen_address:
                api.enter_context(
                    serve_audit_api(
                        runs,
                        chosen.name,
                        listen_address=auditor.listen_address,
                        rpc=cfg.rpc,
                        shutdown_timeout_s=auditor.shutdown_timeout_s,
                    )
                )
            outcome = scheduler.run()
    except (ConfigError, RpcBindError) as exc:
        return fail(str(exc), EXIT_USAGE)
    finally:
        if outcome is None or outcome.session_lost is None:  # a lost session has nothing left to stop
            stop_session(spark)
    if outcome.usage_error is not None:
        return fail(outcome.usage_error, EXIT_USAGE)
    if outcome.session_lost is not None:
        fail(f"Spark's session is lost ({outcome.session_lost}): exiting to be restarted", EXIT_FAILED)
    return schedule_exit_status(outcome)


def schedule_exit_status(outcome: ScheduleOutcome) -> int:
    """``audit schedule``'s exit status once stopped, as ``audit run`` ranks its own.

    1 if any run found a violation (later runs are incremental and never check that range again, so a clean last
    run must not hide it), else 3 if the last run could not run, else 0 (a usage error is 2, reported apart).
    """
    if outcome.violations:
        return EXIT_FINDING
    return EXIT_FAILED if outcome.last_failed else EXIT_OK


@contextmanager
def _progress(
    interactive: bool,
) -> Iterator[tuple[Callable[[str], None], Callable[[SparkSession], None]]]:
    """A progress bar on stderr when it is a terminal: the audit's step, and Spark's tasks done in the job."""
    if not interactive:
        yield (lambda _step: None), (lambda _spark: None)
        return
    stop = threading.Event()
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[tasks]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("audit", total=None, tasks="")

        def say(step: str) -> None:
            bar.update(task, description=step)

        def follow(spark: SparkSession) -> None:
            tracker = spark.sparkContext.statusTracker()

            def poll() -> None:
                while not stop.wait(_PROGRESS_POLL_S):
                    stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                    total = sum(s.numTasks for s in stages if s is not None)
                    if total:
                        done = sum(s.numCompletedTasks for s in stages if s is not None)
                        bar.update(task, total=total, completed=done, tasks=f"{done}/{total} Spark tasks")

            threading.Thread(target=poll, name="audit-progress", daemon=True).start()

        try:
            yield say, follow
        finally:
            stop.set()


def _print_report(report: AuditReport, output: str) -> None:
    _print_run(report.as_dict(), output)


def _print_run(run: dict[str, Any], output: str) -> None:
    """A run in `AuditReport.as_dict`'s shape (local, or from the API), as JSON or a table."""
    if output == "json":
        print(json.dumps(run))
        return
    console = Console()
    table = Table(title=f"audit {run['run_id']} of flow {run['flow']} ({run['range'].get('kind')})")
    for name in ("topic", "partition", *_COLUMNS, "map agrees"):
        table.add_column(name, justify="left" if name == "topic" else "right")
    for p in run["partitions"]:
        values = [str(p[c]) for c in _COLUMNS]
        agrees = "-" if p["offset_map"] is None else ("yes" if p["alignments_agree"] else "NO")
        table.add_row(p["topic"], str(p["partition"]), *values, agrees)
    console.print(table)
    style = "green" if run["verdict"] == "EXACTLY_ONCE" else "bold red"
    console.print(f"verdict: [{style}]{run['verdict']}[/{style}]")


def _load_runs(config: Path | None, flow: str | None) -> tuple[str, list[AuditReport]]:
    cfg, chosen = load_flow(config, flow)
    from ferryman_auditor import AuditStore  # noqa: PLC0415

    store = AuditStore(
        base_config(cfg.clusters[chosen.target], "ferryman-cli"), FlowNames.of(chosen).audit_topic, timeout_s=30.0
    )
    return chosen.name, list(store.load().runs)


@group.command("list")
@_remote_options
def list_runs(
    *,
    config: ConfigOption = None,
    flow: FlowOption = None,
    limit: Annotated[int, typer.Option(help="Most recent runs to list.")] = 20,
    output: OutputOption = "text",
    connection: ConnectionOptions,
) -> int:
    """List a flow's audits, newest last (from its audit topic, or from the audit scheduler at --server)."""
    if connection.server:
        try:
            check_output(output)
            connected = connection.connect()
        except ConfigError as exc:
            return fail(str(exc), EXIT_USAGE)
        return remote_list(connected, flow=flow or "", limit=limit, output=output, show=_print_rows)
    try:
        check_output(output)
        name, runs = _load_runs(config, flow)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    except FerrymanError as exc:
        return fail(str(exc), EXIT_FAILED)
    from ferryman_auditor import summary_of  # noqa: PLC0415

    _print_rows(name, summary_of(runs[-limit:] if limit > 0 else runs), output)
    return EXIT_OK


def _print_rows(name: str, rows: list[dict[str, Any]], output: str) -> None:
    """``audit list``'s rows (`summary_of`'s shape) as JSON or a table."""
    if output == "json":
        print(json.dumps(rows))
        return
    table = Table(title=f"audits of flow {name}")
    for column in ("run_id", "finished", "range", "verdict", "partitions", *_COLUMNS):
        table.add_column(column)
    for row in rows:
        finished = datetime.fromtimestamp(row["finished_at_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            row["run_id"],
            finished,
            str(row["range"]),
            row["verdict"],
            str(row["partitions"]),
            *(str(row[c]) for c in _COLUMNS),
        )
    Console().print(table)


@group.command("show")
@_remote_options
def show(
    run_id: Annotated[str | None, typer.Argument(help="Run id (default: the latest run).")] = None,
    *,
    config: ConfigOption = None,
    flow: FlowOption = None,
    output: OutputOption = "text",
    connection: ConnectionOptions,
) -> int:
    """Show one audit's per-partition results (read here, or at the audit scheduler at --server).

    Exit status: 0 exactly once, 1 violated, 2 no such run (with --server: 3 the run failed or has not finished).
    """
    if connection.server:
        try:
            check_output(output)
            connected = connection.connect()
        except ConfigError as exc:
            return fail(str(exc), EXIT_USAGE)
        return remote_show(connected, flow=flow or "", run_id=run_id or "", output=output, show=_print_run)
    try:
        check_output(output)
        name, runs = _load_runs(config, flow)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    except FerrymanError as exc:
        return fail(str(exc), EXIT_FAILED)
    chosen = [r for r in runs if r.run_id == run_id] if run_id else runs[-1:]
    if not chosen:
        return fail(f"flow {name} has no audit {run_id}" if run_id else f"flow {name} has no audit yet", EXIT_USAGE)
    _print_report(chosen[0], output)
    return EXIT_OK if chosen[0].verdict == "EXACTLY_ONCE" else EXIT_FINDING
