"""Bytes that cross between the two clusters' regions: per-socket TCP counters of a row's processes.

Cross-region bytes are what users pay for (issue 29), so every row is read as it
is deployed (``Placement``): Ferryman's wrapper next to the source, writing to
the destination cluster's brokers and dialling the dedupers, which run next to the
destination; MirrorMaker 2 and the copy loop next to the destination, fetching
from the source cluster's brokers. The method is the same for every row:

1. A reading lists the machine's TCP sockets with their kernel counters
   (``ss -Htine``: ``bytes_acked``, ``bytes_received`` and the socket's inode) and
   keeps those the row's processes hold (``/proc/<pid>/fd`` of every process of
   their trees).
2. Each socket is classified by its peer (``classify``): a broker of the source or
   of the destination cluster (their endpoints from metadata, ``broker_endpoints``),
   or the far end of a connection between two of the row's own processes
   (Ferryman's control link). A connection crosses when its two ends run next to
   different clusters: a program next to the source talking to the destination's
   brokers or to a program next to the destination, and the other way round.
3. A ``Ledger`` keeps each socket's counters at the first reading it saw it in
   (sockets that appear later start from zero: they opened after it) and at the
   latest; a phase's traffic is the difference of two snapshots (``Traffic.minus``).

Counted: TCP payload in both directions (requests and responses both cross),
each byte once: ``bytes_acked`` leaves out retransmissions, which on loopback are
this machine's, not the replicator's (a WAN adds its own). Not counted: TCP/IP
headers, TLS (none here). A socket that closes keeps the counters of its last
reading, so what it carried after that (at most one poll interval) is lost; the
rows hold long-lived connections, and the bench polls every second to keep the
short-lived ones (bootstrap, admin clients) nearly whole.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import psutil
from confluent_kafka.admin import AdminClient

Side = Literal["source", "destination"]
#: How often the sampler reads the sockets between the bench's own readings: a socket that closes
#: loses what it carried after its last reading, at most this long (see the module docstring).
_POLL_INTERVAL_S = 1.0
#: Budget of one ``ss`` run (a netlink dump of the machine's TCP sockets: milliseconds here).
_SS_TIMEOUT_S = 10.0
#: ``ss``: no header, TCP, internal TCP information (the byte counters), numeric, extended (the inode).
_SS_ARGS = ("-Htine",)
#: The peer of a socket that is neither a broker of either cluster nor one of the row's processes
#: (the bench's status calls to a deduper, a metrics scrape): local by definition, never crosses.
ELSEWHERE = "elsewhere"


class Endpoint(NamedTuple):
    """One end of a TCP connection."""

    host: str
    """An IP address, normalised (``normalise_host``)."""
    port: int


def normalise_host(host: str) -> str:
    """``host`` as one spelling per address: IPv4-mapped IPv6 as IPv4, no zone, IPv6 compressed.

    A JVM's sockets show as ``::ffff:127.0.0.1``, librdkafka's as ``127.0.0.1``: the same broker.
    A name that is not an address is returned as it is.
    """
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def parse_endpoint(text: str) -> Endpoint:
    """An endpoint as ``ss`` prints it: ``127.0.0.1:9092``, ``[::ffff:127.0.0.1]:9092``, ``[::1]:9092``.

    Raises:
        ValueError: no port, or a port that is not a number.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"not host:port: {text!r}")
    return Endpoint(normalise_host(host.removeprefix("[").removesuffix("]")), int(port))


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of the machine as ``ss`` reported it."""

    inode: int
    """The socket's inode: what ``/proc/<pid>/fd`` links to (``socket:[<inode>]``)."""
    local: Endpoint
    peer: Endpoint
    acked_bytes: int
    """Payload sent and acknowledged by the peer (retransmissions counted once)."""
    received_bytes: int
    """Payload received."""


def _counters(tokens: Iterable[str]) -> dict[str, str]:
    """The ``name:value`` tokens of an ``ss`` record, by name (the first of each name)."""
    out: dict[str, str] = {}
    for token in tokens:
        name, sep, value = token.partition(":")
        if sep and name not in out:
            out[name] = value
    return out


