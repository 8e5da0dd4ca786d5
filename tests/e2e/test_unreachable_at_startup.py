"""A cluster that does not answer at start-up: a clear periodic message, then one error line and exit code 5."""

from __future__ import annotations

from pathlib import Path

import pytest
from ferryman.service import EXIT_UNREACHABLE

from tests.helpers.services import ServiceProcess, flow_config, write_config
from tests.helpers.tcp_proxy import closed_port

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("kind", ["wrapper", "deduper"])
def test_an_unreachable_cluster_at_start_up_is_one_error_naming_it_and_exit_5(tmp_path: Path, kind: str) -> None:
    port = closed_port()
    cfg = flow_config(
        source_bootstrap=f"127.0.0.1:{port}",
        destination_bootstrap=f"127.0.0.1:{port}",
        flow="unreachable",
        topics=["t"],
        wrapper={"startup_timeout_s": 4},
        deduper={"startup_timeout_s": 4},
    )
    proc = ServiceProcess(kind, write_config(tmp_path / "f.yaml", cfg), tmp_path).start()
    assert proc.wait_exit(60) == EXIT_UNREACHABLE
    out = proc.output()
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out
    assert f"(127.0.0.1:{port}) did not answer within 4 s at start-up (startup_timeout_s)" in errors[0]
    # Quiet: librdkafka's connection failures go through Python logging at DEBUG, not to stderr line by line.
    assert "Connect to ipv4" not in out
    assert len(out.splitlines()) < 12, out
