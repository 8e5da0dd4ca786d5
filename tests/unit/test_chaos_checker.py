"""The chaos checker finds each kind of anomaly, and only real ones (compaction is not one)."""

from __future__ import annotations

from tests.chaos.checker import Tally, check_topic
from tests.chaos.records import Content, RecordId, content

BASE = 1_700_000_000_000


def seq(role: str, n: int, partition: int = 0, *, start: int = 0) -> list[Content]:
    return [content(RecordId(role, partition, i), BASE) for i in range(start, start + n)]


def tally(role: str, src: list[Content], dst: list[Content], *, compacted: bool = False) -> Tally:
    return check_topic(role, {0: src}, {0: dst}, BASE, compacted=compacted).tally


def test_an_exact_copy_is_clean() -> None:
    src = seq("plain", 50)
    assert tally("plain", src, list(src)).clean


def test_missing_duplicated_reordered_altered_and_unexpected_are_counted() -> None:
    src = seq("plain", 10)
    assert tally("plain", src, src[:7] + src[8:]) == Tally(missing=1)
    assert tally("plain", src, src + src[3:5]) == Tally(duplicated=2)
    swapped = [*src[:3], src[4], src[3], *src[5:]]
    assert tally("plain", src, swapped) == Tally(reordered=1)
    key, value, headers, ts = src[2]
    for bad in (
        (b"other", value, headers, ts),
        (key, b"v", headers, ts),
        (key, value, headers[:1], ts),
        (key, value, headers, ts + 1),
    ):
        assert tally("plain", src, [*src[:2], bad, *src[3:]]) == Tally(altered=1), bad
    assert tally("plain", src, src + seq("plain", 1, start=99)) == Tally(unexpected=1)
    assert tally("plain", src, [*src, (b"k", b"foreign", (), 0)]) == Tally(unexpected=1)


def test_an_aborted_record_at_the_destination_is_caught() -> None:
    src = seq("txn", 5)
    aborted = content(RecordId("txn", 0, 5), BASE, aborted=True)
    assert tally("txn", src, [*src, aborted]) == Tally(aborted_seen=1)


def test_compaction_on_either_side_is_not_an_anomaly() -> None:
    written = seq("compacted", 64)  # 16 keys, four records each, some tombstones
    latest = {c[0]: c for c in written}
    compacted = [c for c in written if latest[c[0]] is c]
    assert tally("compacted", compacted, written, compacted=True).clean  # the source compacted
    assert tally("compacted", written, compacted, compacted=True).clean  # the destination compacted
    assert tally("compacted", written, list(written), compacted=True).clean


def test_compacted_topic_anomalies_are_still_counted() -> None:
    written = seq("compacted", 64)
    latest = {c[0]: c for c in written}
    compacted = [c for c in written if latest[c[0]] is c]
    # The latest record of a key lost: missing, and the key's state differs.
    lost = tally("compacted", written, written[:-1], compacted=True)
    assert lost.missing == 1
    assert lost.state_differs == 1
    assert tally("compacted", compacted, compacted + compacted[:1], compacted=True).duplicated == 1
    assert tally("compacted", written, written[1:2] + written[:1] + written[2:], compacted=True).reordered == 1