def parse_ss(text: str) -> list[TcpSocket]:
    """The sockets in the output of ``ss -Htine`` that belong to a process (inode not 0).

    A record is a line ``State Recv-Q Send-Q Local Peer [ino:N ...]`` followed by
    indented lines of TCP information; ``ss`` prints a counter only when it is not
    zero, so a missing one is 0. Records it cannot read (no endpoints) are skipped.
    """
    records: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace() and records:
            records[-1].extend(line.split())
        else:
            records.append(line.split())
    out: list[TcpSocket] = []
    for tokens in records:
        if len(tokens) < 5:
            continue
        try:
            local, peer = parse_endpoint(tokens[3]), parse_endpoint(tokens[4])
        except ValueError:
            continue
        counters = _counters(tokens[5:])
        inode = int(counters.get("ino", "0"))
        if inode == 0:  # TIME-WAIT and orphans: no process holds them
            continue
        out.append(
            TcpSocket(
                inode,
                local,
                peer,
                int(counters.get("bytes_acked", "0")),
                int(counters.get("bytes_received", "0")),
            )
        )
    return out


@dataclass(frozen=True)
class Placement:
    """Which cluster each of a row's programs runs next to, as the replicator is usually deployed."""

    side: Side
    """Where the row's programs run, all but those named in ``program_sides``."""
    program_sides: Mapping[str, Side] = field(default_factory=dict)
    """Programs placed otherwise, or named for the report, by the name they were launched as
    (``Row.programs()``: ``ferryman-wrapper``)."""
    crossing_compression: str = ""
    """How what crosses is compressed, e.g. ``"staging batches: lz4"``."""

    def side_of(self, program: str) -> Side:
        """The cluster ``program`` runs next to."""
        return self.program_sides.get(program, self.side)


@dataclass(frozen=True, order=True)
class Link:
    """What one of a row's programs talks to, and whether that crosses between the regions."""

    program: str
    peer: str
    """``"source brokers"``, ``"destination brokers"``, another program of the row, or ``ELSEWHERE``."""
    crosses: bool

    def __str__(self) -> str:
        return f"{self.program} to {self.peer}"


