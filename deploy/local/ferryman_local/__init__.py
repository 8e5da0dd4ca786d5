"""Local Apache Kafka clusters (single-node KRaft on loopback) for tests, demos and benchmarks.

``LocalCluster.start(name)`` formats and starts one broker from jars that
``ensure_kafka_jars()`` resolves once into a cache outside git;
``start_clusters(names)`` starts several at once. ``python -m ferryman_local up``
does the same from a shell.
"""

from ferryman_local._broker import JVM_OPTIONS
from ferryman_local._cluster import SINGLE_NODE_PROPERTIES, LocalCluster, start_clusters
from ferryman_local._errors import ClusterStartError, HarnessError, JarResolutionError, ToolMissingError
from ferryman_local._maven import KAFKA_VERSION, cache_dir, ensure_kafka_jars
from ferryman_local._ports import reserve_port
from ferryman_local._process import forget, signal_group, spawn

__all__ = [
    "JVM_OPTIONS",
    "KAFKA_VERSION",
    "SINGLE_NODE_PROPERTIES",
    "ClusterStartError",
    "HarnessError",
    "JarResolutionError",
    "LocalCluster",
    "ToolMissingError",
    "cache_dir",
    "ensure_kafka_jars",
    "forget",
    "reserve_port",
    "signal_group",
    "spawn",
    "start_clusters",
]
