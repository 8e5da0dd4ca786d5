"""Local Apache Kafka clusters for demos, tests and benchmarks (KRaft, loopback)."""

from ferryman_local._cluster import LocalCluster, start_clusters
from ferryman_local._errors import HarnessError
from ferryman_local._maven import KAFKA_VERSION, cache_dir, ensure_kafka_jars

__all__ = ["KAFKA_VERSION", "HarnessError", "LocalCluster", "cache_dir", "ensure_kafka_jars", "start_clusters"]