@dataclass(frozen=True)
class Flow:
    """Payload bytes of a link, each way, as seen from the program's end."""

    sent_bytes: int = 0
    received_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Both ways: requests and responses both cross."""
        return self.sent_bytes + self.received_bytes

    def plus(self, other: Flow) -> Flow:
        """The two flows together."""
        return Flow(self.sent_bytes + other.sent_bytes, self.received_bytes + other.received_bytes)

    def minus(self, other: Flow) -> Flow:
        """This flow less ``other`` (an earlier reading of the same sockets)."""
        return Flow(self.sent_bytes - other.sent_bytes, self.received_bytes - other.received_bytes)


def _brokers_at(peer: Endpoint, brokers: Mapping[Side, frozenset[Endpoint]]) -> Side | None:
    for side, endpoints in brokers.items():
        if peer in endpoints:
            return side
    return None


def classify(
    sockets: Iterable[TcpSocket],
    owners: Mapping[int, str],
    placement: Placement,
    brokers: Mapping[Side, frozenset[Endpoint]],
) -> dict[int, tuple[Link, Flow] | None]:
    """Link and counters of every socket the row's processes hold, by inode.

    A connection between two of the row's processes has a socket at each end with
    the same bytes mirrored; it is counted once, at the end whose program runs
    next to the source (both next to the same cluster: the end with the lower
    local endpoint), and the other end maps to None.

    Args:
        sockets: every TCP socket of the machine (``parse_ss``).
        owners: the program holding each of the row's sockets, by inode.
        placement: the cluster each program runs next to.
        brokers: the endpoints of each cluster's brokers (``broker_endpoints``).
    """
    ours = [s for s in sockets if s.inode in owners]
    # The far end of a connection between two of the row's processes: its (local, peer) is ours reversed.
    ends = {(s.local, s.peer): owners[s.inode] for s in ours}
    out: dict[int, tuple[Link, Flow] | None] = {}
    for s in ours:
        program = owners[s.inode]
        side = placement.side_of(program)
        flow = Flow(s.acked_bytes, s.received_bytes)
        if (at := _brokers_at(s.peer, brokers)) is not None:
            out[s.inode] = (Link(program, f"{at} brokers", crosses=at != side), flow)
        elif (other := ends.get((s.peer, s.local))) is not None:
            other_side = placement.side_of(other)
            mirrored = s.local > s.peer if side == other_side else side != "source"
            out[s.inode] = None if mirrored else (Link(program, other, crosses=side != other_side), flow)
        else:
            out[s.inode] = (Link(program, ELSEWHERE, crosses=False), flow)
    return out


@dataclass(frozen=True)
class Traffic:
    """What the row's sockets carried from the ledger's first reading to one of its snapshots."""

    flows: Mapping[Link, Flow]
    sockets: int = 0
    """Sockets seen, each once."""
    closed: int = 0
    """Of which were gone at the snapshot: counted up to their last reading."""

    def minus(self, earlier: Traffic) -> Traffic:
        """The traffic between ``earlier`` (a snapshot of the same ledger) and this one."""
        links = sorted(set(self.flows) | set(earlier.flows))
        return Traffic(
            {link: self.flows.get(link, Flow()).minus(earlier.flows.get(link, Flow())) for link in links},
            self.sockets - earlier.sockets,
            self.closed - earlier.closed,
        )

    def crossing(self) -> Flow:
        """The flows that cross, summed."""
        total = Flow()
        for link, flow in self.flows.items():
            if link.crosses:
                total = total.plus(flow)
        return total


class Ledger:
    """Each socket's counters at its first reading and at its latest, across readings."""

    def __init__(self) -> None:
        self._first: dict[int, Flow] = {}
        self._last: dict[int, tuple[Link, Flow]] = {}
        self._gone: set[int] = set()
        self._readings = 0

    def update(self, reading: Mapping[int, tuple[Link, Flow] | None]) -> None:
        """Take a reading (``classify``'s answer).

        A socket not in the first reading opened after it and starts from zero; one
        missing from this reading has closed (or is not held any more) and keeps its
        last counters. A socket read as the mirrored end of a connection counted at
        its other end (None) is forgotten: a reading taken while the other end was
        not yet held by a process of the row may have counted it.
        """
        for inode, read in reading.items():
            if read is None:
                self._first.pop(inode, None)
                self._last.pop(inode, None)
                continue
            link, flow = read
            if inode not in self._first:
                self._first[inode] = flow if self._readings == 0 else Flow()
            self._last[inode] = (link, flow)
        self._gone = set(self._last) - set(reading)
        self._readings += 1

    def snapshot(self) -> Traffic:
        """What every socket carried since the first reading, summed by link."""
        flows: dict[Link, Flow] = {}
        for inode, (link, flow) in self._last.items():
            flows[link] = flows.get(link, Flow()).plus(flow.minus(self._first[inode]))
        return Traffic(dict(sorted(flows.items())), len(self._last), len(self._gone))


@dataclass(frozen=True)
class CrossTraffic:
    """What crossed between the clusters' regions during one phase of a row, the row placed as deployed."""

    records: int
    """Records the phase copied: the divisor of ``bytes_per_record``."""
    sent_bytes: int
    """Payload of the crossing links, sent from the row's end (for the control link: the wrapper's)."""
    received_bytes: int
    """...and received at the row's end."""
    by_link: Mapping[str, Flow]
    """Every link of the row's processes in the phase, crossing or not (what another placement would
    cross), e.g. ``"ferryman-wrapper to destination brokers"``."""
    crossing_links: list[str]
    """The links of ``by_link`` that cross."""
    sockets_opened: int
    """Sockets of the row's processes that opened in the phase."""
    sockets_closed: int
    """Sockets that closed in the phase, counted up to their last reading (at most a second before)."""

    @property
    def total_bytes(self) -> int:
        """Both ways."""
        return self.sent_bytes + self.received_bytes

    @property
    def bytes_per_record(self) -> float | None:
        """Crossing bytes per record copied; None when nothing was copied."""
        return self.total_bytes / self.records if self.records else None


def cross_traffic(phase: Traffic, records: int) -> CrossTraffic:
    """The crossing figures of ``phase`` (a snapshot difference), per ``records`` copied in it."""
    crossed = phase.crossing()
    return CrossTraffic(
        records=records,
        sent_bytes=crossed.sent_bytes,
        received_bytes=crossed.received_bytes,
        by_link={str(link): flow for link, flow in phase.flows.items()},
        crossing_links=[str(link) for link in phase.flows if link.crosses],
        sockets_opened=phase.sockets,
        sockets_closed=phase.closed,
    )


