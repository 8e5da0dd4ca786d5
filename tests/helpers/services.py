"""Run the Ferryman services as real processes, the way a user runs them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from tests.helpers.kafka import KafkaCluster

BIN = Path(sys.executable).parent


def ferryman_cli(*args: str, env: Mapping[str, str], timeout_s: float = 90.0) -> subprocess.CompletedProcess[str]:
    """The ``ferryman`` CLI as a user runs it: args, env over an environment without the runner's FERRYMAN_*."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRYMAN_")} | dict(env)
    return subprocess.run(
        [str(BIN / "ferryman"), *args], capture_output=True, text=True, timeout=timeout_s, env=environ, check=False
    )


def write_config(path: Path, data: Mapping[str, Any]) -> Path:
    """Write a YAML Ferryman configuration and return its path."""
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def flow_config(
    *,
    source_bootstrap: str,
    destination_bootstrap: str,
    flow: str,
    topics: Sequence[str],
    staging_partitions: int = 6,
    naming: Mapping[str, Any] | None = None,
    wrapper: Mapping[str, Any] | None = None,
    deduper: Mapping[str, Any] | None = None,
    extra_flow: Mapping[str, Any] | None = None,
    destination_client_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A one-flow configuration with test-friendly (fast) tuning (destination_client_config: librdkafka
    properties of every client of the destination cluster)."""
    flow_data: dict[str, Any] = {
        "name": flow,
        "source": "src",
        "target": "dst",
        "topics": list(topics),
        "staging_partitions": staging_partitions,
        "naming": dict(naming or {"policy": "prefix"}),
    }
    flow_data.update(extra_flow or {})
    return {
        "clusters": {
            "src": {"bootstrap_servers": source_bootstrap},
            "dst": {"bootstrap_servers": destination_bootstrap, "client_config": dict(destination_client_config or {})},
        },
        "flows": [flow_data],
        # Short intervals so tests see progress quickly.
        "wrapper": {
            "instance_id": f"{flow}-w1",
            "commit_interval_ms": 200,
            "topic_refresh_interval_s": 2.0,
            "listen_address": "127.0.0.1:0",
            # Free ports: the metrics defaults (9450, 9460) may be taken on a shared machine, and a
            # service that cannot serve its metrics exits, as for its gRPC address.
            "metrics_address": "127.0.0.1:0",
            **dict(wrapper or {}),
        },
        "deduper": {
            "transaction_interval_ms": 200,
            "transaction_timeout_ms": 20000,
            "listen_address": "127.0.0.1:0",
            "metrics_address": "127.0.0.1:0",
            **dict(deduper or {}),
        },
    }


@dataclass
class ServiceProcess:
    """One ferryman-wrapper or ferryman-deduper process with its log file."""

    kind: str
    config: Path | None
    log_dir: Path
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    on_start: Callable[[int], None] | None = None
    """Called with each new process's pid (e.g. ``bench.cpucap.CpuCaps.confine``)."""
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> ServiceProcess:
        """Start (or restart) the process."""
        self.starts += 1
        # Two processes of one kind with the same arguments (a fencing test) must not share a log.
        name = f"{self.kind}-{'-'.join(self.args) or 'x'}-{id(self):x}-{self.starts}.log".replace("/", "_")
        log = self.log_dir / name
        self.logs.append(log)
        env = dict(os.environ)
        env.update(self.env or {})
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / f"ferryman-{self.kind}"), *self._config_args(), *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        if self.on_start is not None:
            self.on_start(self.proc.pid)
        return self

    def _config_args(self) -> list[str]:
        """``--config FILE``, or nothing when the environment is the whole configuration."""
        return [] if self.config is None else ["--config", str(self.config)]

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL: the crash case."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait for a drained exit; return the exit code.

        A process still running after timeout_s is killed and the test fails with its log's
        tail (a drain past ``ferryman.service.DRAIN_REPORT_S`` has written its threads' stacks there).
        """
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(
                f"{self.kind} did not exit within {timeout_s:g} s of SIGTERM; output:\n{self.output()[-12000:]}"
            ) from None

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to exit on its own."""
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def output(self) -> str:
        """All log output of every start so far."""
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def wait_for_log(self, needle: str, timeout_s: float = 60.0) -> None:
        """Wait until the current log contains needle."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.logs and needle in self.logs[-1].read_text(errors="replace"):
                return
            if not self.alive:
                break
            time.sleep(0.1)  # polling a log file: nothing to block on
        raise AssertionError(f"{self.kind} did not log {needle!r}; output:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        """Best-effort cleanup for fixtures."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(AssertionError):  # killed by terminate
                self.terminate(30)


def write_flow_config(
    source: KafkaCluster, destination: KafkaCluster, log_dir: Path, *, flow: str, topics: Sequence[str], **config: Any
) -> Path:
    """Write ``flow_config`` for the two clusters to ``log_dir/<flow>.yaml`` and return its path.

    ``**config`` takes the other ``flow_config`` arguments (``wrapper=``, ``deduper=``, ``extra_flow=``, ...).
    """
    return write_config(
        log_dir / f"{flow}.yaml",
        flow_config(
            source_bootstrap=source.bootstrap_servers,
            destination_bootstrap=destination.bootstrap_servers,
            flow=flow,
            topics=topics,
            **config,
        ),
    )


@dataclass(frozen=True)
class RunningFlow:
    """The processes of one flow started by ``running_flow``."""

    config: Path
    wrapper: ServiceProcess
    deduper: ServiceProcess


@contextlib.contextmanager
def running_flow(
    source: KafkaCluster,
    destination: KafkaCluster,
    log_dir: Path,
    *,
    flow: str,
    topics: Sequence[str],
    wrapper_env: Mapping[str, str] | None = None,
    deduper_env: Mapping[str, str] | None = None,
    **config: Any,
) -> Iterator[RunningFlow]:
    """Write a one-flow configuration, start a wrapper and a deduper (instance ``d1``), stop both on exit.

    Args:
        source: the source cluster.
        destination: the destination cluster.
        log_dir: where the configuration file and the service logs go.
        flow: the flow's name.
        topics: the flow's topic patterns.
        wrapper_env: more environment for the wrapper process.
        deduper_env: more environment for the deduper process.
        **config: more ``flow_config`` arguments (``wrapper=``, ``deduper=``, ``extra_flow=``, ...).
    """
    path = write_flow_config(source, destination, log_dir, flow=flow, topics=topics, **config)
    wrapper = ServiceProcess("wrapper", path, log_dir, env=wrapper_env).start()
    deduper = ServiceProcess("deduper", path, log_dir, args=["--instance-id", "d1"], env=deduper_env).start()
    try:
        yield RunningFlow(path, wrapper, deduper)
    finally:
        wrapper.stop()
        deduper.stop()


class InProcessService(Protocol):
    """A wrapper or deduper built in the test's process (``Wrapper(config, flow)``, ``Deduper(...)``)."""

    def run(self) -> None: ...
    def shutdown(self) -> None: ...


@contextlib.contextmanager
def running_in_thread(service: InProcessService, *, stop_timeout_s: float = 60.0) -> Iterator[None]:
    """Run service.run() on a thread of this process; on exit shut it down and fail if it raised or hung.

    In process, a test can reach into the service (its faults, its state); its gRPC server and Kafka
    clients are as real as in a service process.
    """
    failure: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # reported after the test
            failure.append(exc)

    thread = threading.Thread(target=run, name=type(service).__name__, daemon=True)
    thread.start()
    try:
        yield
    finally:
        service.shutdown()
        thread.join(stop_timeout_s)
        assert not thread.is_alive(), f"{type(service).__name__} did not stop"
        assert not failure, failure


_HOLD_HOOK = Path(__file__).parent / "hold_call"


def hold_env(call: str, marker: Path, *, after: int | None = None) -> dict[str, str]:
    """Environment of a service process whose Kafka call ``call`` is held by ``tests/helpers/hold_call``.

    ``marker`` is created when the call is held (or the hold happened); ``after``: the how-manyth such
    call is held (the hook's default when None).
    """
    env = {
        "PYTHONPATH": os.pathsep.join([str(_HOLD_HOOK), os.environ.get("PYTHONPATH", "")]),
        "FERRYMAN_TEST_HOLD_CALL": call,
        "FERRYMAN_TEST_HOLD_MARKER": str(marker),
    }
    if after is not None:
        env["FERRYMAN_TEST_HOLD_AFTER"] = str(after)
    return env
