"""The metrics endpoint: binds at start (errors then), serves scrapes from its thread, stops promptly."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest
from ferryman.errors import ConfigError
from ferryman.metrics import MetricsBindError, MetricsExporter, deduper_metrics, split_address, wrapper_metrics
from ferryman.metrics.collectors import DeduperCollector
from ferryman.v1 import control_pb2

from tests.helpers.metrics import deduper_status, wrapper_status


def _scrape(port: int, host: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


@pytest.mark.parametrize(
    ("address", "expected"),
    [("[::]:9460", ("::", 9460)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("localhost:9450", ("localhost", 9450))],
)
def test_split_address(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["9460", ":9460", "host:", "host:port", "host:70000"])
def test_a_malformed_address_is_a_configuration_error(address: str) -> None:
    with pytest.raises(ConfigError, match="not host:port"):
        split_address(address)


def test_serves_the_deduper_families_and_process_metrics() -> None:
    with deduper_metrics("127.0.0.1:0", deduper_status) as exporter:
        assert exporter.port is not None
        body = _scrape(exporter.port)
    assert 'ferryman_deduper_records_written_total{flow="orders"} 1000.0' in body
    assert "process_cpu_seconds_total" in body


def test_the_wildcard_address_serves_ipv4_and_ipv6_loopback() -> None:
    if not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 here")
    with wrapper_metrics("[::]:0", wrapper_status, control_link=True) as exporter:
        assert exporter.port is not None
        assert "ferryman_wrapper_records_sent_total" in _scrape(exporter.port)
        assert "ferryman_wrapper_records_sent_total" in _scrape(exporter.port, "[::1]")


def test_an_address_in_use_fails_at_start_and_a_stopped_one_is_free_again() -> None:
    with deduper_metrics("127.0.0.1:0", deduper_status) as first, pytest.raises(MetricsBindError, match="in use"):
        deduper_metrics(f"127.0.0.1:{first.port}", deduper_status).start()
    started = time.monotonic()
    with deduper_metrics(f"127.0.0.1:{first.port}", deduper_status) as again:
        assert again.port == first.port
    assert time.monotonic() - started < 1.0  # stop waits one poll interval at most


def test_an_empty_address_serves_nothing() -> None:
    with deduper_metrics("", deduper_status) as exporter:
        assert exporter.port is None


def test_a_failing_status_fails_that_scrape_only() -> None:
    calls = [0]

    def status() -> control_pb2.GetDeduperStatusResponse:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("not ready")
        return deduper_status()

    with deduper_metrics("127.0.0.1:0", status) as exporter:
        assert exporter.port is not None
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _scrape(exporter.port)
        assert "ferryman_deduper_serving" in _scrape(exporter.port)


def test_start_and_stop_are_idempotent() -> None:
    exporter = MetricsExporter("127.0.0.1:0", lambda: DeduperCollector(deduper_status), what="test")
    exporter.stop()  # before start: nothing to stop
    exporter.start()
    port = exporter.port
    exporter.start()
    assert exporter.port == port
    exporter.stop()
    exporter.stop()