def split_host_port(entry: str) -> tuple[str, int]:
    """``host:port`` of a bootstrap entry: ``b1:9092``, ``[::1]:9092``, ``PLAINTEXT://b1:9092``.

    Raises:
        ValueError: no port, or a port that is not a number.
    """
    host, sep, port = entry.strip().rpartition("://")[2].rpartition(":")
    if not sep or not host:
        raise ValueError(f"not host:port: {entry!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def broker_endpoints(bootstrap: str, timeout_s: float) -> frozenset[Endpoint]:
    """Every endpoint the cluster's clients may connect to: the bootstrap servers and every broker.

    Brokers are taken from the cluster's metadata (a multi-broker cluster's
    bootstrap list need not name them all), each host resolved to all its addresses.

    Raises:
        KafkaException: no metadata within ``timeout_s``.
        OSError: a host does not resolve.
    """
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout_s)
    hosts = [split_host_port(e) for e in bootstrap.split(",") if e.strip()]
    # BrokerMetadata declares host as None (its __init__ default); metadata fills it with a string.
    hosts += [(str(b.host), b.port) for b in metadata.brokers.values()]
    out: set[Endpoint] = set()
    for host, port in hosts:
        for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            out.add(Endpoint(normalise_host(str(sockaddr[0])), port))
    return frozenset(out)


def ss_available() -> bool:
    """Whether ``ss`` (iproute2), which reads the sockets' counters, is installed."""
    return shutil.which("ss") is not None


def _socket_inodes(pid: int) -> list[int]:
    """Inodes of the sockets ``pid`` holds; none once it is gone."""
    fd_dir = f"/proc/{pid}/fd"
    out: list[int] = []
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:  # closed in between
            continue
        if target.startswith("socket:["):
            out.append(int(target[8:-1]))
    return out


class CrossingSampler:
    """Reads the sockets of a row's process trees every second on a thread, into a ``Ledger``.

    The first reading is taken at construction: sockets open then count from there,
    later ones from zero. ``read()`` takes a reading now and returns the ledger's
    snapshot; the traffic of a phase is the difference of two.

    Args:
        roots: the row's processes (the root of each tree), with the program each was launched as.
        placement: the cluster each program runs next to.
        brokers: the endpoints of each cluster's brokers.

    Raises:
        subprocess.CalledProcessError: ``ss`` failed (at the first reading).
    """

    def __init__(
        self, roots: Mapping[int, str], placement: Placement, brokers: Mapping[Side, frozenset[Endpoint]]
    ) -> None:
        self._roots: list[tuple[psutil.Process, str]] = []
        for pid, program in roots.items():
            try:
                self._roots.append((psutil.Process(pid), program))
            except psutil.NoSuchProcess:
                continue
        self._placement = placement
        self._brokers = brokers
        self._ledger = Ledger()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.read()
        self._thread = threading.Thread(target=self._run, name="crossing-sampler", daemon=True)
        self._thread.start()

    def _owners(self) -> dict[int, str]:
        """The program of every socket the trees hold, by inode (a child's sockets are its root's program's)."""
        owners: dict[int, str] = {}
        for root, program in self._roots:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in procs:
                owners.update(dict.fromkeys(_socket_inodes(proc.pid), program))
        return owners

    def read(self) -> Traffic:
        """Take a reading now; return what the row's sockets carried since the first."""
        with self._lock:
            # Owners first: a socket that opens between the two reads is missing from this reading, not
            # misattributed; the next reading has it.
            owners = self._owners()
            out = subprocess.run(["ss", *_SS_ARGS], capture_output=True, text=True, check=True, timeout=_SS_TIMEOUT_S)
            self._ledger.update(classify(parse_ss(out.stdout), owners, self._placement, self._brokers))
            return self._ledger.snapshot()

    def _run(self) -> None:
        while not self._stop.wait(_POLL_INTERVAL_S):
            try:
                self.read()
            except (subprocess.SubprocessError, OSError):
                continue  # a missed poll only makes a closing socket's last second less sure

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
