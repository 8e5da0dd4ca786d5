"""ferryman_local's loopback ports: never the same twice, and only a process's share when shards are set."""

from __future__ import annotations

import pytest
from ferryman_local import HarnessError, reserve_port
from ferryman_local._ports import SHARD_ENV


def test_a_shard_gets_only_its_own_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARD_ENV, "1/2")
    ports = [reserve_port() for _ in range(20)]
    assert all(port % 2 == 1 for port in ports), ports
    assert len(set(ports)) == len(ports)
    monkeypatch.setenv(SHARD_ENV, "0/3")
    assert all(reserve_port() % 3 == 0 for _ in range(10))


@pytest.mark.parametrize("value", ["2/2", "x", "1/0", "-1/2", "1/2/3"])
def test_a_bad_shard_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(SHARD_ENV, value)
    with pytest.raises(HarnessError, match=SHARD_ENV):
        reserve_port()


def test_without_a_shard_every_port_may_be_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARD_ENV, raising=False)
    ports = {reserve_port() for _ in range(40)}
    assert len(ports) == 40
    assert {port % 2 for port in ports} == {0, 1}
