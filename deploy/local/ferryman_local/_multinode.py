"""Clusters of several Kafka nodes on loopback: one KRaft quorum, every node a broker and a controller.

A cluster that must lose a broker while records flow (the transaction coordinator's, say) needs more
than one node. With three, every topic (internal ones included) is replicated three times and needs two
in-sync copies to accept a write, and the quorum keeps a controller with two of three voters: one node may
be down while transactions, group offset commits and ``acks=all`` writes go on.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ferryman_local._broker import (
    JVM_OPTIONS,
    BrokerProcess,
    Probe,
    brokers_listed,
    discard_data_at_exit,
    groups_ready,
    port_open,
    transactions_ready,
    wait_ready,
)
from ferryman_local._cluster import (
    ProxiedListener,
    broker_properties,
    check_cluster_name,
    check_kafka_version,
    new_cluster_id,
)
from ferryman_local._errors import ClusterStartError, HarnessError
from ferryman_local._maven import KAFKA_VERSION, ensure_kafka_jars, require_tool
from ferryman_local._ports import reserve_port

_log = logging.getLogger("ferryman_local")
_client_log = logging.getLogger("ferryman_local.librdkafka")

_STATE_FILE = "cluster.json"
# Three JVMs starting side by side on 2 cores take ~3x one (and other tests may be running):
# twice the single-node budget.
_READY_TIMEOUT_S = 180.0
# A restarted node replays its metadata log and catches up with the quorum before it registers; one JVM.
_RESTART_TIMEOUT_S = 90.0
# How often wait_in_sync re-reads metadata: ISR changes take the replica lag checks' seconds, not less.
_ISR_POLL_S = 0.5


def replication_properties(nodes: int) -> dict[str, str]:
    """Replication settings of a cluster of ``nodes`` nodes (they override ``SINGLE_NODE_PROPERTIES``).

    Every topic gets ``min(nodes, 3)`` replicas and needs one fewer in sync (at least one) to accept a
    write, so a cluster of three or more keeps working with one node down.
    """
    replicas = min(nodes, 3)
    min_isr = max(1, replicas - 1)
    return {
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_isr),
    }


@dataclass(frozen=True)
class ClusterNode:
    """One node of a ``MultiNodeCluster``: its id and where it listens. Stays the same across restarts."""

    node_id: int
    """``node.id``: broker id in metadata and voter id in the quorum."""
    port: int
    """PLAINTEXT (client) listener port on 127.0.0.1."""
    controller_port: int
    """CONTROLLER listener port; KRaft stores it in the voter set, so it must not change."""
    directory_id: str
    """Id of the node's metadata log dir, part of its identity as a voter (``--initial-controllers``)."""
    proxied: ProxiedListener | None = None
    """The node's ``PROXIED`` listener, advertised at a proxy's address (``start(..., proxied=True)``)."""

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``: this node alone."""
        return f"127.0.0.1:{self.port}"


def node_properties(
    node: ClusterNode, nodes: Sequence[ClusterNode], *, data_dir: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The ``server.properties`` of one node of a multi-node cluster.

    Args:
        node: the node the file is for.
        nodes: every node of the cluster (all of them controllers, so the quorum's bootstrap).
        data_dir: the node's ``log.dirs``.
        extra: properties that override or add to the defaults.

    Returns:
        Property names to values, in file order.
    """
    return broker_properties(
        port=node.port,
        controller_port=node.controller_port,
        data_dir=data_dir,
        proxied=node.proxied,
        extra={
            "node.id": str(node.node_id),
            "controller.quorum.bootstrap.servers": ",".join(f"127.0.0.1:{n.controller_port}" for n in nodes),
            **replication_properties(len(nodes)),
            **dict(extra or {}),
        },
    )


def initial_controllers(nodes: Sequence[ClusterNode]) -> str:
    """The ``--initial-controllers`` value that formats every node: ``id@host:port:directory-id,...``."""
    return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}:{n.directory_id}" for n in nodes)


