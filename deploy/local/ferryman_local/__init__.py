"""Local Apache Kafka clusters (KRaft on loopback) for tests, demos and benchmarks.

``LocalCluster.start(name)`` formats and starts a single-node cluster from jars
that ``ensure_kafka_jars()`` resolves once into a cache outside git;
``start_clusters(names)`` starts several at once. ``python -m ferryman_local up``
does the same from a shell. ``MultiNodeCluster.start(name, nodes=3)`` starts one
cluster of several nodes whose nodes can be killed and restarted one at a time;
``transaction_coordinator`` and ``group_coordinator`` name the node to take away.
``LocalPrometheus.start(dir, jobs)`` runs a Prometheus server scraping Ferryman processes.
``Toxiproxy.start(dir)`` runs toxiproxy (built once with ``go install``) to cut, delay or slow links;
``MultiNodeCluster.start(..., proxied=True)`` gives brokers a listener advertised at the proxies' ports.
``LocalCluster.start(name, sasl=SaslPlain({"user": "password"}))`` takes only SASL/PLAIN logins and
enforces ACLs (KRaft's ``StandardAuthorizer``); ``client_config(user)`` logs a client in.
``LocalZipkin.start(dir)`` runs a Zipkin server (Maven Central exec jar) to receive and show traces.
"""

from ferryman_local._broker import JVM_OPTIONS
from ferryman_local._cluster import SINGLE_NODE_PROPERTIES, LocalCluster, ProxiedListener, start_clusters
from ferryman_local._coordinators import (
    coordinator_partition,
    group_coordinator,
    java_string_hash,
    transaction_coordinator,
)
from ferryman_local._errors import (
    ClusterStartError,
    CoordinatorNotFoundError,
    HarnessError,
    JarResolutionError,
    PrometheusStartError,
    ToolMissingError,
    ZipkinStartError,
)
from ferryman_local._maven import KAFKA_VERSION, cache_dir, ensure_kafka_jars
from ferryman_local._multinode import ClusterNode, MultiNodeCluster, replication_properties
from ferryman_local._ports import reserve_port
from ferryman_local._process import forget, signal_group, spawn
from ferryman_local._prometheus import LocalPrometheus
from ferryman_local._sasl import STANDARD_AUTHORIZER, SaslPlain
from ferryman_local._toxiproxy import TOXIPROXY_VERSION, Proxy, Toxiproxy, ToxiproxyError, ensure_toxiproxy
from ferryman_local._zipkin import LocalZipkin, ensure_zipkin_jar

__all__ = [
    "JVM_OPTIONS",
    "KAFKA_VERSION",
    "SINGLE_NODE_PROPERTIES",
    "STANDARD_AUTHORIZER",
    "TOXIPROXY_VERSION",
    "ClusterNode",
    "ClusterStartError",
    "CoordinatorNotFoundError",
    "HarnessError",
    "JarResolutionError",
    "LocalCluster",
    "LocalPrometheus",
    "LocalZipkin",
    "MultiNodeCluster",
    "PrometheusStartError",
    "ProxiedListener",
    "Proxy",
    "SaslPlain",
    "ToolMissingError",
    "Toxiproxy",
    "ToxiproxyError",
    "ZipkinStartError",
    "cache_dir",
    "coordinator_partition",
    "ensure_kafka_jars",
    "ensure_toxiproxy",
    "ensure_zipkin_jar",
    "forget",
    "group_coordinator",
    "java_string_hash",
    "replication_properties",
    "reserve_port",
    "signal_group",
    "spawn",
    "start_clusters",
    "transaction_coordinator",
]
