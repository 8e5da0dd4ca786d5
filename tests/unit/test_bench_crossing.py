"""The bench's cross-cluster bytes: reading ``ss``, telling which connections cross, differencing readings."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import config
from bench.crossing import (
    ELSEWHERE,
    CrossingSampler,
    Endpoint,
    Flow,
    Ledger,
    Link,
    Placement,
    Side,
    TcpSocket,
    Traffic,
    classify,
    cross_traffic,
    normalise_host,
    parse_endpoint,
    parse_ss,
    split_host_port,
    ss_available,
)
from bench.report import cross_cluster_table, footnotes, write_json
from bench.results import RowResult, Throughput
from bench.rows.base import RowContext, RowOptions
from bench.rows.copyloop import CopyLoopRow
from bench.rows.ferryman import FerrymanRow
from bench.rows.mirrormaker import MirrorMakerEosRow

#: ``ss -Htine`` as this machine prints it (trimmed): a librdkafka socket, a JVM's (IPv4-mapped), an IPv6 one
#: with no traffic yet (no counters printed), a TIME-WAIT one (no inode: no process holds it).
_SS = """\
ESTAB 0      329             127.0.0.1:40370          127.0.0.1:30579 timer:(on,204ms,0) ino:4734477 sk:1 cgroup:/ <->
\t ts sack bbr wscale:1,10 rto:204 rtt:3.515/5.77 mss:50910 cwnd:15 bytes_sent:1532065 bytes_acked:1531737 \
bytes_received:6515191755 segs_out:39839 segs_in:119930 data_segs_out:4668 bbr:(bw:135759991904bps,mrtt:0.003) \
send 1738036984bps delivered:4668 app_limited busy:45708ms unacked:1 snd_wnd:101820
ESTAB 0      0      [::ffff:127.0.0.1]:49742 [::ffff:127.0.0.1]:21618 timer:(keepalive,117min,0) ino:4734346 sk:8 <->
\t ts sack bbr wscale:10,1 rto:204 bytes_sent:3000 bytes_retrans:46 bytes_acked:2954 bytes_received:494 segs_out:8
ESTAB 0      0                   [::1]:50000              [::1]:9092 ino:17 sk:9 cgroup:/ <->
\t ts sack cubic wscale:7,7 rto:200 mss:32768 cwnd:10 segs_out:1 segs_in:1
TIME-WAIT 0      0               127.0.0.1:41000          127.0.0.1:30579 timer:(timewait,40sec,0) ino:0 sk:a
"""

_SOURCE = Endpoint("127.0.0.1", 9001)
_DESTINATION = Endpoint("127.0.0.1", 9002)
_BROKERS: dict[Side, frozenset[Endpoint]] = {"source": frozenset({_SOURCE}), "destination": frozenset({_DESTINATION})}
#: Ferryman as deployed: wrapper next to the source, dedupers next to the destination.
_FERRYMAN = Placement("destination", {"ferryman-wrapper": "source", "ferryman-deduper": "destination"})
#: MirrorMaker 2 and the copy loop as deployed: next to the destination.
_NEAR_DESTINATION = Placement("destination")


def _socket(inode: int, local_port: int, peer: Endpoint, sent: int = 0, received: int = 0) -> TcpSocket:
    return TcpSocket(inode, Endpoint("127.0.0.1", local_port), peer, sent, received)


def test_ss_records_are_read_with_their_inode_and_counters() -> None:
    sockets = parse_ss(_SS)
    assert sockets == [
        TcpSocket(4734477, Endpoint("127.0.0.1", 40370), Endpoint("127.0.0.1", 30579), 1531737, 6515191755),
        TcpSocket(4734346, Endpoint("127.0.0.1", 49742), Endpoint("127.0.0.1", 21618), 2954, 494),
        TcpSocket(17, Endpoint("::1", 50000), Endpoint("::1", 9092), 0, 0),
    ]


def test_lines_that_are_no_socket_are_skipped() -> None:
    assert parse_ss("\nsomething odd\nESTAB 0 0 nonsense 127.0.0.1:1 ino:5\n") == []


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("127.0.0.1:9092", Endpoint("127.0.0.1", 9092)),
        ("[::ffff:127.0.0.1]:9092", Endpoint("127.0.0.1", 9092)),  # a JVM's view of the same broker
        ("[::1]:9092", Endpoint("::1", 9092)),
        ("[fe80::1%lo]:22", Endpoint("fe80::1", 22)),
        ("::1:9092", Endpoint("::1", 9092)),  # older ss, no brackets
    ],
)
def test_endpoints_have_one_spelling_per_address(text: str, endpoint: Endpoint) -> None:
    assert parse_endpoint(text) == endpoint


def test_a_host_name_is_kept_as_it_is() -> None:
    assert normalise_host("broker-1.example") == "broker-1.example"


@pytest.mark.parametrize(
    ("entry", "host_port"),
    [
        ("127.0.0.1:9092", ("127.0.0.1", 9092)),
        (" b1.example:9093", ("b1.example", 9093)),
        ("PLAINTEXT://b1:9092", ("b1", 9092)),
        ("[::1]:9092", ("::1", 9092)),
    ],
)
def test_bootstrap_entries_split_into_host_and_port(entry: str, host_port: tuple[str, int]) -> None:
    assert split_host_port(entry) == host_port


def test_a_bootstrap_entry_without_port_is_refused() -> None:
    with pytest.raises(ValueError, match="host:port"):
        split_host_port("broker-1")


def test_ferryman_crosses_with_the_wrappers_destination_traffic_and_the_control_link() -> None:
    deduper_listen = Endpoint("127.0.0.1", 7460)
    sockets = [
        _socket(1, 50001, _SOURCE, 100, 10_000),  # wrapper consumes the source: local
        _socket(2, 50002, _DESTINATION, 9_000, 200),  # wrapper writes staging: crosses
        _socket(3, 50003, deduper_listen, 30, 40),  # wrapper dials the deduper: crosses
        TcpSocket(4, deduper_listen, Endpoint("127.0.0.1", 50003), 40, 30),  # ...the deduper's end of it
        _socket(5, 50005, _DESTINATION, 8_000, 9_500),  # deduper: local
        TcpSocket(6, deduper_listen, Endpoint("127.0.0.1", 60000), 5, 7),  # the bench's status call: elsewhere
        _socket(7, 50007, _DESTINATION, 1, 1),  # someone else's socket (a broker's client): not the row's
    ]
    owners = dict.fromkeys((1, 2, 3), "ferryman-wrapper") | dict.fromkeys((4, 5, 6), "ferryman-deduper")
    assert classify(sockets, owners, _FERRYMAN, _BROKERS) == {
        1: (Link("ferryman-wrapper", "source brokers", crosses=False), Flow(100, 10_000)),
        2: (Link("ferryman-wrapper", "destination brokers", crosses=True), Flow(9_000, 200)),
        3: (Link("ferryman-wrapper", "ferryman-deduper", crosses=True), Flow(30, 40)),
        4: None,  # counted once, at the wrapper's end
        5: (Link("ferryman-deduper", "destination brokers", crosses=False), Flow(8_000, 9_500)),
        6: (Link("ferryman-deduper", ELSEWHERE, crosses=False), Flow(5, 7)),
    }


def test_a_replicator_next_to_the_destination_crosses_with_the_sources_brokers() -> None:
    sockets = [
        TcpSocket(1, Endpoint("127.0.0.1", 50001), parse_endpoint("[::ffff:127.0.0.1]:9001"), 300, 90_000),
        _socket(2, 50002, _DESTINATION, 80_000, 400),
    ]
    reading = classify(sockets, {1: "java", 2: "java"}, _NEAR_DESTINATION, _BROKERS)
    assert reading == {
        1: (Link("java", "source brokers", crosses=True), Flow(300, 90_000)),
        2: (Link("java", "destination brokers", crosses=False), Flow(80_000, 400)),
    }


def test_a_connection_between_two_processes_on_one_side_is_counted_once_and_does_not_cross() -> None:
    a, b = Endpoint("127.0.0.1", 7000), Endpoint("127.0.0.1", 50000)
    sockets = [TcpSocket(1, a, b, 5, 6), TcpSocket(2, b, a, 6, 5)]
    reading = classify(sockets, {1: "ferryman-deduper", 2: "ferryman-deduper"}, _FERRYMAN, _BROKERS)
    assert reading == {1: (Link("ferryman-deduper", "ferryman-deduper", crosses=False), Flow(5, 6)), 2: None}


def _link(peer: str = "destination brokers", crosses: bool = True) -> Link:
    return Link("ferryman-wrapper", peer, crosses)


def test_the_ledger_counts_from_the_first_reading_and_later_sockets_from_zero() -> None:
    ledger = Ledger()
    ledger.update({1: (_link(), Flow(1_000, 50))})
    assert ledger.snapshot().flows == {_link(): Flow(0, 0)}
    ledger.update({1: (_link(), Flow(1_500, 80)), 2: (_link(), Flow(200, 10))})
    assert ledger.snapshot() == Traffic({_link(): Flow(700, 40)}, sockets=2, closed=0)


def test_a_closed_socket_keeps_its_last_reading() -> None:
    ledger = Ledger()
    ledger.update({})
    ledger.update({1: (_link(), Flow(100, 10)), 2: (_link(), Flow(5, 5))})
    ledger.update({2: (_link(), Flow(7, 9))})
    assert ledger.snapshot() == Traffic({_link(): Flow(107, 19)}, sockets=2, closed=1)


def test_a_socket_read_before_its_far_end_was_the_rows_is_forgotten_once_known_as_the_mirrored_end() -> None:
    ledger = Ledger()
    ledger.update({})
    ledger.update({3: (_link(ELSEWHERE, crosses=False), Flow(40, 30))})  # the wrapper's end not seen yet
    ledger.update({3: None, 4: (_link("ferryman-deduper"), Flow(31, 41))})
    assert ledger.snapshot() == Traffic({_link("ferryman-deduper"): Flow(31, 41)}, sockets=1, closed=0)


def test_a_socket_classified_later_moves_to_its_link() -> None:
    ledger = Ledger()
    ledger.update({})
    ledger.update({3: (_link(ELSEWHERE, crosses=False), Flow(10, 10))})
    ledger.update({3: (_link("ferryman-deduper"), Flow(30, 40))})
    assert ledger.snapshot().flows == {_link("ferryman-deduper"): Flow(30, 40)}


def test_a_phase_is_the_difference_of_two_snapshots_and_counts_only_what_crosses() -> None:
    local = _link("source brokers", crosses=False)
    ledger = Ledger()
    ledger.update({})
    ledger.update({1: (_link(), Flow(1_000, 100)), 2: (local, Flow(50, 5_000))})
    before = ledger.snapshot()
    ledger.update({1: (_link(), Flow(3_000, 300)), 2: (local, Flow(60, 9_000)), 3: (_link(), Flow(20, 2))})
    phase = ledger.snapshot().minus(before)
    assert phase == Traffic({local: Flow(10, 4_000), _link(): Flow(2_020, 202)}, sockets=1, closed=0)
    crossed = cross_traffic(phase, records=10)
    assert (crossed.sent_bytes, crossed.received_bytes, crossed.total_bytes) == (2_020, 202, 2_222)
    assert crossed.bytes_per_record == 222.2
    assert crossed.crossing_links == ["ferryman-wrapper to destination brokers"]
    assert set(crossed.by_link) == {"ferryman-wrapper to source brokers", "ferryman-wrapper to destination brokers"}
    assert cross_traffic(phase, records=0).bytes_per_record is None


#: A child that, told to go (a line on stdin), connects to ``port``, sends 5,000 bytes, reads 700 back, says
#: so and waits for stdin to close.
_CLIENT = """
import socket, sys
sys.stdin.readline()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"x" * 5000)
got = 0
while got < 700:
    got += len(s.recv(700 - got))