@dataclass(frozen=True)
class _MultiNodeState:
    """What must stay the same across restarts of one multi-node cluster, persisted in its work dir."""

    name: str
    cluster_id: str
    kafka_version: str
    nodes: tuple[ClusterNode, ...]

    @classmethod
    def load(cls, path: Path) -> _MultiNodeState:
        data: dict[str, Any] = json.loads(path.read_text())
        if "nodes" not in data:
            raise ClusterStartError(f"{path} describes a single-node cluster; start it with LocalCluster")
        return cls(
            name=str(data["name"]),
            cluster_id=str(data["cluster_id"]),
            kafka_version=str(data["kafka_version"]),
            nodes=tuple(
                ClusterNode(
                    node_id=int(n["node_id"]),
                    port=int(n["port"]),
                    controller_port=int(n["controller_port"]),
                    directory_id=str(n["directory_id"]),
                    # Absent from state files written before the PROXIED listener existed.
                    proxied=ProxiedListener(int(n["proxied"]["port"]), int(n["proxied"]["advertised_port"]))
                    if n.get("proxied")
                    else None,
                )
                for n in data["nodes"]
            ),
        )

    def save(self, path: Path) -> None:
        data = {
            "name": self.name,
            "cluster_id": self.cluster_id,
            "kafka_version": self.kafka_version,
            "nodes": [
                {
                    "node_id": n.node_id,
                    "port": n.port,
                    "controller_port": n.controller_port,
                    "directory_id": n.directory_id,
                    "proxied": None
                    if n.proxied is None
                    else {"port": n.proxied.port, "advertised_port": n.proxied.advertised_port},
                }
                for n in self.nodes
            ],
        }
        path.write_text(json.dumps(data, indent=2) + "\n")


