"""The chaos schedule is a pure function of its seed: reproducible, complete, well-formed."""

from __future__ import annotations

import pytest

from tests.chaos.schedule import CI, LINKS, LONG, Fault, Kind, Profile, build_schedule, counts


@pytest.mark.parametrize("profile", [CI, LONG], ids=lambda p: p.name)
def test_the_same_seed_gives_the_same_schedule(profile: Profile) -> None:
    assert build_schedule(42, profile) == build_schedule(42, profile)
    assert build_schedule(42, profile) != build_schedule(43, profile)


@pytest.mark.parametrize("seed", range(8))
def test_every_kind_appears_as_often_as_the_profile_asks(seed: int) -> None:
    for profile in (CI, LONG):
        faults = build_schedule(seed, profile)
        by = counts(faults)
        assert len(faults) == max(profile.faults, sum(profile.min_each.values()))
        for kind, least in profile.min_each.items():
            assert by.get(kind.value, 0) >= least, (profile.name, kind)
        # Spread kinds reach every target class: each link is cut, each cluster loses a broker.
        for link in LINKS:
            assert by.get(f"cut:{link}", 0) >= profile.min_each[Kind.CUT] // len(LINKS)
        for cluster in ("source", "destination"):
            assert by.get(f"broker_kill:{cluster}", 0) >= profile.min_each[Kind.BROKER_KILL] // 2
        assert by.get("pause:wrapper", 0) >= 1
        assert by.get("pause:deduper", 0) >= 1


def test_the_long_profile_meets_the_issue_s_figures() -> None:
    faults = build_schedule(1, LONG)
    by = counts(faults)
    assert by["kill"] + by["term"] >= 50
    assert by["broker_kill:source"] + by.get("broker_stop:source", 0) >= 5
    assert by["broker_kill:destination"] + by.get("broker_stop:destination", 0) >= 5
    assert all(by[f"cut:{link}"] >= 5 for link in LINKS)
    assert by["pause"] >= 5
    # >= 1 M records: the offered rate times the least time the faults take.
    least_s = sum(f.before_s + f.duration_s for f in faults)
    assert LONG.rate_per_s * least_s >= 1_000_000


@pytest.mark.parametrize("seed", range(8))
def test_faults_are_well_formed(seed: int) -> None:
    faults = build_schedule(seed, CI, source_nodes=1, destination_nodes=3)
    assert [f.index for f in faults] == list(range(len(faults)))
    assert all(f.kind not in (Kind.ADD_PARTITION, Kind.RECREATE_TOPIC) for f in faults[:2])
    for f, nxt in zip(faults, [*faults[1:], None], strict=True):
        assert CI.before_s[0] <= f.before_s <= CI.before_s[1]
        if f.kind is Kind.PAUSE:
            # Longer than the run's session (6 s) and transaction (10 s) timeouts: a real zombie.
            assert f.duration_s > 10
        if f.kind in (Kind.BROKER_KILL, Kind.BROKER_STOP):
            cluster, node = f.target.split("/")
            assert 1 <= int(node) <= (1 if cluster == "source" else 3)
        if f.overlaps_next:
            assert nxt is not None
            assert f.kind not in (Kind.PAUSE, Kind.RECREATE_TOPIC, Kind.ADD_PARTITION)
            assert nxt.kind not in (Kind.PAUSE, Kind.RECREATE_TOPIC, Kind.ADD_PARTITION)


def test_a_fault_is_plain_json() -> None:
    f = Fault(0, Kind.CUT, "control", 1.5, 3.0, overlaps_next=True)
    assert f.to_json() == {
        "index": 0,
        "kind": "cut",
        "target": "control",
        "before_s": 1.5,
        "duration_s": 3.0,
        "overlaps_next": True,
    }