print("done", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def broker() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A stand-in broker: reads 5,000 bytes from its first connection, answers 700, holds the connection."""
    code = """
import socket, sys
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
got = 0
while got < 5000:
    got += len(conn.recv(5000 - got))
conn.sendall(b"y" * 700)
sys.stdin.read()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_the_sampler_reads_what_a_rows_process_exchanged_with_the_other_clusters_broker(
    broker: tuple[subprocess.Popen[str], int],
) -> None:
    assert ss_available(), "ss (iproute2) is not installed: scripts/bootstrap installs it"
    _server, port = broker
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert client.stdout is not None and client.stdin is not None
    brokers: dict[Side, frozenset[Endpoint]] = {
        "source": frozenset({Endpoint("127.0.0.1", port)}),
        "destination": frozenset(),
    }
    sampler = CrossingSampler({client.pid: "client"}, _NEAR_DESTINATION, brokers)
    try:
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "done"
        traffic = sampler.read()
    finally:
        sampler.stop()
        client.stdin.close()
        client.wait(30)
    # Started before the client connected: the whole exchange counts, each byte once (ss counts the SYN
    # as one byte acknowledged).
    crossed = traffic.crossing()
    assert crossed.sent_bytes in (5_000, 5_001)
    assert crossed.received_bytes in (700, 701)
    assert traffic.flows.keys() == {Link("client", "source brokers", crosses=True)}


def _ctx(compression: str = "none") -> RowContext:
    return RowContext("r1", "src:9092", "dst:9092", ("t",), 1, Path("/tmp"), RowOptions(compression=compression))


def test_each_row_is_placed_as_usually_deployed() -> None:
    ferryman = FerrymanRow(_ctx("lz4")).placement()
    assert (ferryman.side_of("ferryman-wrapper"), ferryman.side_of("ferryman-deduper")) == ("source", "destination")
    assert ferryman.crossing_compression == "staging batches: lz4"
    for row in (CopyLoopRow(_ctx("lz4")), MirrorMakerEosRow(_ctx("lz4"))):
        placement = row.placement()
        assert placement.side_of("java") == placement.side_of("python") == "destination"
        # Their own compression applies on the destination's side: what crosses is as the source wrote it.
        assert placement.crossing_compression == "source batches as written: none"


def test_the_compression_option_sets_every_rows_producer() -> None:
    assert FerrymanRow(_ctx("zstd"))._config([])["wrapper"]["compression_type"] == "zstd"
    assert "zstd" in CopyLoopRow(_ctx("zstd")).argv()
    assert MirrorMakerEosRow(_ctx("zstd")).properties()["target.producer.compression.type"] == "zstd"


@pytest.mark.parametrize("flag", ["--compression", "--staging-compression"])
def test_the_compression_flag_keeps_its_old_name(flag: str) -> None:
    assert config.parse_args([flag, "lz4"]).options.compression == "lz4"


def _throughput(crossed: int | None, records: int = 1_000, closed: int = 0) -> Throughput:
    phase = Traffic({_link(): Flow(crossed, 0)}, sockets=3, closed=closed) if crossed is not None else None
    return Throughput(
        records=records,
        payload_bytes=records * 108,
        first_batch_records=0,
        first_visible_s=1.0,
        steady_s=1.0,
        from_start_s=2.0,
        steady_rps=1.0,
        steady_mbps=1.0,
        from_start_rps=1.0,
        from_start_mbps=1.0,
        cpu_s=1.0,
        cpu_s_per_m=1.0,
        steady_cpu_s_per_m=1.0,
        broker_cpu_s_per_m=None,
        peak_rss_mb=1.0,
        timeline=[],
        cross_cluster=cross_traffic(phase, records) if phase is not None else None,
    )


def _result(name: str, *rounds: Throughput) -> RowResult:
    result = RowResult(name, exactly_once=True, placement=_NEAR_DESTINATION)
    result.throughput, *result.repeats = rounds
    return result


def test_the_table_gives_bytes_per_record_by_round_against_the_payload_and_mirrormaker() -> None:
    results = [
        _result("ferryman", _throughput(150_000), _throughput(130_000, closed=2), _throughput(140_000)),
        _result("mm2-eos", _throughput(120_000), _throughput(120_000), _throughput(110_000)),
    ]
    header, cells = cross_cluster_table(results)
    col = {name: header.index(name) for name in ("MB", "B/rec", "B/rec by round", "median", "x payload", "vs mm2-eos")}
    ferryman = cells[0]
    assert ferryman[col["MB"]] == "0.1"
    assert ferryman[col["B/rec"]] == "150.0"
    assert ferryman[col["B/rec by round"]] == "150.0 / 130.0 / 140.0"
    assert ferryman[col["median"]] == "140.0"
    assert ferryman[col["x payload"]] == "1.30x"  # 140 of 108
    assert ferryman[col["vs mm2-eos"]] == "1.17x"  # 140 against 120
    assert cells[1][col["vs mm2-eos"]] == "1.00x"
    assert any("ferryman: 2 of its sockets closed" in line for line in footnotes(results))


def test_compressed_crossing_figures_are_said_to_flatter() -> None:
    plain = _result("mm2", _throughput(120_000))
    plain.placement = Placement("destination", crossing_compression="source batches as written: none")
    staged = _result("ferryman", _throughput(30_000))
    staged.placement = Placement("destination", crossing_compression="staging batches: lz4")
    notes = [line for line in footnotes([plain, staged]) if "compresses far less" in line]
    assert len(notes) == 1
    assert notes[0].startswith("cross-cluster bytes: ferryman: what crosses is compressed")


def test_without_figures_there_is_no_table() -> None:
    assert cross_cluster_table([_result("copyloop", _throughput(None))]) == ([], [])


def test_the_raw_figures_hold_the_crossing_bytes_and_the_placement(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    write_json(out, {}, [_result("mm2", _throughput(120_000))])
    row = json.loads(out.read_text())["rows"][0]
    crossed = row["throughput"]["cross_cluster"]
    assert crossed["bytes_per_record"] == 120.0
    assert crossed["by_link"]["ferryman-wrapper to destination brokers"] == {
        "sent_bytes": 120_000,
        "received_bytes": 0,
        "total_bytes": 120_000,
    }
    assert row["placement"]["side"] == "destination"