class MultiNodeCluster:
    """A KRaft cluster of N nodes on 127.0.0.1, each a broker and a controller in one JVM.

    Create it with ``MultiNodeCluster.start(name, nodes=3)``. Single nodes can
    then be crashed (``kill``), shut down (``stop_node``) and brought back
    (``restart``) on the same ports with the same data; ``stop()`` shuts every
    node down. Used as a context manager it stops on exit.

    The work dir holds ``cluster.json`` (id, ports and directory ids, so the
    same dir can be started again later) and one ``node-<id>/`` per node with
    its ``server.properties``, ``data/``, ``stdout.log`` and ``logs/server.log``.
    No JVM outlives the Python process that started it.

    Attributes:
        name: a label for humans (log lines).
        bootstrap_servers: every node's ``127.0.0.1:<port>``, comma-separated.
        cluster_id: the KRaft cluster id, as ``AdminClient.describe_cluster()`` reports it.
        work_dir: data, configuration and logs of all nodes.
        nodes: the nodes, by ascending id (1..N).
    """

    def __init__(
        self, state: _MultiNodeState, work_dir: Path, jars: Path, extra_properties: Mapping[str, str] | None
    ) -> None:
        """Use ``MultiNodeCluster.start``; this only holds the parts together."""
        self.name = state.name
        self.cluster_id = state.cluster_id
        self.work_dir = work_dir
        self.nodes = state.nodes
        self.bootstrap_servers = ",".join(n.bootstrap_servers for n in state.nodes)
        self._extra = dict(extra_properties or {})
        self._brokers = {
            n.node_id: BrokerProcess(
                f"{state.name}/node-{n.node_id}",
                work_dir / f"node-{n.node_id}",
                jars,
                port=n.port,
                controller_port=n.controller_port,
            )
            for n in state.nodes
        }
        self._jars = jars
        self._lock = threading.RLock()

    @classmethod
    def start(
        cls,
        name: str,
        *,
        nodes: int = 3,
        work_dir: Path | None = None,
        extra_properties: Mapping[str, str] | None = None,
        ready_timeout_s: float = _READY_TIMEOUT_S,
        proxied: bool = False,
    ) -> MultiNodeCluster:
        """Start every node and return once the cluster serves metadata, groups and transactions.

        A fresh work dir is formatted with a new cluster id, new ports and a
        quorum of all nodes; a work dir that already holds a multi-node
        cluster (``cluster.json``) starts that cluster again (``nodes`` is
        then ignored). A temp work dir (no ``work_dir`` given) loses its data
        when the Python process exits; its logs stay for post-mortems.

        Args:
            name: label of the cluster, letters, digits, ``.``, ``_`` and ``-``.
            nodes: how many nodes (each a broker and a controller voter).
            work_dir: where data, configuration and logs go; default a new temp dir.
            extra_properties: broker properties added to or overriding the defaults
                (``SINGLE_NODE_PROPERTIES`` with ``replication_properties(nodes)``).
            ready_timeout_s: budget for the JVMs' start and the readiness probes
                (jar resolution and storage formatting come before it).
            proxied: give every node of a fresh cluster a ``PROXIED`` listener advertised at a
                port reserved for a proxy (``ClusterNode.proxied``); the caller runs the proxies
                (``proxied_bootstrap_servers`` only works through them).

        Returns:
            The running cluster.

        Raises:
            ToolMissingError: ``java`` or ``mvn`` is not installed.
            JarResolutionError: the Kafka jars could not be resolved.
            ClusterStartError: formatting failed, or a node exited or the
                cluster was not ready in time (the message ends with log tails).
        """
        check_cluster_name(name)
        if nodes < 1:
            raise HarnessError(f"cluster {name}: nodes must be at least 1, not {nodes}")
        jars = ensure_kafka_jars()
        temporary = work_dir is None
        wd = (work_dir or Path(tempfile.mkdtemp(prefix=f"ferryman-{name}-"))).resolve()
        wd.mkdir(parents=True, exist_ok=True)
        state_file = wd / _STATE_FILE
        if state_file.exists():
            state = _MultiNodeState.load(state_file)
            check_kafka_version(state.kafka_version, wd)
            state = _MultiNodeState(name, state.cluster_id, state.kafka_version, state.nodes)
        elif any(wd.glob("node-*/data/meta.properties")):
            raise ClusterStartError(f"{wd} holds Kafka data but no {_STATE_FILE}; delete it or pick another dir")
        else:
            members = tuple(
                ClusterNode(
                    node_id=i,
                    port=reserve_port(),
                    controller_port=reserve_port(),
                    directory_id=new_cluster_id(),
                    proxied=ProxiedListener(reserve_port(), reserve_port()) if proxied else None,
                )
                for i in range(1, nodes + 1)
            )
            state = _MultiNodeState(name, new_cluster_id(), KAFKA_VERSION, members)
        cluster = cls(state, wd, jars, extra_properties)
        if temporary:
            for broker in cluster._brokers.values():
                discard_data_at_exit(broker)
        format_start = time.monotonic()
        cluster._format_all()
        _log.info("%s: storage of %d nodes ready in %.1fs", name, len(state.nodes), time.monotonic() - format_start)
        state.save(state_file)
        try:
            for node in state.nodes:
                cluster._launch(node.node_id)
            cluster._wait_ready(
                [(f"node {n.node_id} accepts connections", functools.partial(port_open, n.port)) for n in state.nodes]
                + [("metadata lists every node", cluster._listed(cluster.bootstrap_servers, cluster.node_ids))],
                ready_timeout_s,
            )
        except BaseException:
            cluster.kill_all()
            raise
        return cluster

    @property
    def proxied_bootstrap_servers(self) -> str:
        """Every node's advertised ``PROXIED`` address, comma-separated (clients that must go through proxies).

        Raises:
            HarnessError: the cluster was started without ``proxied=True``.
        """
        if any(n.proxied is None for n in self.nodes):
            raise HarnessError(f"{self.name} has no PROXIED listener; start it with proxied=True")
        return ",".join(f"127.0.0.1:{n.proxied.advertised_port}" for n in self.nodes if n.proxied is not None)

    @property
    def node_ids(self) -> list[int]:
        """Every node's id, ascending."""
        return [n.node_id for n in self.nodes]

    @property
    def running_nodes(self) -> list[int]:
        """The ids of the nodes whose JVM runs, ascending."""
        return [i for i, b in sorted(self._brokers.items()) if b.pid is not None]

    def node(self, node_id: int) -> ClusterNode:
        """The node with this id.

        Raises:
            HarnessError: the cluster has no such node.
        """
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise HarnessError(f"{self.name} has nodes {self.node_ids}, not {node_id}")

    def pid(self, node_id: int) -> int | None:
        """Process id of the node's JVM while it runs, else None."""
        return self._broker(node_id).pid

    def node_dir(self, node_id: int) -> Path:
        """Work dir of one node: its ``server.properties``, ``data/``, ``stdout.log`` and ``logs/``."""
        return self._broker(node_id).work_dir

    def server_log(self, node_id: int) -> Path:
        """The node's broker log (WARN and above, plus start-up and shutdown lines)."""
        return self._broker(node_id).server_log

    def active_controller(self, timeout_s: float = 30.0) -> int:
        """Id of the node that leads the KRaft quorum now: the active controller.

        Asks the running nodes' controllers with Kafka's own ``kafka-metadata-quorum`` tool (a JVM, ~1.5 s).

        Raises:
            HarnessError: the tool failed or named no leader.
        """
        controllers = ",".join(f"127.0.0.1:{self.node(i).controller_port}" for i in self.running_nodes)
        java = [require_tool("java"), *JVM_OPTIONS, "-cp", f"{self._jars}/*"]
        tool = ["org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-controller", controllers]
        done = subprocess.run(
            [*java, *tool, "describe", "--status"], check=False, capture_output=True, text=True, timeout=timeout_s
        )
        leader = re.search(r"^LeaderId:\s+(\d+)$", done.stdout, re.MULTILINE)
        if done.returncode != 0 or leader is None:
            raise HarnessError(
                f"{self.name}: kafka-metadata-quorum named no leader (exit {done.returncode}): {done.stderr[-2000:]}"
            )
        return int(leader.group(1))

    def kill(self, node_id: int) -> None:
        """SIGKILL one node, as a crash would. Idempotent."""
        with self._lock:
            self._broker(node_id).kill()
            _log.info("%s: node %d killed", self.name, node_id)

    def stop_node(self, node_id: int, timeout_s: float = 20.0) -> None:
        """Shut one node down in order (SIGTERM: leaderships move away first), SIGKILL after timeout_s. Idempotent.

        Args:
            node_id: the node.
            timeout_s: how long the controlled shutdown may take.
        """
        with self._lock:
            self._broker(node_id).stop(timeout_s)

    def restart(self, node_id: int, ready_timeout_s: float = _RESTART_TIMEOUT_S) -> None:
        """Stop one node if it runs, then start it on the same ports with the same data.

        Returns once the node is back as a live broker (registered, unfenced) and the cluster serves
        transactions and groups. Its replicas may still be catching up: see ``wait_in_sync``.

        Args:
            node_id: the node.
            ready_timeout_s: budget for the JVM start and the readiness probes.

        Raises:
            ClusterStartError: the node exited or was not ready in time.
        """
        node = self.node(node_id)
        with self._lock:
            self.stop_node(node_id)
            self._launch(node_id)
            self._wait_ready(
                [
                    (f"node {node_id} accepts connections", functools.partial(port_open, node.port)),
                    (f"node {node_id} is a live broker again", self._listed(node.bootstrap_servers, [node_id])),
                ],
                ready_timeout_s,
            )

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut every node down in order (concurrently), SIGKILL after timeout_s. Idempotent.

        Args:
            timeout_s: how long each controlled shutdown may take.
        """
        with self._lock, ThreadPoolExecutor(len(self._brokers), thread_name_prefix="ferryman-local-stop") as pool:
            # Concurrently: a node shutting down alone waits for the others' controllers to accept its
            # controlled shutdown, and the last ones would wait on a quorum already gone.
            for f in [pool.submit(b.stop, timeout_s) for b in self._brokers.values()]:
                f.result()

    def kill_all(self) -> None:
        """SIGKILL every node. Idempotent."""
        with self._lock:
            for b in self._brokers.values():
                b.kill()

    def wait_in_sync(self, timeout_s: float = 60.0) -> None:
        """Wait until every partition of every topic (internal ones too) has all its replicas in sync.

        After ``restart`` this is when the node has fully rejoined: it holds an up-to-date copy of
        everything it hosts, so another node may be lost without losing a committed record.

        Raises:
            AssertionError: some partition was still under-replicated after timeout_s (the message lists them).
        """
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers}, logger=_client_log)
        deadline = time.monotonic() + timeout_s
        lagging: list[str] = []
        while True:
            try:
                metadata = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
            except KafkaException as exc:  # while a node is away metadata may fail: try again
                lagging = [f"metadata: {exc}"]
            else:
                lagging = [
                    f"{t.topic}/{p.id} isr={sorted(p.isrs)} replicas={sorted(p.replicas)}"
                    for t in metadata.topics.values()
                    for p in t.partitions.values()
                    if p.leader < 0 or set(p.isrs) != set(p.replicas)
                ]
                if not lagging:
                    return
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{self.name}: {len(lagging)} partitions not fully in sync after {timeout_s:g}s: {lagging[:10]}"
                )
            time.sleep(_ISR_POLL_S)

    def __enter__(self) -> MultiNodeCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        pids = {i: self.pid(i) for i in self.node_ids}
        return f"MultiNodeCluster(name={self.name!r}, bootstrap_servers={self.bootstrap_servers!r}, pids={pids})"

    # -- internals -------------------------------------------------------------------------------

    def _broker(self, node_id: int) -> BrokerProcess:
        broker = self._brokers.get(node_id)
        if broker is None:
            raise HarnessError(f"{self.name} has nodes {self.node_ids}, not {node_id}")
        return broker

    def _write_config(self, node: ClusterNode) -> None:
        broker = self._broker(node.node_id)
        broker.write_config(node_properties(node, self.nodes, data_dir=broker.data_dir, extra=self._extra))

    def _format_all(self) -> None:
        voters = initial_controllers(self.nodes)
        for node in self.nodes:
            self._write_config(node)

        def one(node: ClusterNode) -> None:
            self._broker(node.node_id).format(self.cluster_id, ["--initial-controllers", voters])

        # Each format is a JVM of its own (~2 s); side by side they take the time of one or two.
        with ThreadPoolExecutor(len(self.nodes), thread_name_prefix="ferryman-local-format") as pool:
            for f in [pool.submit(one, n) for n in self.nodes]:
                f.result()

    def _launch(self, node_id: int) -> None:
        self._write_config(self.node(node_id))
        self._broker(node_id).launch()

    def _listed(self, bootstrap: str, node_ids: Sequence[int]) -> Probe:
        return functools.partial(brokers_listed, bootstrap, self.cluster_id, list(node_ids))

    def _wait_ready(self, phases: list[tuple[str, Probe]], timeout_s: float) -> None:
        """Wait for phases, then for the transaction and the group coordinator to serve."""
        bootstrap = self.bootstrap_servers
        wait_ready(
            self.name,
            [
                *phases,
                # The first transaction and the first group create __transaction_state and
                # __consumer_offsets (with three replicas: every node must be up); doing it here keeps
                # that cost (and its flakiness) out of the tests.
                ("transaction coordinator serves", functools.partial(transactions_ready, bootstrap)),
                ("group coordinator serves", functools.partial(groups_ready, bootstrap)),
            ],
            [self._brokers[i] for i in self.running_nodes],
            timeout_s,
        )
